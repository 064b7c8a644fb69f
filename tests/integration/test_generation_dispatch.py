"""Generation dispatch details against a scripted worker on the in-memory bus
(architecture §2, §8.2, §15.1): PROVISIONING in the OpenAI envelope, the caller's
traceparent on the work item, and a stream with a missing chunk failing with an
error event instead of emitting text out of order."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from sie.core.subjects import direct_filter, health_subject
from sie.core.wire import GenerationChunk, Heartbeat, WorkItem
from tests.conftest import Stack, run_stack, wait_for

LLM = "HuggingFaceTB/SmolLM2-135M-Instruct"
ASK = {"model": LLM, "messages": [{"role": "user", "content": "hi"}], "stream": True}
TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def gateway_only() -> Iterator[Stack]:
    with run_stack(roles=("gateway",), heartbeat_interval_s=0.2) as s:
        yield s


def test_no_worker_is_provisioning_in_the_openai_envelope(gateway_only: Stack) -> None:
    r = httpx.post(f"{gateway_only.base_url}/v1/chat/completions", json=ASK, timeout=10)
    assert r.status_code == 503 and r.headers["retry-after"] == "60"
    assert r.headers["x-sie-error-code"] == "PROVISIONING"
    assert r.json()["error"]["code"] == "provisioning"


def scripted_worker(stack: Stack, seqs: list[int], seen: list[WorkItem]) -> Any:
    """A fake worker that heartbeats, records what it is sent and answers with
    chunks numbered ``seqs``."""
    bus = stack.running.bus
    hb = Heartbeat(
        worker_id="fake-w",
        pool="default",
        machine_profile="default",
        bundle="default",
        ready=True,
        interval_s=0.2,
    )

    async def run(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        sub = await bus.subscribe(direct_filter("default", "default", "default", "fake-w"))

        async def beat() -> None:
            while True:
                await bus.publish(health_subject("fake-w"), hb.to_bytes())
                await anyio.sleep(0.1)

        async with anyio.create_task_group() as tg:
            tg.start_soon(beat)
            task_status.started()
            async for msg in sub:
                item = WorkItem.from_bytes(msg.data)
                seen.append(item)
                for seq in seqs:
                    last = seq == seqs[-1]
                    chunk = GenerationChunk(
                        request_id=item.request_id,
                        seq=seq,
                        text="" if seq == 0 else f"t{seq} ",
                        done=last,
                        finish_reason="stop" if last else None,
                        prompt_tokens=3 if last else None,
                        completion_tokens=len(seqs) - 1 if last else None,
                    )
                    await bus.publish(item.reply_subject, chunk.to_bytes())

    return run


def lines_of(stack: Stack, headers: dict[str, str] | None = None) -> list[str]:
    with httpx.stream(
        "POST", f"{stack.base_url}/v1/chat/completions", json=ASK, headers=headers, timeout=10
    ) as r:
        assert r.status_code == 200
        return [ln for ln in r.iter_lines() if ln]


def test_whole_stream_and_trace_context_reach_the_worker(gateway_only: Stack) -> None:
    seen: list[WorkItem] = []
    future = gateway_only.portal.start_task_soon(scripted_worker(gateway_only, [0, 1, 2, 3], seen))
    try:
        gw = gateway_only.running.gateway
        assert gw is not None
        wait_for(lambda: any(h.worker_id == "fake-w" for h in gw.live_workers()), 10)
        lines = lines_of(gateway_only, {"traceparent": TRACE})
        data = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: {")]
        text = "".join(d["choices"][0]["delta"].get("content", "") for d in data if d["choices"])
        assert text == "t1 t2 t3 " and lines[-1] == "data: [DONE]"
        assert seen[0].operation == "generate" and seen[0].item["route"] == "chat"
        # §15.1: the caller's trace continues on the work item
        assert seen[0].traceparent is not None and TRACE.split("-")[1] in seen[0].traceparent
    finally:
        future.cancel()


def test_a_lost_chunk_fails_the_stream(gateway_only: Stack) -> None:
    future = gateway_only.portal.start_task_soon(scripted_worker(gateway_only, [0, 1, 3], []))
    try:
        gw = gateway_only.running.gateway
        assert gw is not None
        wait_for(lambda: any(h.worker_id == "fake-w" for h in gw.live_workers()), 10)
        lines = lines_of(gateway_only)
        assert any(ln.startswith("event: error") for ln in lines), lines
        assert "lost chunks" in "\n".join(lines) and "data: [DONE]" not in lines
        assert not any("t3" in ln for ln in lines)  # nothing after the gap is emitted
    finally:
        future.cancel()
