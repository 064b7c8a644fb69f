"""The chart drives a local topology (issue 18 acceptance): render ``deploy/helm/sie``
with ``ci/persistence-on-values.yaml``, take the config, gateway and worker containers'
command and env exactly as rendered (tokens from the rendered Secret), rewrite only the
addresses (listen host, ports, NATS URL, config service URL, the image's /app paths and
the PVC mount) to loopback, free ports and temp dirs, and start them as ``sie serve``
processes on a real nats-server. Then: every container's probes answer on the port the
chart points them at, an encode is served end to end with the chart's inference token,
a config write with the chart's admin token becomes servable, and the config role
restarted from the same env restores it from its store (SIE_CONFIG_RESTORE)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import MINILM, ROOT
from tests.deploy.chart import CI, containers, env_of, render
from tests.e2e.test_serve import sie_bin
from tests.natsserver import NatsServer, free_port

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(300)]

#: The only variables the test changes: where things listen and live. Everything else
#: reaches `sie serve` exactly as the chart renders it.
ADDRESS_KEYS = {
    "SIE_HOST",
    "SIE_PORT",
    "SIE_CONFIG_PORT",
    "SIE_METRICS_PORT",
    "SIE_NATS_URL",
    "SIE_CONFIG_SERVICE_URL",
    "SIE_MODELS_DIR",
    "SIE_BUNDLES_DIR",
    "SIE_CONFIG_STORE_DIR",
}
PORT_KEY = {"gateway": "SIE_PORT", "config": "SIE_CONFIG_PORT", "worker": "SIE_METRICS_PORT"}


def model_yaml(sie_id: str) -> bytes:
    return f"""sie_id: {sie_id}
hf_id: sentence-transformers/all-MiniLM-L6-v2
tasks: {{encode: {{dense: {{dim: 384}}}}}}
profiles:
  default:
    adapter_path: sie.engines.encoders.sentence_transformers:DenseEncoder
    max_batch_tokens: 4096
""".encode()


class ChartTopology:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.objs = render(CI / "persistence-on-values.yaml")
        self.nats = NatsServer(tmp / "nats")
        self.ports = {"gateway": free_port(), "config": free_port(), "worker": free_port()}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.specs: dict[str, tuple[list[str], dict[str, str], dict[str, Any]]] = {}
        for _o, c in containers(self.objs):
            if c["name"] == "nats":
                continue
            env = env_of(self.objs, c)
            role = env["SIE_ROLES"]
            assert role not in self.specs, f"one {role} container expected"
            self.specs[role] = (c["command"] + c.get("args", []), env, c)
        assert set(self.specs) == {"gateway", "config", "worker"}

    def rewrite(self, env: dict[str, str]) -> dict[str, str]:
        new = dict(env)
        cfg = f"http://127.0.0.1:{self.ports['config']}"
        table = {
            "SIE_HOST": "127.0.0.1",
            "SIE_PORT": str(self.ports["gateway"]),
            "SIE_CONFIG_PORT": str(self.ports["config"]),
            "SIE_METRICS_PORT": str(self.ports["worker"]),
            "SIE_NATS_URL": self.nats.url,
            "SIE_CONFIG_SERVICE_URL": cfg,
            "SIE_CONFIG_STORE_DIR": str(self.tmp / "config-store"),
        }
        for k, v in table.items():
            if k in new:
                new[k] = v
        for k in ("SIE_MODELS_DIR", "SIE_BUNDLES_DIR"):
            if k in new:
                assert new[k].startswith("/app/"), new[k]  # the image's layout (Dockerfile)
                new[k] = str(ROOT / new[k].removeprefix("/app/"))
        changed = {k for k in new if new[k] != env.get(k)}
        assert changed <= ADDRESS_KEYS, changed
        return new

    def spawn(self, role: str) -> None:
        argv, env, _ = self.specs[role]
        assert argv[:2] == ["sie", "serve"], argv
        base = {k: v for k, v in os.environ.items() if not k.startswith("SIE_")}
        log = open(self.tmp / f"{role}.log", "a")  # noqa: SIM115 - owned by the child
        self.procs[role] = subprocess.Popen(
            [sie_bin(), *argv[1:]],
            cwd=ROOT,
            env={**base, **self.rewrite(env)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def env(self, role: str) -> dict[str, str]:
        return self.rewrite(self.specs[role][1])

    def url(self, role: str) -> str:
        return f"http://127.0.0.1:{self.ports[role]}"

    def logs(self) -> str:
        return "\n".join(
            f"--- {n}\n{(self.tmp / f'{n}.log').read_text()[-3000:]}" for n in self.procs
        )

    def wait(self, check: Any, timeout_s: float = 180) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for n, p in self.procs.items():
                assert p.poll() is None, f"{n} exited\n" + self.logs()
            try:
                got = check()
                if got:
                    return got
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        pytest.fail("timed out\n" + self.logs())

    def stop(self, role: str, sig: int = signal.SIGTERM) -> None:
        p = self.procs.pop(role)
        p.send_signal(sig)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


@pytest.fixture
def topo(tmp_path: Path) -> Iterator[ChartTopology]:
    t = ChartTopology(tmp_path)
    t.nats.start()
    try:
        yield t
    finally:
        for role in list(t.procs):
            t.stop(role)
        t.nats.stop()


def test_the_rendered_chart_serves_encode_and_a_config_write(topo: ChartTopology) -> None:
    gw_env = topo.env("gateway")
    token, admin = gw_env["SIE_AUTH_TOKEN"], gw_env["SIE_ADMIN_TOKEN"]
    assert gw_env["SIE_AUTH_MODE"] == "token" and token and admin != token
    auth = {"Authorization": f"Bearer {token}"}
    admin_auth = {"Authorization": f"Bearer {admin}"}

    topo.spawn("config")
    topo.wait(lambda: httpx.get(topo.url("config") + "/readyz", timeout=1).status_code == 200)
    topo.spawn("gateway")
    topo.spawn("worker")

    # every probe the chart declares answers on the port it names
    for role, (_, env, c) in topo.specs.items():
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = c[probe]["httpGet"]
            assert ports[get["port"]] == int(env[PORT_KEY[role]])
            url = topo.url(role) + get["path"]
            topo.wait(lambda url=url: httpx.get(url, timeout=2).status_code == 200)

    # the worker lane the chart declares attaches and is ready
    def ready_workers() -> list[dict[str, Any]]:
        r = httpx.get(topo.url("gateway") + "/health", headers=auth, timeout=2)
        return [w for w in r.json()["workers"] if w["ready"]] if r.status_code == 200 else []

    workers = topo.wait(ready_workers)
    worker_env = topo.env("worker")
    assert len(workers) == 1

    # the image's HEALTHCHECK script finds each role's port from the same env
    for role in ("gateway", "config", "worker"):
        rc = subprocess.run(
            [sys.executable, str(ROOT / "docker" / "healthcheck.py")],
            env={**os.environ, **topo.env(role)},
            timeout=10,
        ).returncode
        assert rc == 0, role

    # auth comes from the chart's Secret: no token, no inference
    body = {"items": [{"id": "a", "text": "hello world"}]}
    r = httpx.post(f"{topo.url('gateway')}/v1/encode/{MINILM}", json=body, timeout=60)
    assert r.status_code == 401

    def encode(model: str) -> httpx.Response | None:
        r = httpx.post(
            f"{topo.url('gateway')}/v1/encode/{model}", json=body, headers=auth, timeout=60
        )
        return r if r.status_code == 200 else None

    r = topo.wait(lambda: encode(MINILM), timeout_s=60)
    assert r.json()["items"][0]["dense"]["dims"] == 384
    assert worker_env["SIE_PRELOAD_MODELS"] == MINILM

    # a config write with the admin token becomes servable through gateway and worker
    cfg = topo.url("config")
    r = httpx.post(f"{cfg}/v1/configs/models", content=model_yaml("chart/minilm"), headers=auth)
    assert r.status_code in (401, 403)  # the inference token cannot write
    r = httpx.post(
        f"{cfg}/v1/configs/models", content=model_yaml("chart/minilm"), headers=admin_auth
    )
    assert r.status_code == 201, r.text
    epoch = r.json()["epoch"]
    r = topo.wait(lambda: encode("chart/minilm"), timeout_s=90)
    assert r.json()["items"][0]["dense"]["dims"] == 384

    # the PVC wiring: the config role restarted from the same env restores the write
    assert any((topo.tmp / "config-store").iterdir())
    topo.stop("config", signal.SIGKILL)
    topo.spawn("config")
    topo.wait(lambda: httpx.get(cfg + "/readyz", timeout=1).status_code == 200)
    export = httpx.get(f"{cfg}/v1/configs/export", headers=admin_auth, timeout=5).json()
    assert "chart/minilm" in {m["model_id"] for m in export["models"]}
    assert httpx.get(f"{cfg}/v1/configs/epoch", headers=admin_auth).json()["epoch"] == epoch
