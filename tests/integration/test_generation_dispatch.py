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

from sie.core.subjects import direct_filter, direct_stream_name, health_subject
from sie.core.wire import GenerationChunk, Heartbeat, WorkItem
from sie.transport.base import ConsumerConfig, direct_stream_config
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


def scripted_worker(
    stack: Stack,
    seqs: list[int],
    seen: list[WorkItem],
    worker_id: str = "fake-w",
    hang_after: int | None = None,
    keep_beating: bool = False,
) -> Any:
    """A fake worker that heartbeats, records what it is sent and answers with
    chunks numbered ``seqs``. With ``hang_after``, it hangs once it has sent that many
    chunks of an item (0: it never accepts): no more chunks, no more heartbeats, as a
    SIGSTOPped or dead worker."""
    bus = stack.running.bus
    hung = anyio.Event()
    hb = Heartbeat(
        worker_id=worker_id,
        pool="default",
        machine_profile="default",
        bundle="default",
        ready=True,
        interval_s=0.2,
    )

    async def run(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        # a worker's durable direct dispatch: its own stream and pull consumer
        await bus.add_stream(direct_stream_config("default", "default", "default", worker_id))
        consumer = await bus.pull_consumer(
            direct_stream_name(worker_id),
            ConsumerConfig(
                durable="direct",
                filter_subject=direct_filter("default", "default", "default", worker_id),
            ),
        )

        async def items() -> Any:
            while True:
                for msg in await consumer.fetch(8, timeout_s=1.0):
                    await msg.ack()
                    yield msg

        async def beat() -> None:
            while not hung.is_set():
                await bus.publish(health_subject(worker_id), hb.to_bytes())
                await anyio.sleep(0.1)

        async with anyio.create_task_group() as tg:
            tg.start_soon(beat)
            task_status.started()
            async for msg in items():
                item = WorkItem.from_bytes(msg.data)
                seen.append(item)
                for n, seq in enumerate(seqs):
                    if n == hang_after:
                        if not keep_beating:  # else: live, but stuck
                            hung.set()
                        await anyio.sleep_forever()
                    last = seq == seqs[-1]
                    chunk = GenerationChunk(
                        request_id=item.request_id,
                        seq=seq,
                        text="" if seq == 0 else f"t{seq} ",
                        done=last,
                        finish_reason="stop" if last else None,
                        prompt_tokens=3 if last else None,
                        completion_tokens=len(seqs) - 1 if last else None,
                        worker_id=worker_id,
                    )
                    await bus.publish(item.reply_subject, chunk.to_bytes())

    return run


def lines_of(
    stack: Stack, headers: dict[str, str] | None = None, timeout_s: float = 10
) -> list[str]:
    with httpx.stream(
        "POST",
        f"{stack.base_url}/v1/chat/completions",
        json=ASK,
        headers=headers,
        timeout=timeout_s,
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


def test_a_worker_lost_before_accepting_is_replaced(gateway_only: Stack) -> None:
    # "a-hung" sorts first, so it is offered the generation first; it never accepts and
    # its heartbeats stop (a SIGSTOPped worker): the gateway offers it to "fake-w"
    hung_seen: list[WorkItem] = []
    seen: list[WorkItem] = []
    portal = gateway_only.portal
    hung = portal.start_task_soon(
        scripted_worker(gateway_only, [0, 1, 2], hung_seen, worker_id="a-hung", hang_after=0)
    )
    good = portal.start_task_soon(scripted_worker(gateway_only, [0, 1, 2], seen))
    try:
        gw = gateway_only.running.gateway
        assert gw is not None
        wait_for(lambda: {"a-hung", "fake-w"} <= {h.worker_id for h in gw.live_workers()}, 10)
        lines = lines_of(gateway_only)
        assert lines[-1] == "data: [DONE]" and not any("event: error" in ln for ln in lines)
        assert len(hung_seen) == 1 and len(seen) == 1  # offered to both, served by one
        assert seen[0].request_id == hung_seen[0].request_id
    finally:
        hung.cancel()
        good.cancel()


def test_a_worker_lost_mid_stream_ends_it_with_an_error_event(gateway_only: Stack) -> None:
    future = gateway_only.portal.start_task_soon(
        scripted_worker(gateway_only, [0, 1, 2, 3], [], hang_after=2)
    )
    try:
        gw = gateway_only.running.gateway
        assert gw is not None
        wait_for(lambda: any(h.worker_id == "fake-w" for h in gw.live_workers()), 10)
        lines = lines_of(gateway_only)
        assert any("t1" in ln for ln in lines)  # the first token reached the client
        assert any(ln.startswith("event: error") for ln in lines), lines
        assert "worker_lost" in "\n".join(lines) and "data: [DONE]" not in lines
    finally:
        future.cancel()


@pytest.mark.timeout(60)
def test_a_live_worker_that_does_not_accept_in_time_is_passed_over(gateway_only: Stack) -> None:
    """A worker that keeps heartbeating but never takes the generation: after the
    accept timeout the gateway offers it to another worker (issue 13 item 6)."""
    stuck_seen: list[WorkItem] = []
    seen: list[WorkItem] = []
    portal = gateway_only.portal
    stuck = portal.start_task_soon(
        scripted_worker(
            gateway_only, [0, 1], stuck_seen, worker_id="a-stuck", hang_after=0, keep_beating=True
        )
    )
    good = portal.start_task_soon(scripted_worker(gateway_only, [0, 1, 2], seen))
    try:
        gw = gateway_only.running.gateway
        assert gw is not None
        wait_for(lambda: {"a-stuck", "fake-w"} <= {h.worker_id for h in gw.live_workers()}, 10)
        lines = lines_of(gateway_only, timeout_s=30)
        assert lines[-1] == "data: [DONE]" and len(stuck_seen) == 1 and len(seen) == 1
    finally:
        stuck.cancel()
        good.cancel()
