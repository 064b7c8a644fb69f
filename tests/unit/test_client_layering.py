"""The SDK stands apart from the server (docs/sdk.md): ``sie.client`` imports only its
own modules, the version and the client settings, never a role, the HTTP apps, the
bus or an engine; importing it loads no server framework or model library."""

import subprocess
import sys
from pathlib import Path

from tests.unit.test_layering import imports_of

SIE = Path(__file__).resolve().parents[2] / "sie"
ALLOWED = {"sie", "sie.settings", "sie.client"}


def test_the_client_imports_no_server_module() -> None:
    bad = []
    for f in [*(SIE / "client").rglob("*.py"), SIE / "cli_client.py"]:
        for mod in imports_of(f):
            parts = mod.split(".")
            if parts[0] != "sie":
                continue
            if ".".join(parts[:2]) not in ALLOWED and mod not in ALLOWED:
                bad.append(f"{f.relative_to(SIE)} imports {mod}")
    assert bad == []


def test_importing_the_client_loads_no_server_framework() -> None:
    code = (
        "import sys, sie.client, sie.cli_client\n"
        "heavy = {'starlette', 'hypercorn', 'torch', 'nats', 'sentence_transformers', 'sie.roles',"
        " 'sie.http', 'sie.transport', 'sie.container'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
