"""The fault suite (docs/topologies.md "What survives a fault"): the everyday faults of a
cluster, on real processes and a real nats-server, with "nothing lost" assertions.
Default settings wherever the test is about the defaults.

One topology (``tests/e2e/test_nats_topology.py``: config, two gateways, two workers
preloading MiniLM and SmolLM2 as ``sie serve`` processes) serves the worker and gateway
faults; each test leaves it whole again. The broker restart runs an in-process stack
on a file-storage broker; the config role runs as its own process with a store.
Elsewhere: a worker SIGKILLed mid-load (``tests/e2e/test_nats_topology.py``), 20
abandoned large requests (``tests/integration/test_abandon.py``) and a 1 MiB
``max_payload`` broker (``tests/integration/test_large_payloads.py``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import MINILM, MODEL_CACHE, run_stack, wait_for, warm_gguf_cache
from tests.e2e.test_config_restart import ADMIN, ConfigProcess, model
from tests.e2e.test_nats_topology import Topology, fire
from tests.e2e.test_serve import free_port
from tests.natsserver import NatsServer

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.faults]

LLM = "HuggingFaceTB/SmolLM2-135M-Instruct"
CHAT = {"model": LLM, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8}


@pytest.fixture(scope="module")
def topo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    warm_gguf_cache()  # the workers load SmolLM2 from the dequantised copy
    t = Topology(
        tmp_path_factory.mktemp("faults"),
        env={"SIE_MODEL_CACHE_DIR": str(MODEL_CACHE / "sie-models")},
        preload=(MINILM, LLM),
    )
    try:
        t.start()
        yield t
    finally:
        t.stop()


def _codes(replies: list[Any]) -> dict[Any, int]:
    codes = [r.status_code if isinstance(r, httpx.Response) else type(r).__name__ for r in replies]
    return {c: codes.count(c) for c in set(codes)}


def _vectors(replies: list[Any]) -> np.ndarray:
    return np.array([r.json()["items"][0]["dense"]["values"] for r in replies], dtype=np.float32)


@pytest.mark.timeout(120)
def test_a_hung_worker_loses_its_items_to_the_other(topo: Topology, st_model: Any) -> None:
    """SIGSTOP (hung, not dead): its keepalives stop, so its items are redelivered one
    ack wait (5 s) later; after SIGCONT it serves again and its late results are dropped."""
    hung = topo.procs["w1"]
    texts = [f"while a worker hangs {i}" for i in range(200)]
    t0 = time.monotonic()
    try:
        replies = asyncio.run(
            fire(topo.bases, texts, after=lambda: hung.send_signal(signal.SIGSTOP))
        )
        took = time.monotonic() - t0
    finally:
        hung.send_signal(signal.SIGCONT)
    assert _codes(replies) == {200: 200}, _codes(replies)
    assert took < 15, took
    np.testing.assert_allclose(_vectors(replies), st_model.encode(texts), atol=1e-5)
    topo.wait_ready()
    again = asyncio.run(fire(topo.bases, [f"after SIGCONT {i}" for i in range(40)]))
    assert _codes(again) == {200: 40}
    assert {r.headers["x-sie-worker"] for r in again} == {"w1", "w2"}  # type: ignore[union-attr]


@pytest.mark.timeout(120)
def test_a_capped_pool_request_on_a_hung_worker_falls_back_to_the_pool(
    topo: Topology, st_model: Any
) -> None:
    """A capped pool's requests go straight to its one assigned worker (docs/pools.md
    "Capped pools"). That worker hangs: once its heartbeats stop, the gateways publish
    the missing items to the pool's queue, the pool is reassigned to the other worker,
    which admits and answers them. After SIGCONT the hung worker's late direct copies
    change nothing: every answer is the right vector, from the other worker."""
    with httpx.Client(base_url=topo.bases[0], timeout=30) as c:
        r = c.post(
            "/v1/pools",
            json={"name": "cap-fault", "gpus": {"default": 1}, "gpu_caps": {"default": 1}},
        )
        assert r.status_code == 201, r.text
        assigned = [w["name"] for w in r.json()["status"]["assigned_workers"]]
        assert assigned == ["w1"], assigned
        for base in topo.bases:  # the other gateway reads the pool store every second
            wait_for(lambda b=base: httpx.get(f"{b}/v1/pools/cap-fault").status_code == 200, 10)
        header = {"X-SIE-Pool": "cap-fault"}
        before = asyncio.run(fire(topo.bases, ["before the hang"] * 4, headers=header))
        assert {r.headers["x-sie-worker"] for r in before} == {"w1"}  # type: ignore[union-attr]
        hung = topo.procs["w1"]
        texts = [f"capped while a worker hangs {i}" for i in range(24)]
        hung.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            replies = asyncio.run(fire(topo.bases, texts, headers=header))
            took = time.monotonic() - t0
        finally:
            hung.send_signal(signal.SIGCONT)
        assert _codes(replies) == {200: 24}, [getattr(r, "text", r) for r in replies][:3]
        assert {r.headers["x-sie-worker"] for r in replies} == {"w2"}  # type: ignore[union-attr]
        assert took < 20, took
        np.testing.assert_allclose(_vectors(replies), st_model.encode(texts), atol=1e-5)
        assert c.delete("/v1/pools/cap-fault").status_code == 200
    topo.wait_ready()


async def _chats(bases: list[str], n: int, after: Any = None) -> list[Any]:
    async with httpx.AsyncClient(timeout=60) as c:

        async def one(i: int) -> Any:
            try:
                return await c.post(f"{bases[i % len(bases)]}/v1/chat/completions", json=CHAT)
            except Exception as exc:
                return exc

        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        if after is not None:
            await asyncio.sleep(0.05)
            after()
        return await asyncio.gather(*tasks)


@pytest.mark.timeout(120)
def test_a_generation_offered_to_a_hung_worker_runs_on_another(topo: Topology) -> None:
    """Generations dispatched to a worker that hangs before its first token are
    offered to the other worker once its heartbeats stop: all answer 200."""
    hung = topo.procs["w2"]
    hung.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        # both gateways still count w2 live for up to three heartbeats: about half of
        # these are sent to it first
        replies = asyncio.run(_chats(topo.bases, 8))
        took = time.monotonic() - t0
    finally:
        hung.send_signal(signal.SIGCONT)
    assert _codes(replies) == {200: 8}, [getattr(r, "text", r) for r in replies][:3]
    assert all(r.json()["choices"][0]["message"]["content"] for r in replies)
    assert {r.headers["x-sie-worker"] for r in replies} == {"w1"}
    assert took < 20, took
    topo.wait_ready()


@pytest.mark.timeout(120)
def test_a_gateway_killed_mid_flight_leaves_the_other_serving(
    topo: Topology, st_model: Any
) -> None:
    """SIGKILL one gateway while requests run through it; clients retry on the other
    gateway and every request is answered; the killed one's work does not clog the lane."""
    gw1, gw2 = topo.bases
    texts = [f"gateway kill {i} " + "words " * 20 for i in range(60)]
    body = [{"items": [{"text": t}] * 16} for t in texts]

    async def run() -> list[Any]:
        async with httpx.AsyncClient(timeout=60) as c:

            async def one(i: int) -> Any:
                try:
                    return await c.post(f"{gw1}/v1/encode/{MINILM}", json=body[i])
                except httpx.TransportError:  # the gateway died under this request: retry
                    return await c.post(f"{gw2}/v1/encode/{MINILM}", json=body[i])

            tasks = [asyncio.create_task(one(i)) for i in range(len(texts))]
            await asyncio.sleep(0.3)
            topo.procs["gateway1"].send_signal(signal.SIGKILL)
            return await asyncio.gather(*tasks)

    try:
        replies = asyncio.run(run())
        assert _codes(replies) == {200: len(texts)}, (
            _codes(replies),
            [(str(r.url), r.text[:300]) for r in replies if getattr(r, "status_code", 0) != 200][
                :3
            ],
        )
        got = np.array([r.json()["items"][0]["dense"]["values"] for r in replies], np.float32)
        np.testing.assert_allclose(got, st_model.encode(texts), atol=1e-5)
        # what the dead gateway had queued is worked off or dropped: the lane is free
        t0 = time.monotonic()
        r = httpx.post(f"{gw2}/v1/encode/{MINILM}", json={"items": [{"text": "x"}]}, timeout=30)
        assert r.status_code == 200 and time.monotonic() - t0 < 10
    finally:
        topo.procs["gateway1"].wait(10)
        topo.respawn("gateway1")
        topo.wait_ready()


@pytest.mark.timeout(120)
def test_a_worker_killed_mid_stream_ends_the_stream_with_an_error_event(topo: Topology) -> None:
    """After the first token, a dead worker's stream ends with a WORKER_LOST error event
    within a few seconds (never a stream that just stops); the other worker serves on."""
    body = {
        **CHAT,
        "stream": True,
        "max_tokens": 400,
        "messages": [{"role": "user", "content": "Write a very long story about the sea."}],
    }
    victim = ""
    try:
        with httpx.stream(
            "POST", f"{topo.bases[0]}/v1/chat/completions", json=body, timeout=60
        ) as r:
            assert r.status_code == 200
            victim = r.headers["x-sie-worker"]
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get(
                    "content"
                ):
                    break  # the first token arrived
            topo.procs[victim].send_signal(signal.SIGKILL)
            t0 = time.monotonic()
            rest = [ln for ln in lines if ln]
            took = time.monotonic() - t0
        assert any(ln.startswith("event: error") for ln in rest), rest[-3:]
        assert "worker_lost" in "\n".join(rest) and "data: [DONE]" not in rest
        assert took < 10, took
        survivor = "w1" if victim == "w2" else "w2"
        r2 = httpx.post(f"{topo.bases[1]}/v1/chat/completions", json=CHAT, timeout=60)
        assert r2.status_code == 200 and r2.headers["x-sie-worker"] == survivor
    finally:
        if victim:
            topo.procs[victim].wait(10)
            topo.respawn(victim)
            topo.wait_ready()


@pytest.mark.timeout(180)
def test_a_broker_restart_with_file_storage_loses_no_accepted_work(
    tmp_path: Path, st_model: Any
) -> None:
    """SIGKILL the broker under load and start it again on the same store: work it had
    accepted survives (file storage) and is answered; nothing times out. Requests that
    arrive while it is down get a retryable 503."""
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        with run_stack(
            bus="nats",
            nats_url=server.url,
            preload=(MINILM,),
            stream_storage="file",
            request_timeout_s=20,
        ) as stack:
            texts = [f"broker restart {i}" for i in range(100)]

            def restart() -> None:
                server.stop(kill=True)
                threading.Timer(1.0, server.start).start()

            replies = asyncio.run(fire([stack.base_url], texts, after=restart))
            codes = _codes(replies)
            assert set(codes) <= {200, 503}, codes  # never a 504: nothing accepted was lost
            for r in replies:
                if r.status_code == 503:
                    assert r.headers["retry-after"], r.text
            ok = [(t, r) for t, r in zip(texts, replies, strict=True) if r.status_code == 200]
            assert len(ok) >= 50, codes
            got = np.array([r.json()["items"][0]["dense"]["values"] for _, r in ok], np.float32)
            np.testing.assert_allclose(got, st_model.encode([t for t, _ in ok]), atol=1e-5)
            # and the stream is empty again: every accepted item was settled
            wait_for(
                lambda: (
                    stack.portal.call(stack.running.bus.stream_info, "WORK_POOL_default").messages
                    == 0
                ),
                timeout_s=30,
            )
    finally:
        server.stop()


@pytest.mark.timeout(120)
def test_a_config_role_killed_during_writes_keeps_every_acknowledged_one(tmp_path: Path) -> None:
    """SIGKILL the config role while writes stream in; after a restart every write it
    acknowledged is there, the epoch never goes back, and writes continue."""
    proc = ConfigProcess(tmp_path / "store", free_port(), tmp_path / "config.log")
    proc.start()
    auth = {"Authorization": f"Bearer {ADMIN}"}
    acked: list[tuple[str, int]] = []
    stop = threading.Event()

    def writer() -> None:
        with httpx.Client(timeout=5) as c:
            i = 0
            while not stop.is_set():
                name = f"fault/m{i}"
                try:
                    r = c.post(f"{proc.url}/v1/configs/models", content=model(name), headers=auth)
                except httpx.TransportError:
                    return  # the role died under this write: not acknowledged
                if r.status_code == 201:
                    acked.append((name, r.json()["epoch"]))
                i += 1

    try:
        t = threading.Thread(target=writer)
        t.start()
        wait_for(lambda: len(acked) >= 15, timeout_s=60)
        proc.kill()
        stop.set()
        t.join(10)
        proc.start()
        ids = {
            m["model_id"]
            for m in httpx.get(f"{proc.url}/v1/configs/export", headers=auth).json()["models"]
        }
        assert {name for name, _ in acked} <= ids
        epoch = httpx.get(f"{proc.url}/v1/configs/epoch", headers=auth).json()["epoch"]
        assert epoch >= max(e for _, e in acked)
        epochs = [e for _, e in acked]
        assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs)
        r = httpx.post(f"{proc.url}/v1/configs/models", content=model("fault/after"), headers=auth)
        assert r.status_code == 201 and r.json()["epoch"] == epoch + 1
    finally:
        stop.set()
        if proc.proc is not None and proc.proc.poll() is None:
            proc.kill()
