#!/usr/bin/env python3
"""Container HEALTHCHECK: GET /healthz on the port of the role this process runs.

The gateway answers on SIE_PORT, a config-only process on SIE_CONFIG_PORT, a worker
without a gateway on SIE_METRICS_PORT (docs/configuration.md). Exit 0 when it answers
200 `ok`, else 1. Standard library only.
"""

from __future__ import annotations

import os
import sys
import urllib.request


def port() -> str:
    roles = {r.strip() for r in os.environ.get("SIE_ROLES", "gateway,config,worker").split(",")}
    if "gateway" in roles:
        return os.environ.get("SIE_PORT", "8080")
    if "config" in roles:
        return os.environ.get("SIE_CONFIG_PORT", "8081")
    return os.environ.get("SIE_METRICS_PORT", "9090")


def main() -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port()}/healthz", timeout=2) as r:
            return 0 if r.status == 200 else 1
    except OSError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
