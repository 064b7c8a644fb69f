"""Acceptance: kill and restart the config role with a local store (architecture §3, §4.2, §9).

The config role runs as its own `sie serve --roles=config` process; gateway and
worker run in-process with ``SIE_CONFIG_SERVICE_URL`` pointing at it. The memory
bus does not cross processes, so the gateway can only learn of writes through the
epoch poller: exactly the recovery path §11 caveat 2 relies on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import BUNDLES, CONFIGS, ROOT, post_until_ok, run_stack, wait_for
from tests.e2e.test_serve import free_port, sie_bin

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

ADMIN = "restart-admin"


def model(sie_id: str) -> bytes:
    return f"""sie_id: {sie_id}
hf_id: sentence-transformers/all-MiniLM-L6-v2
tasks: {{encode: {{dense: {{dim: 384}}}}}}
profiles:
  default:
    adapter_path: sie.engines.encoders.sentence_transformers:DenseEncoder
    max_batch_tokens: 4096
""".encode()


class ConfigProcess:
    def __init__(self, store: Path, port: int, log: Path) -> None:
        self.store, self.port, self.log = store, port, log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {
            **os.environ,
            "SIE_CONFIG_RESTORE": "true",
            "SIE_ADMIN_TOKEN": ADMIN,
            "SIE_CONFIG_PRODUCER_ID": "sie-config-0",
        }
        out = open(self.log, "a")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [
                sie_bin(),
                "serve",
                "--roles=config",
                "--host",
                "127.0.0.1",
                "--config-port",
                str(self.port),
                "--config-store-dir",
                str(self.store),
                "--models-dir",
                str(CONFIGS),
                "--bundles-dir",
                str(BUNDLES),
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        pytest.fail("config role did not start:\n" + self.log.read_text())

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
def config_proc(tmp_path: Path) -> Iterator[ConfigProcess]:
    p = ConfigProcess(tmp_path / "store", free_port(), tmp_path / "config.log")
    p.start()
    yield p
    if p.proc is not None and p.proc.poll() is None:
        p.kill()


def test_restart_keeps_acknowledged_writes_and_the_poller_converges(
    config_proc: ConfigProcess,
) -> None:
    auth = {"Authorization": f"Bearer {ADMIN}"}
    with run_stack(
        roles=("gateway", "worker"),
        config_service_url=config_proc.url,
        config_poll_interval_s=0.3,
        admin_token=ADMIN,
    ) as stack:
        gw = stack.running.gateway
        assert gw is not None
        seen: list[int] = []

        def gw_epoch() -> int:
            seen.append(gw.epoch.get())
            return seen[-1]

        acked = []
        for name in ("acme/a", "acme/b"):
            r = httpx.post(
                f"{config_proc.url}/v1/configs/models", content=model(name), headers=auth
            )
            assert r.status_code == 201, r.text
            acked.append((name, r.json()["epoch"]))
        last = acked[-1][1]
        wait_for(lambda: gw_epoch() >= last)
        r = httpx.post(
            f"{stack.base_url}/v1/encode/acme/a", json={"items": [{"text": "x"}]}, timeout=60
        )
        assert r.status_code == 200, r.text

        config_proc.kill()
        # the gateway keeps serving while the control plane is down (§11 caveat 1)
        r = httpx.post(
            f"{stack.base_url}/v1/encode/acme/b", json={"items": [{"text": "x"}]}, timeout=60
        )
        assert r.status_code == 200, r.text
        config_proc.start()

        epoch = httpx.get(f"{config_proc.url}/v1/configs/epoch", headers=auth).json()["epoch"]
        assert epoch == last  # never backwards
        export = httpx.get(f"{config_proc.url}/v1/configs/export", headers=auth).json()
        ids = {m["model_id"] for m in export["models"]}
        assert {"acme/a", "acme/b"} <= ids  # every acknowledged write survived
        r = httpx.post(
            f"{config_proc.url}/v1/configs/models", content=model("acme/c"), headers=auth
        )
        assert r.status_code == 201 and r.json()["epoch"] == last + 1
        assert (
            httpx.post(
                f"{config_proc.url}/v1/configs/models", content=model("acme/a"), headers=auth
            ).status_code
            == 200
        )
        wait_for(lambda: gw_epoch() >= last + 1)
        assert "acme/c" in gw.registry.snapshot.configs
        r = post_until_ok(
            f"{stack.base_url}/v1/encode/acme/c",
            json={"items": [{"text": "x"}]},
        )
        status = wait_for(
            lambda: (
                s
                if (s := httpx.get(f"{stack.base_url}/v1/configs/models/acme/c/status").json())[
                    "all_bundles_acked"
                ]
                else None
            )
        )
        assert status["config_epoch"] == last + 1
        assert seen == sorted(seen)  # the gateway epoch never went backwards


def test_lost_store_moves_the_gateway_back_to_authority(tmp_path: Path) -> None:
    """An authority restarted without its store advertises a lower epoch: gateways re-export
    and force-set (§4.2 remote < local, §10)."""
    port = free_port()
    first = ConfigProcess(tmp_path / "s1", port, tmp_path / "c1.log")
    first.start()
    auth = {"Authorization": f"Bearer {ADMIN}"}
    try:
        with run_stack(
            roles=("gateway",),
            config_service_url=first.url,
            config_poll_interval_s=0.3,
            admin_token=ADMIN,
        ) as stack:
            gw = stack.running.gateway
            assert gw is not None
            for name in ("acme/x", "acme/y"):
                assert (
                    httpx.post(
                        f"{first.url}/v1/configs/models", content=model(name), headers=auth
                    ).status_code
                    == 201
                )
            wait_for(lambda: gw.epoch.get() == 2)
            first.kill()
            second = ConfigProcess(tmp_path / "s2-empty", port, tmp_path / "c2.log")
            second.start()
            try:
                wait_for(lambda: gw.epoch.get() == 0)
                assert "acme/x" not in gw.registry.snapshot.configs  # removals follow the export
            finally:
                second.kill()
    finally:
        if first.proc is not None and first.proc.poll() is None:
            first.kill()
