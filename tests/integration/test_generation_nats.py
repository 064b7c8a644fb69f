"""Generation dispatched worker-direct over a real NATS broker to two workers
(architecture §8.2; issue 6 acceptance 3): requests spread over both, each stream
arrives whole and in order, and a cancelled stream frees its worker's slot."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import Stack, run_stack, wait_for

pytestmark = pytest.mark.slow

LLM = "HuggingFaceTB/SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def two_workers(nats_server: Any) -> Iterator[tuple[Stack, list[Stack]]]:
    common = {"bus": "nats", "nats_url": nats_server.url, "heartbeat_interval_s": 0.5}
    with run_stack(roles=("gateway", "config"), **common) as front:
        config_url = f"http://127.0.0.1:{front.running.config_port}"
        with (
            run_stack(
                roles=("worker",),
                worker_id="gen-w1",
                preload=(LLM,),
                config_service_url=config_url,
                **common,
            ) as w1,
            run_stack(
                roles=("worker",),
                worker_id="gen-w2",
                preload=(LLM,),
                config_service_url=config_url,
                **common,
            ) as w2,
        ):
            gw = front.running.gateway
            assert gw is not None
            wait_for(
                lambda: {"gen-w1", "gen-w2"} <= {h.worker_id for h in gw.live_workers()},
                timeout_s=30,
            )
            yield front, [w1, w2]


def test_two_workers_share_generation_and_streams_arrive_whole(
    two_workers: tuple[Stack, list[Stack]],
) -> None:
    front, _ = two_workers

    def one(i: int) -> tuple[str, str]:
        body = {"model": LLM, "messages": ASK, "temperature": 0, "max_tokens": 12, "stream": True}
        text = []
        with httpx.stream(
            "POST", f"{front.base_url}/v1/chat/completions", json=body, timeout=120
        ) as r:
            assert r.status_code == 200
            worker = r.headers["x-sie-worker"]
            lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        for ln in lines[:-1]:
            ch = json.loads(ln[6:])
            if ch["choices"]:
                text.append(ch["choices"][0]["delta"].get("content", ""))
        return worker, "".join(text)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(4)))
    assert {w for w, _ in results} == {"gen-w1", "gen-w2"}  # least loaded: both used
    assert {t for _, t in results} == {"The capital of France is Paris."}  # whole, in order


def test_cancelled_stream_frees_the_remote_worker(two_workers: tuple[Stack, list[Stack]]) -> None:
    front, workers = two_workers
    by_id = {w.running.worker.worker_id: w.running.worker for w in workers if w.running.worker}

    def busy(worker: Any) -> int:
        st = {m["name"]: m for m in [st.to_map() for st in worker.models.statuses()]}[LLM].get(
            "engine_state"
        ) or {}
        return int(st.get("running", 0)) + int(st.get("waiting", 0))

    body = {
        "model": LLM,
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 500,
        "temperature": 0,  # greedy: long and deterministic
        "stream": True,
    }
    with httpx.stream("POST", f"{front.base_url}/v1/chat/completions", json=body, timeout=120) as r:
        worker = by_id[r.headers["x-sie-worker"]]
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        assert busy(worker) == 1
    wait_for(lambda: busy(worker) == 0, timeout_s=15)  # work_cancel crossed the broker
