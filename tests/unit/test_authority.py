"""The config write path, branch by branch (architecture §3, §9; reference §5.4, §5.5).

Every failing branch asserts that store, registry and epoch are unchanged.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

from sie.control.authority import ConfigAuthority
from sie.control.store import ConfigStore
from sie.core.config import parse_model_config
from sie.core.epoch import ConfigEpoch
from sie.core.errors import (
    ContentConflict,
    IdempotencyMismatch,
    IdempotentInflightCancelled,
    InvalidModelId,
    ParseError,
    PayloadTooLarge,
    PublisherUnavailable,
    RegistryUnavailable,
    StoreUnavailable,
    UnroutableModel,
    ValidationFailed,
)
from sie.core.subjects import config_subject
from sie.core.wire import ConfigNotification
from sie.transport.memory import MemoryBus
from tests.configdata import OTHER_BUNDLE, model_doc, model_yaml, registry

pytestmark = pytest.mark.anyio


class FlakyPublisher:
    """A bus wrapper whose publishes fail for chosen bundles, or that is disconnected."""

    def __init__(self, bus: MemoryBus, fail_bundles: set[str] | None = None) -> None:
        self.bus = bus
        self.fail_bundles = fail_bundles or set()
        self.connected = True

    @property
    def is_connected(self) -> bool:
        return self.connected

    async def publish(self, subject: str, data: bytes) -> None:
        if subject.rsplit(".", 1)[-1] in self.fail_bundles:
            raise OSError(f"publish to {subject} failed")
        await self.bus.publish(subject, data)


async def until(pred: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait until ``pred()`` holds (an observable state change, polled every ms)."""
    with anyio.fail_after(timeout_s):
        while not pred():  # noqa: ASYNC110 - polling a test predicate
            await anyio.sleep(0.001)


@pytest.fixture
async def bus() -> AsyncIterator[MemoryBus]:
    async with MemoryBus() as b:
        yield b


def make(
    bus: MemoryBus | None = None, *, store: bool = True, publisher: Any = None, bundles: Any = ()
) -> ConfigAuthority:
    st = ConfigStore(f"memory://auth-{uuid.uuid4().hex}") if store else None
    return ConfigAuthority(
        registry(*bundles) if bundles else registry(),
        store=st,
        publisher=publisher if publisher is not None else bus,
        producer_id="sie-config-0",
    )


def state(a: ConfigAuthority) -> tuple[Any, ...]:
    assert a.registry is not None
    snap = a.registry.snapshot
    stored = tuple((m, a.store.read_model_raw(m)) for m in a.store.list_models()) if a.store else ()
    return dict(snap.configs), a.epoch.get(), stored, a.store.read_epoch() if a.store else None


async def test_create_persists_bumps_epoch_and_publishes(bus: MemoryBus) -> None:
    a = make(bus)
    sub_b = await bus.subscribe(config_subject("default"))
    sub_all = await bus.subscribe(config_subject("_all"))
    status, body = await a.write(model_yaml())
    assert status == 201
    assert body["created_profiles"] == ["default"] and body["existing_profiles_skipped"] == []
    assert body["routable_bundles_by_profile"] == {"default": ["default"]}
    assert body["router_id"] == "sie-config-0" and body["warnings"] == [] and body["epoch"] == 1
    assert a.epoch.get() == 1 and a.store is not None and a.store.read_epoch() == 1
    assert "org/m" in (a.store.read_model("org/m") or "")
    m1, m2 = await sub_b.next_msg(1), await sub_all.next_msg(1)
    assert m1.data == m2.data  # byte-identical copy on _all (§3)
    note = ConfigNotification.from_bytes(m1.data)
    assert (note.bundle_id, note.epoch, note.model_id, note.profiles_added) == (
        "default",
        1,
        "org/m",
        ["default"],
    )
    assert note.bundle_config_hash == a.registry.snapshot.bundle_config_hash("default")  # type: ignore[union-attr]
    assert note.bundle_pool_config_hashes["default"]["default"]
    assert "sie_id: org/m" in note.model_config_yaml


async def test_replay_is_200_and_skips_disk_epoch_publish(bus: MemoryBus) -> None:
    a = make(bus)
    await a.write(model_yaml())
    before = state(a)
    sub = await bus.subscribe("sie.config.models.>")
    status, body = await a.write(model_yaml())
    assert (
        status == 200
        and body["created_profiles"] == []
        and body["existing_profiles_skipped"] == ["default"]
    )
    assert state(a) == before
    with pytest.raises(TimeoutError):
        await sub.next_msg(0.1)


async def test_append_publishes_merged_document(bus: MemoryBus) -> None:
    a = make(bus)
    await a.write(model_yaml(max_sequence_length=64))
    sub = await bus.subscribe(config_subject("_all"))
    status, body = await a.write(
        b"sie_id: org/m\nprofiles:\n  fast:\n    extends: default\n    max_batch_tokens: 64\n"
    )
    assert status == 201 and body["created_profiles"] == ["fast"] and a.epoch.get() == 2
    note = ConfigNotification.from_bytes((await sub.next_msg(1)).data)
    assert "max_sequence_length: 64" in note.model_config_yaml and "fast:" in note.model_config_yaml
    assert a.store is not None and "max_sequence_length: 64" in (a.store.read_model("org/m") or "")


async def test_epoch_advances_without_a_store(bus: MemoryBus) -> None:
    # reference §9 item 10: the public implementation never advances without a store
    a = make(bus, store=False)
    await a.write(model_yaml("org/a"))
    await a.write(model_yaml("org/b"))
    assert a.epoch.get() == 2 and a.epoch_info()["epoch"] == 2


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"", ParseError),
        (b"   \n", ParseError),
        (b"sie_id: [unclosed", ParseError),
        (b"- a list\n", ParseError),
        (b"sie_id: 2020-01-01\n", ParseError),
        (model_yaml("../etc"), InvalidModelId),
        (model_yaml("org/status"), InvalidModelId),
        (model_yaml("status"), InvalidModelId),
        (model_yaml("-leading"), InvalidModelId),
        (model_yaml("a__b"), InvalidModelId),  # the store cannot round-trip it
        (model_yaml(extra_key=1), ValidationFailed),
        (b"profiles: {}\n", ValidationFailed),
        (
            model_yaml(profiles={"default": {"adapter_path": "x.y:Z", "max_batch_tokens": 1}}),
            UnroutableModel,
        ),
        (b"x" * (1024 * 1024 + 1), PayloadTooLarge),
        (
            b'sie_id: "acme/nl\\n"\nhf_id: x\ntasks: {encode: {dense: {dim: 8}}}\n'
            b"profiles: {default: {adapter_path: 'sie.engines.encoders.sentence_transformers:DenseEncoder',"
            b" max_batch_tokens: 8}}\n",
            InvalidModelId,
        ),
        (
            model_yaml(
                profiles={
                    "default": {
                        "adapter_path": "sie.engines.encoders.sentence_transformers:DenseEncoder",
                        "max_batch_tokens": 1,
                        "adaptive_batching": {"a": "1e999"},
                    }
                }
            ),
            ValidationFailed,
        ),
        (model_yaml(package_backed=0), ValidationFailed),
        (model_yaml("a/" + "b" * 127), InvalidModelId),
        (b"a: 1\n" * 10_001, ParseError),
        (
            model_yaml(
                profiles={
                    "default": {
                        "adapter_path": "sie.engines.encoders.sentence_transformers:DenseEncoder",
                        "max_batch_tokens": 1,
                        "adapter_options": {"runtime": {"query_template": "{bad}"}},
                    }
                }
            ),
            ValidationFailed,
        ),
        (b"a: " + b"[" * 40 + b"]" * 40, ParseError),
    ],
)
async def test_bad_input_changes_nothing(
    bus: MemoryBus, body: bytes, error: type[Exception]
) -> None:
    a = make(bus)
    await a.write(model_yaml("org/keep"))
    before = state(a)
    sub = await bus.subscribe("sie.config.models.>")
    with pytest.raises(error) as e:
        await a.write(body)
    assert 400 <= e.value.status < 500  # type: ignore[attr-defined]
    assert state(a) == before
    with pytest.raises(TimeoutError):
        await sub.next_msg(0.05)


async def test_conflict_is_409_and_changes_nothing(bus: MemoryBus) -> None:
    a = make(bus)
    await a.write(model_yaml())
    before = state(a)
    with pytest.raises(ContentConflict):
        await a.write(
            model_yaml(
                profiles={
                    "default": {
                        "adapter_path": "sie.engines.encoders.sentence_transformers:DenseEncoder",
                        "max_batch_tokens": 7,
                    }
                }
            )
        )
    assert state(a) == before


async def test_store_failure_leaves_registry_and_epoch_untouched(bus: MemoryBus) -> None:
    a = make(bus)
    await a.write(model_yaml("org/a"))
    before = state(a)
    assert a.store is not None
    real = a.store.write_epoch

    def broken(epoch: int) -> None:
        raise StoreUnavailable("disk full")

    a.store.write_epoch = broken  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable):
        await a.write(model_yaml("org/b"))
    a.store.write_epoch = real  # type: ignore[method-assign]
    assert state(a) == before  # model file rolled back, registry and epoch untouched
    status, _ = await a.write(model_yaml("org/b"))
    assert status == 201 and a.epoch.get() == 2


async def test_disconnected_publisher_is_503_before_anything(bus: MemoryBus) -> None:
    pub = FlakyPublisher(bus)
    a = make(bus, publisher=pub)
    pub.connected = False
    before = state(a)
    with pytest.raises(PublisherUnavailable) as e:
        await a.write(model_yaml())
    assert e.value.status == 503 and state(a) == before


async def test_partial_publish_is_a_warning_and_the_write_is_durable(bus: MemoryBus) -> None:
    pub = FlakyPublisher(bus, fail_bundles={"other"})
    a = make(bus, publisher=pub, bundles=(registry().snapshot.bundles["default"], OTHER_BUNDLE))
    sub = await bus.subscribe(config_subject("default"))
    status, body = await a.write(model_yaml())
    assert status == 201 and a.epoch.get() == 1
    assert len(body["warnings"]) == 1 and body["warnings"][0].startswith("nats_publish_partial")
    assert "other" in body["warnings"][0]
    assert ConfigNotification.from_bytes((await sub.next_msg(1)).data).bundle_id == "default"
    pub.fail_bundles = {"default", "other"}
    status, body = await a.write(model_yaml("org/n"))
    assert status == 201 and body["warnings"][0].startswith("nats_publish_failed")
    assert a.store is not None and a.store.list_models() == ["org/m", "org/n"]


async def test_registry_unavailable_everywhere_but_epoch() -> None:
    a = ConfigAuthority(None, registry_error="bundles/x.yaml: bad")
    with pytest.raises(RegistryUnavailable):
        await a.write(model_yaml())
    with pytest.raises(RegistryUnavailable):
        await a.export()
    assert a.epoch_info() == {"epoch": 0, "bundles_hash": "", "bundle_config_hashes_hash": ""}


async def test_export_is_a_serialisation_point(bus: MemoryBus) -> None:
    a = make(bus)
    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(a.write, model_yaml(f"org/m{i}"))
        snaps = []
        for _ in range(5):
            snaps.append(await a.export())
            await anyio.sleep(0.001)
    for snap in [*snaps, await a.export()]:
        assert len(snap["models"]) == snap["epoch"]  # each write adds one model and one epoch
    final = await a.export()
    assert final["snapshot_version"] == 1 and final["generated_at"].endswith("Z")
    assert final["models"][0]["affected_bundles"] == ["default"]
    json.dumps(final)


# -- Idempotency-Key (architecture §3 "Idempotency") ---------------------------------------


async def test_same_key_same_body_replays_without_executing(bus: MemoryBus) -> None:
    a = make(bus)
    first = await a.write(model_yaml(), "k1")
    epoch = a.epoch.get()
    assert await a.write(model_yaml(), "k1") == first  # the cached 201, not a 200 no-op
    assert a.epoch.get() == epoch


async def test_same_key_different_body_is_422(bus: MemoryBus) -> None:
    a = make(bus)
    await a.write(model_yaml(), "k1")
    with pytest.raises(IdempotencyMismatch) as e:
        await a.write(model_yaml("org/other"), "k1")
    assert e.value.status == 422 and "org/other" not in a.registry.snapshot.configs  # type: ignore[union-attr]


async def test_no_key_no_caching(bus: MemoryBus) -> None:
    a = make(bus)
    assert (await a.write(model_yaml()))[0] == 201
    assert (await a.write(model_yaml()))[0] == 200
    assert len(a.idempotency) == 0


async def test_concurrent_same_key_executes_once(bus: MemoryBus) -> None:
    a = make(bus)
    calls = 0
    real = a._commit

    async def counting(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        await anyio.sleep(0.05)
        return await real(*args)

    a._commit = counting  # type: ignore[method-assign]
    replies: list[Any] = []

    async def one() -> None:
        replies.append(await a.write(model_yaml(), "same"))

    async with anyio.create_task_group() as tg:
        for _ in range(25):
            tg.start_soon(one)
    assert calls == 1 and a.epoch.get() == 1
    assert len(replies) == 25 and all(r == replies[0] for r in replies) and replies[0][0] == 201


async def test_waiters_see_the_owners_failure_not_a_success(bus: MemoryBus) -> None:
    a = make(bus)
    assert a.store is not None
    gate = anyio.Event()
    real = a.store.write_epoch

    def slow_fail(epoch: int) -> None:
        anyio.from_thread.run(gate.wait)
        raise StoreUnavailable("disk full")

    a.store.write_epoch = slow_fail  # type: ignore[method-assign]
    errors: list[Exception] = []

    async def one() -> None:
        try:
            await a.write(model_yaml(), "k")
        except Exception as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(one)
        await until(lambda: a.idempotency.in_flight("k") == 3)  # the owner and two waiters
        gate.set()
    assert len(errors) == 3 and all(isinstance(e, StoreUnavailable) for e in errors)
    a.store.write_epoch = real  # type: ignore[method-assign]
    assert (await a.write(model_yaml(), "k"))[0] == 201  # failures are not cached: a retry runs


async def test_owner_cancelled_before_commit_gives_waiters_503(bus: MemoryBus) -> None:
    a = make(bus)
    results: list[Any] = []
    # hold the write lock so the owner blocks before committing
    async with a.lock, anyio.create_task_group() as tg:
        owner_scope = anyio.CancelScope()

        async def owner() -> None:
            with owner_scope:
                await a.write(model_yaml(), "k")

        async def waiter() -> None:
            try:
                results.append(await a.write(model_yaml(), "k"))
            except Exception as exc:
                results.append(exc)

        tg.start_soon(owner)
        await until(lambda: a.idempotency.in_flight("k") == 1)
        tg.start_soon(waiter)
        await until(lambda: a.idempotency.in_flight("k") == 2)
        owner_scope.cancel()
    assert len(results) == 1 and isinstance(results[0], IdempotentInflightCancelled)
    assert a.epoch.get() == 0
    assert (await a.write(model_yaml(), "k"))[0] == 201


async def test_eviction_between_wake_and_read_is_not_reexecuted(bus: MemoryBus) -> None:
    a = make(bus)
    gate = anyio.Event()
    real = a._commit
    calls = 0

    async def slow(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        await gate.wait()
        reply = await real(*args)
        return reply

    a._commit = slow  # type: ignore[method-assign]
    out: list[Any] = []

    async def call() -> None:
        out.append(await a.write(model_yaml(), "k"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await until(lambda: calls == 1)
        tg.start_soon(call)
        await until(lambda: a.idempotency.in_flight("k") == 2)
        # the owner completes and caches; capacity 0 evicts it before the waiter reads
        a.idempotency.capacity = 0
        gate.set()
    statuses = sorted(r[0] for r in out)
    assert calls == 1 and statuses == [200, 201]
    replay = next(r for r in out if r[0] == 200)
    assert replay[1]["error"] == "idempotent_replay_evicted"


async def test_store_not_restored_still_enforces_append_only(bus: MemoryBus) -> None:
    """A restart without SIE_CONFIG_RESTORE must not let a write clobber the stored
    document: writes merge into it (architecture §3 step 3.3)."""
    first = make(bus)
    await first.write(model_yaml(max_sequence_length=64))
    await first.write(b"sie_id: org/m\nprofiles:\n  small:\n    extends: default\n")
    assert first.store is not None
    again = ConfigAuthority(
        registry(), store=first.store, publisher=bus, epoch=ConfigEpoch(first.store.read_epoch())
    )
    changed = model_yaml(
        profiles={
            "default": {
                "adapter_path": "sie.engines.encoders.sentence_transformers:DenseEncoder",
                "max_batch_tokens": 7,
            }
        }
    )
    with pytest.raises(ContentConflict):
        await again.write(changed)
    status, body = await again.write(b"sie_id: org/m\nprofiles:\n  big:\n    extends: default\n")
    assert status == 201 and body["created_profiles"] == ["big"] and body["epoch"] == 3
    stored = again.store.read_model("org/m") or ""  # type: ignore[union-attr]
    assert "small:" in stored and "big:" in stored and "max_sequence_length: 64" in stored
    assert set(again.registry.snapshot.configs["org/m"].profiles) == {"default", "small", "big"}  # type: ignore[union-attr]


async def test_store_file_name_collision_is_409_and_changes_nothing(bus: MemoryBus) -> None:
    a = make(bus)
    await a.write(model_yaml("acme_/x"))
    before = state(a)
    with pytest.raises(ContentConflict):
        await a.write(model_yaml("acme/_x"))
    assert state(a) == before


async def test_seeded_model_keeps_stored_profiles_after_a_restart_without_restore(
    bus: MemoryBus,
) -> None:
    first = make(bus)
    seed = parse_model_config(model_doc())
    assert first.registry is not None
    first.registry.add_model_config(seed, "filesystem")
    await first.write(
        b"sie_id: org/m\nprofiles:\n  extra1:\n    extends: default\n    max_batch_tokens: 512\n"
    )
    assert first.store is not None
    restarted = registry()
    restarted.add_model_config(seed, "filesystem")  # the seed again, no restore
    again = ConfigAuthority(
        restarted, store=first.store, publisher=bus, epoch=ConfigEpoch(first.store.read_epoch())
    )
    changed = (
        b"sie_id: org/m\nprofiles:\n  extra1:\n    extends: default\n    max_batch_tokens: 9\n"
    )
    with pytest.raises(ContentConflict):
        await again.write(changed)
    status, _ = await again.write(b"sie_id: org/m\nprofiles:\n  extra2:\n    extends: default\n")
    assert status == 201
    stored = first.store.read_model("org/m") or ""
    assert "extra1:" in stored and "extra2:" in stored


async def test_collision_cannot_add_profiles_to_another_model(bus: MemoryBus) -> None:
    a = make(bus)
    await a.write(model_yaml("x_/b"))
    before = state(a)
    hijack = model_yaml("x/_b").replace(
        b"profiles:\n", b"profiles:\n  hijack:\n    extends: default\n", 1
    )
    with pytest.raises(ContentConflict, match="same store file"):
        await a.write(hijack)
    assert state(a) == before


async def test_unreadable_stored_document_blocks_the_write(bus: MemoryBus) -> None:
    a = make(bus)
    await a.write(model_yaml())
    assert a.store is not None
    a.store._write(
        a.store._path("models", "org__m.yaml"), b"# sie-epoch: 1\nsie_id: org/m\nprofiles: ["
    )
    before = state(a)
    with pytest.raises(ContentConflict, match="cannot be read"):
        await a.write(b"sie_id: org/m\nprofiles:\n  y:\n    extends: default\n")
    assert state(a) == before


async def test_refused_merge_leaves_the_store_untouched(bus: MemoryBus) -> None:
    """A stored profile whose adapter no bundle lists any more: the write is refused
    before anything is persisted (the store's epoch and files stay as they were)."""
    a = make(bus)
    assert a.store is not None
    doc = model_doc("m/u")
    doc["profiles"]["old"] = {"adapter_path": "gone.mod:X", "max_batch_tokens": 8}
    from sie.core.config import dump_yaml

    a.store.write_model("m/u", dump_yaml(doc), 1)
    a.store.write_epoch(1)
    a.epoch.force_set(1)
    before = state(a)
    with pytest.raises(UnroutableModel):
        await a.write(b"sie_id: m/u\nprofiles:\n  y:\n    extends: default\n")
    assert state(a) == before


async def test_failed_append_restores_the_stored_file_byte_for_byte(bus: MemoryBus) -> None:
    a = make(bus)
    await a.write(model_yaml())
    before = state(a)
    assert a.store is not None

    def broken(epoch: int) -> None:
        raise StoreUnavailable("disk full")

    a.store.write_epoch = broken  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable):
        await a.write(b"sie_id: org/m\nprofiles:\n  more:\n    extends: default\n")
    assert state(a) == before  # the epoch stamp in the model file included
