"""Bus contract (sie.transport.base docstring; architecture §8, §8.2).

Every implementation runs this suite: the in-memory bus, and the NATS adapter against a
real ``nats-server`` (``tests/natsserver.py``) on a free loopback port.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio
import pytest

from sie.transport.base import (
    Bus,
    BusError,
    ConsumerConfig,
    ConsumerNotFoundError,
    Msg,
    NoStreamError,
    PayloadTooLargeError,
    StreamConfig,
    StreamFullError,
    dead_letter_stream_config,
    work_stream_config,
)
from sie.transport.memory import MemoryBus
from tests.natsserver import NatsServer

pytestmark = pytest.mark.anyio

BUSES = ["memory", "nats"]


@pytest.fixture(params=BUSES)
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    if request.param == "memory":
        async with MemoryBus() as b:
            yield b
        return
    from sie.transport.nats import NatsBus

    server: NatsServer = request.getfixturevalue("nats_server")
    async with NatsBus(server.url, initial_connect_attempts=3) as b:
        try:
            yield b
        finally:  # every test starts from an empty broker
            for info in await b._js.streams_info():
                await b.delete_stream(info.config.name)


def cfg(**kw: object) -> ConsumerConfig:
    base: dict[str, object] = {
        "durable": "c1",
        "filter_subject": "sie.work.default.l4.default.*",
        "ack_wait_s": 30.0,
    }
    base.update(kw)
    return ConsumerConfig(**base)  # type: ignore[arg-type]


async def test_core_pubsub_wildcards(bus: Bus) -> None:
    star = await bus.subscribe("sie.health.*")
    tail = await bus.subscribe("_INBOX.gw.>")
    await bus.publish("sie.health.w1", b"hb")
    await bus.publish("sie.health.w1.extra", b"no")  # * is exactly one token
    await bus.publish("_INBOX.gw.req1", b"r1")
    await bus.publish("_INBOX.gw.req1.more", b"r2")
    await bus.publish("_INBOX.other.req", b"no")
    assert (await star.next_msg(1)).data == b"hb"
    assert [(await tail.next_msg(1)).data for _ in range(2)] == [b"r1", b"r2"]
    with pytest.raises(TimeoutError):
        await star.next_msg(0.05)
    with pytest.raises(TimeoutError):
        await tail.next_msg(0.05)


async def test_core_no_replay_and_unsubscribe(bus: Bus) -> None:
    await bus.publish("a.b", b"before")
    sub = await bus.subscribe("a.b")
    await bus.publish("a.b", b"after")
    assert (await sub.next_msg(1)).data == b"after"
    await sub.unsubscribe()
    await bus.publish("a.b", b"gone")
    received = []
    with anyio.move_on_after(0.05):
        async for m in sub:
            received.append(m)
    assert received == []


async def test_async_iteration(bus: Bus) -> None:
    sub = await bus.subscribe("x.*")
    for i in range(3):
        await bus.publish(f"x.{i}", str(i).encode())
    got = []
    async for m in sub:
        got.append(m.data)
        if len(got) == 3:
            break
    assert got == [b"0", b"1", b"2"]


async def test_publish_without_stream_fails(bus: Bus) -> None:
    with pytest.raises(NoStreamError):
        await bus.js_publish("sie.work.nowhere.a.b.c", b"x")
    with pytest.raises(NoStreamError):
        await bus.stream_info("WORK_POOL_nowhere")


async def test_max_payload_is_the_brokers_and_larger_messages_are_refused(bus: Bus) -> None:
    # a default nats-server and the memory bus both carry 1 MiB per message
    assert bus.max_payload == 1024 * 1024
    await bus.add_stream(work_stream_config("default"))
    sub = await bus.subscribe("big.>")
    fits = b"x" * bus.max_payload
    await bus.publish("big.one", fits)
    assert (await sub.next_msg(5)).data == fits
    over = fits + b"y"
    with pytest.raises(PayloadTooLargeError):
        await bus.publish("big.two", over)
    with pytest.raises(PayloadTooLargeError):
        await bus.js_publish("sie.work.default.l4.default.m", over)
    await bus.js_publish("sie.work.default.l4.default.m", fits)
    assert (await bus.stream_info("WORK_POOL_default")).messages == 1
    with pytest.raises(TimeoutError):  # nothing of the refused message was sent
        await sub.next_msg(0.2)


async def test_work_queue_ack_removes(bus: Bus) -> None:
    await bus.add_stream(work_stream_config("default"))
    ack = await bus.js_publish("sie.work.default.l4.default.m", b"job")
    assert ack.stream == "WORK_POOL_default" and ack.seq >= 1
    c = await bus.pull_consumer("WORK_POOL_default", cfg())
    msgs = await c.fetch(10, 1.0)
    assert [m.data for m in msgs] == [b"job"] and msgs[0].num_delivered == 1
    info = await c.info()
    assert (info.num_pending, info.num_ack_pending) == (0, 1)
    await msgs[0].ack()
    assert (await bus.stream_info("WORK_POOL_default")).messages == 0
    assert await c.fetch(10, 0.05) == []


async def test_filter_selects_lane(bus: Bus) -> None:
    await bus.add_stream(work_stream_config("default"))
    await bus.js_publish("sie.work.default.l4.default.m", b"mine")
    await bus.js_publish("sie.work.default.a100.default.m", b"other-lane")
    c = await bus.pull_consumer("WORK_POOL_default", cfg())
    msgs = await c.fetch(10, 0.2)
    assert [m.data for m in msgs] == [b"mine"]
    await msgs[0].ack()


async def test_consumer_info_and_subject_count_without_binding(bus: Bus) -> None:
    """What the gateway's lane queue-depth reader uses (docs/observability.md)."""
    stream = "WORK_POOL_default"
    with pytest.raises(NoStreamError):
        await bus.consumer_info(stream, "c1")
    with pytest.raises(NoStreamError):
        await bus.subject_count(stream, "sie.work.default.l4.default.*")
    await bus.add_stream(work_stream_config("default"))
    for subject in ("sie.work.default.l4.default.m", "sie.work.default.l4.default.m"):
        await bus.js_publish(subject, b"job")
    await bus.js_publish("sie.work.default.a100.default.m", b"other lane")
    with pytest.raises(ConsumerNotFoundError):
        await bus.consumer_info(stream, "c1")
    assert await bus.subject_count(stream, "sie.work.default.l4.default.*") == 2
    assert await bus.subject_count(stream, "sie.work.default.*.*.*") == 3
    assert await bus.subject_count(stream, "sie.work.default.h100.default.*") == 0
    c = await bus.pull_consumer(stream, cfg())
    info = await bus.consumer_info(stream, "c1")
    assert (info.num_pending, info.num_ack_pending) == (2, 0)
    assert info.filter_subject == "sie.work.default.l4.default.*"
    msgs = await c.fetch(1, 1.0)
    info = await bus.consumer_info(stream, "c1")
    assert (info.num_pending, info.num_ack_pending) == (1, 1)
    await msgs[0].ack()
    assert await bus.subject_count(stream, "sie.work.default.l4.default.*") == 1


async def test_fetch_waits_for_publish(bus: Bus) -> None:
    await bus.add_stream(work_stream_config("default"))
    c = await bus.pull_consumer("WORK_POOL_default", cfg())
    got: list[bytes] = []

    async def consume() -> None:
        msgs = await c.fetch(5, 2.0)
        got.extend(m.data for m in msgs)
        for m in msgs:
            await m.ack()

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await anyio.sleep(0.05)
        await bus.js_publish("sie.work.default.l4.default.m", b"late")
    assert got == [b"late"]


async def test_fetch_respects_batch_and_order(bus: Bus) -> None:
    await bus.add_stream(work_stream_config("default"))
    for i in range(5):
        await bus.js_publish("sie.work.default.l4.default.m", bytes([i]))
    c = await bus.pull_consumer("WORK_POOL_default", cfg())
    first = await c.fetch(3, 1.0)
    second = await c.fetch(3, 1.0)
    assert [m.data for m in first] == [b"\x00", b"\x01", b"\x02"]
    assert [m.data for m in second] == [b"\x03", b"\x04"]
    for m in first + second:
        await m.ack()


async def test_nak_redelivers_after_delay(bus: Bus) -> None:
    await bus.add_stream(work_stream_config("default"))
    await bus.js_publish("sie.work.default.l4.default.m", b"retry")
    c = await bus.pull_consumer("WORK_POOL_default", cfg())
    (m,) = await c.fetch(1, 1.0)
    await m.nak(0.3)
    assert await c.fetch(1, 0.1) == []  # still delayed
    (again,) = await c.fetch(1, 2.0)
    assert again.data == b"retry" and again.num_delivered == 2
    await again.ack()


async def test_nak_without_delay_redelivers_now(bus: Bus) -> None:
    await bus.add_stream(work_stream_config("default"))
    await bus.js_publish("sie.work.default.l4.default.m", b"now")
    c = await bus.pull_consumer("WORK_POOL_default", cfg())
    (m,) = await c.fetch(1, 1.0)
    await m.nak()
    (again,) = await c.fetch(1, 1.0)
    assert again.num_delivered == 2
    await again.ack()


async def test_ack_wait_redelivery_and_in_progress(bus: Bus) -> None:
    await bus.add_stream(work_stream_config("default"))
    await bus.js_publish("sie.work.default.l4.default.m", b"slow")
    c = await bus.pull_consumer("WORK_POOL_default", cfg(ack_wait_s=0.4))
    (m,) = await c.fetch(1, 1.0)
    await anyio.sleep(0.25)
    await m.in_progress()  # resets the ack timer
    assert await c.fetch(1, 0.3) == []
    (again,) = await c.fetch(1, 2.0)  # never settled: redelivered
    assert again.num_delivered == 2
    await again.ack()


async def test_term_is_never_redelivered(bus: Bus) -> None:
    await bus.add_stream(work_stream_config("default"))
    await bus.js_publish("sie.work.default.l4.default.m", b"poison")
    c = await bus.pull_consumer("WORK_POOL_default", cfg(ack_wait_s=0.1))
    (m,) = await c.fetch(1, 1.0)
    await m.term()
    assert await c.fetch(1, 0.4) == []


async def test_max_deliver_stops_redelivery_with_advisory(bus: Bus) -> None:
    await bus.add_stream(work_stream_config("default"))
    advisories = await bus.subscribe("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>")
    await bus.js_publish("sie.work.default.l4.default.m", b"doomed")
    c = await bus.pull_consumer("WORK_POOL_default", cfg(max_deliver=2))
    for expected in (1, 2):
        (m,) = await c.fetch(1, 1.0)
        assert m.num_delivered == expected
        await m.nak()
    assert await c.fetch(1, 0.3) == []
    adv = await advisories.next_msg(2.0)
    assert adv.subject.endswith(".WORK_POOL_default.c1")
    body = json.loads(adv.data)
    assert (
        body["stream"] == "WORK_POOL_default"
        and body["consumer"] == "c1"
        and body["deliveries"] == 2
    )


async def test_max_msgs_discard_new(bus: Bus) -> None:
    await bus.add_stream(
        StreamConfig(name="WORK_POOL_tiny", subjects=["sie.work.tiny.*.*.*"], max_msgs=2)
    )
    await bus.js_publish("sie.work.tiny.a.b.c", b"1")
    await bus.js_publish("sie.work.tiny.a.b.c", b"2")
    with pytest.raises(StreamFullError):
        await bus.js_publish("sie.work.tiny.a.b.c", b"3")
    # the old messages are kept (discard=new, not old)
    c = await bus.pull_consumer("WORK_POOL_tiny", cfg(filter_subject="sie.work.tiny.a.b.*"))
    msgs = await c.fetch(5, 1.0)
    assert [m.data for m in msgs] == [b"1", b"2"]
    await msgs[0].ack()
    await bus.js_publish("sie.work.tiny.a.b.c", b"3")  # room again after an ack


async def test_msg_id_dedupe(bus: Bus) -> None:
    await bus.add_stream(work_stream_config("default"))
    a = await bus.js_publish("sie.work.default.l4.default.m", b"x", msg_id="req.0")
    b = await bus.js_publish("sie.work.default.l4.default.m", b"x", msg_id="req.0")
    assert b.duplicate and b.seq == a.seq
    assert (await bus.stream_info("WORK_POOL_default")).messages == 1


async def test_max_age_expires(bus: Bus) -> None:
    await bus.add_stream(
        StreamConfig(name="WORK_POOL_old", subjects=["sie.work.old.*.*.*"], max_age_s=0.2)
    )
    await bus.js_publish("sie.work.old.a.b.c", b"stale")
    await anyio.sleep(0.4)
    assert (await bus.stream_info("WORK_POOL_old")).messages == 0


async def test_durable_shared_by_two_fetchers(bus: Bus) -> None:
    await bus.add_stream(work_stream_config("default"))
    for i in range(10):
        await bus.js_publish("sie.work.default.l4.default.m", bytes([i]))
    c1 = await bus.pull_consumer("WORK_POOL_default", cfg())
    c2 = await bus.pull_consumer("WORK_POOL_default", cfg())  # same durable: bind
    a = await c1.fetch(5, 1.0)
    b = await c2.fetch(5, 1.0)
    assert sorted(m.data for m in a + b) == [bytes([i]) for i in range(10)]
    for m in a + b:
        await m.ack()


async def test_overlapping_work_queue_consumers_rejected(bus: Bus) -> None:
    await bus.add_stream(work_stream_config("default"))
    await bus.pull_consumer("WORK_POOL_default", cfg())
    with pytest.raises(BusError):
        await bus.pull_consumer(
            "WORK_POOL_default", cfg(durable="c2", filter_subject="sie.work.default.*.default.*")
        )
    # a disjoint lane is fine
    await bus.pull_consumer(
        "WORK_POOL_default", cfg(durable="c3", filter_subject="sie.work.default.a100.default.*")
    )


async def test_add_stream_reconciles(bus: Bus) -> None:
    await bus.add_stream(
        StreamConfig(name="WORK_POOL_r", subjects=["sie.work.r.*.*.*"], max_msgs=1)
    )
    info = await bus.add_stream(
        StreamConfig(name="WORK_POOL_r", subjects=["sie.work.r.*.*.*"], max_msgs=5)
    )
    assert info.config.max_msgs == 5
    for _ in range(3):
        await bus.js_publish("sie.work.r.a.b.c", b"x")


async def test_is_connected(bus: Bus) -> None:
    assert bus.is_connected


async def test_get_message_and_limits_retention(bus: Bus) -> None:
    await bus.add_stream(work_stream_config("default"))
    ack = await bus.js_publish("sie.work.default.l4.default.m", b"keep", headers={"h": "1"})
    got = await bus.get_message("WORK_POOL_default", ack.seq)
    assert (got.subject, got.data) == ("sie.work.default.l4.default.m", b"keep")
    assert (got.headers or {}).get("h") == "1"
    with pytest.raises(BusError):
        await bus.get_message("WORK_POOL_default", ack.seq + 100)
    with pytest.raises(NoStreamError):
        await bus.get_message("NOPE", 1)
    # a limits stream keeps acked messages (DEAD_LETTERS)
    await bus.add_stream(dead_letter_stream_config())
    await bus.js_publish("sie.dlq.m", b"dead", msg_id="dlq.X.1")
    dup = await bus.js_publish("sie.dlq.m", b"dead", msg_id="dlq.X.1")
    assert dup.duplicate
    c = await bus.pull_consumer("DEAD_LETTERS", cfg(durable="ops", filter_subject="sie.dlq.>"))
    (m,) = await c.fetch(1, 1.0)
    await m.ack()
    assert (await bus.stream_info("DEAD_LETTERS")).messages == 1


async def test_dead_letters_after_max_deliver(bus: Bus) -> None:
    """A work item that always fails lands in DEAD_LETTERS after max_deliver (§8)."""
    from sie.roles.gateway.dlq import DeadLetters

    dlq = DeadLetters(bus)
    async with anyio.create_task_group() as tg:
        await tg.start(dlq.run)
        await bus.add_stream(work_stream_config("default"))
        await bus.js_publish("sie.work.default.l4.default.org__m", b"poison", msg_id="r.0")
        c = await bus.pull_consumer("WORK_POOL_default", cfg(max_deliver=2))
        for _ in range(2):
            (m,) = await c.fetch(1, 1.0)
            await m.nak()
        assert await c.fetch(1, 0.2) == []
        with anyio.fail_after(5):
            while dlq.republished == 0:  # noqa: ASYNC110 - a counter, not an event
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    ops = await bus.pull_consumer("DEAD_LETTERS", cfg(durable="ops", filter_subject="sie.dlq.>"))
    (dead,) = await ops.fetch(1, 1.0)
    assert dead.subject == "sie.dlq.org__m" and dead.data == b"poison"
    assert (dead.headers or {}).get("Sie-Dlq-Subject") == "sie.work.default.l4.default.org__m"
    # a second gateway handling the same advisory does not store it twice
    second = DeadLetters(bus)
    await second.handle(
        Msg(
            "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.WORK_POOL_default.c1",
            json.dumps({"stream": "WORK_POOL_default", "stream_seq": 1, "deliveries": 2}).encode(),
        )
    )
    assert (await bus.stream_info("DEAD_LETTERS")).messages == 1
