"""Split roles over NATS (issue 4 acceptance 2; architecture §1, §2, §8, §10).

config, two gateways and two workers run as five `sie serve` processes on one real
nats-server; gateways and workers have no seed and bootstrap from the config role.
200 concurrent encodes, spread over both gateways, equal the in-process model and are
served by both workers; then a worker is
SIGKILLed mid-flight and every request still ends in a 200 (default settings)
(its unacked items are redelivered to the other worker), none lost, none hanging.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import BUNDLES, CONFIGS, MINILM, ROOT
from tests.e2e.test_serve import sie_bin
from tests.natsserver import NatsServer, free_port

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

REQUEST_TIMEOUT_S = 30  # the gateway's default (SIE_GATEWAY_REQUEST_TIMEOUT)


class Topology:
    """config, two gateways and two workers (``w1``, ``w2``) as ``sie serve`` processes
    on one nats-server. ``env``: extra settings for every process (default settings
    otherwise); ``preload``: the workers' ``--preload`` models."""

    def __init__(
        self,
        tmp: Path,
        *,
        env: dict[str, str] | None = None,
        preload: tuple[str, ...] = (MINILM,),
    ) -> None:
        self.tmp = tmp
        self.nats = NatsServer(tmp / "nats")
        self.gw_ports, self.cfg_port = (free_port(), free_port()), free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = env or {}
        self.preload = preload
        self._spawned: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {}
        self.metrics_ports: dict[str, int] = {}

    def respawn(self, name: str) -> None:
        """Start ``name`` again as it was first started (after a kill)."""
        args, env = self._spawned[name]
        self.spawn(name, *args, **env)

    def spawn(self, name: str, *args: str, **env: str) -> None:
        self._spawned[name] = (args, env)
        log = open(self.tmp / f"{name}.log", "a")  # noqa: SIM115 - owned by the child
        self.procs[name] = subprocess.Popen(
            [
                sie_bin(),
                "serve",
                "--bus=nats",
                "--nats-url",
                self.nats.url,
                "--host",
                "127.0.0.1",
                *args,
            ],
            cwd=ROOT,
            env={**os.environ, **self.env, **env},  # default settings unless given
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def logs(self) -> str:
        return "\n".join(
            f"--- {n}\n{(self.tmp / f'{n}.log').read_text()[-3000:]}" for n in self.procs
        )

    def start(self) -> None:
        self.nats.start()
        # only the config role reads the model and bundle files; gateway and workers
        # start with no seed and bootstrap from it (architecture §4)
        self.spawn(
            "config",
            "--roles=config",
            "--config-port",
            str(self.cfg_port),
            "--models-dir",
            str(CONFIGS),
            "--bundles-dir",
            str(BUNDLES),
        )
        config_url = f"http://127.0.0.1:{self.cfg_port}"
        for i, port in enumerate(self.gw_ports):  # two stateless gateways
            self.spawn(
                f"gateway{i + 1}",
                "--roles=gateway",
                "--port",
                str(port),
                SIE_CONFIG_SERVICE_URL=config_url,
            )
        for w in ("w1", "w2"):
            self.metrics_ports[w] = free_port()  # a worker's own /metrics and probes
            self.spawn(
                w,
                "--roles=worker",
                "--preload",
                *self.preload,
                SIE_CONFIG_SERVICE_URL=config_url,
                SIE_WORKER_ID=w,
                SIE_METRICS_PORT=str(self.metrics_ports[w]),
            )
        self.wait_ready()

    def wait_ready(self, workers: int = 2) -> None:
        """Until every gateway sees ``workers`` ready workers."""
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                assert p.poll() is None, f"{name} exited\n" + self.logs()
            try:
                if all(
                    sum(
                        1
                        for w in httpx.get(f"{b}/health", timeout=1).json()["workers"]
                        if w["ready"]
                    )
                    == workers
                    for b in self.bases
                ):
                    return
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            time.sleep(0.3)
        pytest.fail("topology did not become ready\n" + self.logs())

    @property
    def bases(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.gw_ports]

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        self.nats.stop()


@pytest.fixture
def topology(tmp_path: Path) -> Iterator[Topology]:
    t = Topology(tmp_path)
    try:
        t.start()
        yield t
    finally:
        t.stop()


async def fire(
    bases: list[str],
    texts: list[str],
    *,
    after: Any = None,
    headers: dict[str, str] | None = None,
) -> list[httpx.Response | Exception]:
    """POST each text concurrently, alternating between the gateways."""
    limits = httpx.Limits(max_connections=len(texts), max_keepalive_connections=len(texts))
    async with httpx.AsyncClient(limits=limits, timeout=REQUEST_TIMEOUT_S + 15) as c:

        async def one(i: int, t: str) -> httpx.Response | Exception:
            try:
                return await c.post(
                    f"{bases[i % len(bases)]}/v1/encode/{MINILM}",
                    json={"items": [{"text": t}]},
                    headers=headers,
                )
            except Exception as exc:  # a hang or a dropped connection is a failure, counted
                return exc

        tasks = [asyncio.create_task(one(i, t)) for i, t in enumerate(texts)]
        if after is not None:
            await asyncio.sleep(0.3)
            after()
        return await asyncio.gather(*tasks)


def test_two_workers_share_a_lane_and_survive_a_kill(topology: Topology, st_model: Any) -> None:
    texts = [f"request number {i} about topic {i % 7}" for i in range(200)]
    replies = asyncio.run(fire(topology.bases, texts))
    assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in replies), [
        getattr(r, "status_code", r) for r in replies if getattr(r, "status_code", 0) != 200
    ][:5]
    # both gateways served, and both workers took work from the one lane
    served_by = {(str(r.url).split("/v1")[0], r.headers["X-SIE-Worker"]) for r in replies}  # type: ignore[union-attr]
    assert {b for b, _ in served_by} == set(topology.bases)
    assert {w for _, w in served_by} == {"w1", "w2"}
    got = np.array([r.json()["items"][0]["dense"]["values"] for r in replies], dtype=np.float32)  # type: ignore[union-attr]
    np.testing.assert_allclose(got, st_model.encode(texts), atol=1e-5)
    # a worker-only process serves its own /metrics: its batches and items are visible
    for w in ("w1", "w2"):
        base = f"http://127.0.0.1:{topology.metrics_ports[w]}"
        assert httpx.get(f"{base}/readyz").text == "ok"
        text = httpx.get(f"{base}/metrics").text
        assert f'sie_batch_size_count{{model="{MINILM}"}}' in text, text[:2000]
        items = re.search(
            rf'sie_worker_items_total{{model="{re.escape(MINILM)}",outcome="success"}} (\S+)', text
        )
        assert items is not None and float(items.group(1)) >= 1

    killed = topology.procs["w1"]
    t0 = time.monotonic()
    replies = asyncio.run(
        fire(
            topology.bases,
            [f"during the kill {i}" for i in range(200)],
            after=lambda: killed.send_signal(signal.SIGKILL),
        )
    )
    took = time.monotonic() - t0
    codes = [r.status_code if isinstance(r, httpx.Response) else type(r).__name__ for r in replies]
    counts = {c: codes.count(c) for c in set(codes)}
    # nothing lost: the dead worker's items move to w2 within an ack wait (5 s by default)
    assert counts == {200: 200}, counts
    assert took < 15, took
    got = np.array([r.json()["items"][0]["dense"]["values"] for r in replies], dtype=np.float32)  # type: ignore[union-attr]
    np.testing.assert_allclose(
        got, st_model.encode([f"during the kill {i}" for i in range(200)]), atol=1e-5
    )
    assert killed.poll() is not None
    print(f"kill phase: {counts} in {took:.1f}s")
