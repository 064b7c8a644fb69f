"""ModelCache: memory budget, LRU and idle eviction, pinning, in-use protection, load
failures (reference §4.4, §4.5), with a small fake engine loaded by adapter path."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import anyio
import pytest

from sie.core.config import parse_bundle, parse_model_config
from sie.core.errors import ModelLoadFailed
from sie.core.registry import ModelEntry, ModelRegistry
from sie.engines.runtime.cache import ModelCache

pytestmark = pytest.mark.anyio

MODULE = "tests.unit.test_model_cache"
MB = 1_000_000

#: per model id: bytes it reports, and how its loads fail (None, "permanent", "transient")
SIZES: dict[str, int] = {}
FAIL: dict[str, str | None] = {}
LOADS: list[str] = []


class FakeEngine:
    outputs = ("dense",)

    def __init__(self, config: Any, profile: Any, device: str) -> None:
        self.name = config.sie_id

    def load(self) -> None:
        LOADS.append(self.name)
        mode = FAIL.get(self.name)
        if mode is not None:
            raise ModelLoadFailed(
                f"{self.name} failed", error_class="OOM", permanent=mode == "permanent"
            )

    def unload(self) -> None:
        pass

    def memory_bytes(self) -> int:
        return SIZES.get(self.name, MB)


class ConcurrentEngine(FakeEngine):
    """Declares thread-safe task calls (sie.engines.runtime.threads); records call overlap."""

    concurrent_calls = 4
    events: list[str] = []

    def unload(self) -> None:
        ConcurrentEngine.events.append("unload")


def entries(*names: str, engine: str = "FakeEngine") -> dict[str, ModelEntry]:
    reg = ModelRegistry()
    reg.install_bundles([parse_bundle({"name": "default", "priority": 1, "adapters": [MODULE]})])
    for n in names:
        reg.add_model_config(
            parse_model_config(
                {
                    "sie_id": n,
                    "hf_id": n,
                    "tasks": {"encode": {"dense": {"dim": 4}}},
                    "profiles": {
                        "default": {"adapter_path": f"{MODULE}:{engine}", "max_batch_tokens": 64}
                    },
                }
            )
        )
    return {n: reg.snapshot.entries[n] for n in names}


def run_batch(engine: Any) -> Any:
    def run(key: Hashable, payloads: Sequence[Any]) -> list[Any]:
        return list(payloads)

    return run


def cache(**kw: Any) -> ModelCache:
    LOADS.clear()
    return ModelCache(
        allowed_modules=[MODULE],
        run_batch=run_batch,
        estimate_bytes=lambda e: SIZES.get(e.model_id, MB),
        **kw,
    )


def loaded(c: ModelCache) -> set[str]:
    return {s["name"] for s in [st.to_map() for st in c.statuses()] if s["state"] == "loaded"}


async def test_lru_eviction_keeps_the_budget_and_counts() -> None:
    SIZES.update({"a": 60 * MB, "b": 60 * MB, "c": 30 * MB})
    e = entries("a", "b", "c")
    c = cache(memory_budget_bytes=100 * MB)
    async with anyio.create_task_group() as tg:
        await tg.start(c.run)
        await c.get(e["a"])
        await c.get(e["c"])
        await c.get(e["b"])  # 60 + 30 + 60 > 100: a (least recently used) goes
        assert loaded(c) == {"b", "c"} and c.loaded_bytes == 90 * MB
        await c.get(e["a"])  # now c is the LRU: c then b... until a fits
        assert "a" in loaded(c) and c.loaded_bytes <= 100 * MB
        stats = {s["name"]: s for s in [st.to_map() for st in c.statuses()]}
        assert stats["a"]["loads"] == 2 and stats["a"]["evictions"] == 1
        tg.cancel_scope.cancel()


async def test_pinned_and_in_use_models_are_never_evicted() -> None:
    SIZES.update({"p": 60 * MB, "u": 30 * MB, "n": 60 * MB})
    e = entries("p", "u", "n")
    c = cache(memory_budget_bytes=100 * MB, pinned=["p"])
    async with anyio.create_task_group() as tg:
        await tg.start(c.run)
        await c.get(e["p"])
        async with c.use(e["u"]):
            await c.get(e["n"])  # over budget, but p is pinned and u is busy
            assert loaded(c) == {"p", "u", "n"}
        await c.get(e["n"])
        tg.cancel_scope.cancel()


async def test_idle_eviction_spares_pinned_models() -> None:
    SIZES.update({"i": MB, "k": MB})
    e = entries("i", "k")
    c = cache(idle_evict_s=0.1, pinned=["k"])
    async with anyio.create_task_group() as tg:
        await tg.start(c.run)
        await c.get(e["i"])
        await c.get(e["k"])
        for _ in range(100):  # the unload itself runs on the model's thread
            if {s["name"]: s["evictions"] for s in [st.to_map() for st in c.statuses()]} == {
                "i": 1,
                "k": 0,
            }:
                break
            await anyio.sleep(0.05)
        assert {s["name"]: s["evictions"] for s in [st.to_map() for st in c.statuses()]} == {
            "i": 1,
            "k": 0,
        }
        assert loaded(c) == {"k"}
        tg.cancel_scope.cancel()


async def test_concurrent_first_use_loads_once() -> None:
    e = entries("once")
    c = cache()
    async with anyio.create_task_group() as tg:
        await tg.start(c.run)
        async with anyio.create_task_group() as users:
            for _ in range(10):
                users.start_soon(c.get, e["once"])
        assert LOADS == ["once"]
        tg.cancel_scope.cancel()


async def test_failures_permanent_stick_transient_retry_others_unaffected() -> None:
    FAIL.update({"perm": "permanent", "temp": "transient"})
    e = entries("perm", "temp", "fine")
    c = cache()
    async with anyio.create_task_group() as tg:
        await tg.start(c.run)
        for _ in range(2):
            with pytest.raises(ModelLoadFailed):
                await c.get(e["perm"])
        assert LOADS.count("perm") == 1  # sticky: not retried
        with pytest.raises(ModelLoadFailed):
            await c.get(e["temp"])
        FAIL["temp"] = None
        await c.get(e["temp"])  # transient: the next request tries again
        await c.get(e["fine"])
        stats = {s["name"]: s for s in [st.to_map() for st in c.statuses()]}
        err = stats["perm"]["last_error"]
        assert err["error_class"] == "OOM" and err["permanent"] is True and err["attempts"] == 1
        assert stats["perm"]["state"] == "failed" and "last_error" not in stats["temp"]
        assert loaded(c) == {"temp", "fine"}
        tg.cancel_scope.cancel()


async def test_engine_calls_overlap_and_unload_waits_for_them() -> None:
    """Up to ``engine_concurrency`` calls of a thread-safe engine run at once; unloading
    waits until every call in flight has returned (never unload under a running call)."""
    import threading
    import time

    lock = threading.Lock()
    active = {"now": 0, "most": 0}
    two_running = threading.Event()

    def slow_batch(engine: Any) -> Any:
        def run(key: Hashable, payloads: Sequence[Any]) -> list[Any]:
            with lock:
                active["now"] += 1
                active["most"] = max(active["most"], active["now"])
                if active["now"] >= 2:
                    two_running.set()
            time.sleep(0.3)
            with lock:
                active["now"] -= 1
            ConcurrentEngine.events.append("call done")
            return list(payloads)

        return run

    ConcurrentEngine.events = []
    e = entries("cc", engine="ConcurrentEngine")["cc"]
    c = ModelCache(
        allowed_modules=[MODULE], run_batch=slow_batch, engine_concurrency=2, max_batch_requests=1
    )
    async with anyio.create_task_group() as tg:
        await tg.start(c.run)
        model = await c.get(e)
        assert model.limiter.total_tokens == 2
        for i in range(2):
            tg.start_soon(model.batcher.submit, f"x{i}", 1)
        assert await anyio.to_thread.run_sync(two_running.wait, 2)
        await c.unload("cc")
        assert ConcurrentEngine.events == ["call done", "call done", "unload"]
        assert active["most"] == 2
        tg.cancel_scope.cancel()


async def test_engines_without_the_declaration_keep_one_slot() -> None:
    e = entries("plain")["plain"]
    c = cache(engine_concurrency=4)
    async with anyio.create_task_group() as tg:
        await tg.start(c.run)
        assert (await c.get(e)).limiter.total_tokens == 1
        tg.cancel_scope.cancel()
