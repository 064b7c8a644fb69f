"""Loaded models on a worker: load on first use, one batcher per model, a memory
budget with LRU eviction, optional idle eviction, states (docs/api.md §10).

States follow docs/api.md §7, §10: ``available`` → ``loading`` → ``loaded`` →
``unloading`` → ``available``. A failed load is ``failed`` with ``last_error``
(``code``, ``message``, ``error_class``, ``attempts``, ``permanent``): sticky when
permanent (until the config changes), retried by the next request otherwise.
Concurrent first requests share one load. Loads run on the model's own inference
thread, so they never block the event loop, one at a time (model construction in
transformers is process-global state), and one model's failure never blocks
another's load.

Memory (bytes): each loaded engine reports ``memory_bytes()``; before a load the
weights' size on disk is the estimate. While the loaded total plus the estimate
exceeds the budget, the least recently used idle model is unloaded; pinned
(``--preload``) models and models serving a request are never evicted. After the
load the real size is known and the budget is enforced again. With ``idle_evict_s``
a model unused that long is unloaded (pinned ones never).

Trust (docs/security.md "Trust model"): before anything else, a load is checked
against the operator's ``ConfigTrust`` (``sie.core.trust``): a config asking for what
the operator did not allow (remote code, a ``weights_path`` outside the weights roots,
an upstream off the allowlist, an ``api_key_env`` not declared) fails with
``ModelLoadFailed`` (CONFIG, permanent) before its weights are sized or its engine
imported, whichever path the config came by (write, delta, seed, store). Engines
whose constructor takes a ``trust`` keyword get the policy (the upstream engine reads
its API key from it). A failed load's error is logged in full on the worker; the copy
kept in ``last_error`` and raised to requests has absolute filesystem paths other than
the config's own ``weights_path`` replaced by ``<path>`` (``redact_error``).
"""

from __future__ import annotations

import gc
import inspect
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from sie.core.admission import EngineState
from sie.core.errors import ModelLoadFailed, ModelLoading, SieError
from sie.core.registry import ModelEntry
from sie.core.trust import ConfigTrust, redact_error
from sie.core.wire import MAX_ENGINE_NAME_CHARS, ModelStatus
from sie.engines.base import Engine, load_engine_class, memory_bytes
from sie.engines.generation import is_generator
from sie.engines.runtime.batching import TokenBudgetBatcher
from sie.engines.runtime.threads import CallThreads, engine_slots
from sie.gc_policy import freeze_long_lived

__all__ = ["LoadedModel", "ModelCache", "device_memory_bytes"]

log = logging.getLogger(__name__)


def _served(engine: Any) -> str | None:
    """The engine a profile that picks one at load is serving (its ``served``, e.g.
    ``sie.engines.onnx.fastest``), for the heartbeat's ``ModelStatus.engine``."""
    served = getattr(engine, "served", None)
    if isinstance(served, str) and 0 < len(served) <= MAX_ENGINE_NAME_CHARS:
        return served
    return None


def device_memory_bytes(device: str) -> int:
    """Total memory of ``device``: VRAM for ``cuda[:n]``, else physical RAM (bytes)."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[1])
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


@dataclass(slots=True)
class LoadedModel:
    entry: ModelEntry
    engine: Engine  # with one or more task protocols (sie.engines.base, .generation)
    batcher: TokenBudgetBatcher[Any, Any]
    limiter: anyio.CapacityLimiter
    scope: anyio.CancelScope
    stopped: anyio.Event  # set once the batcher has returned (no engine call in flight)
    loaded_at: float = field(default_factory=time.time)
    bytes: int = 0


@dataclass(slots=True)
class _Slot:
    state: str = "available"
    loaded: LoadedModel | None = None
    ready: anyio.Event = field(default_factory=anyio.Event)
    gone: anyio.Event = field(default_factory=anyio.Event)  # set once unloaded
    error: SieError | None = None
    config_key: Any = None
    last_used: float = field(default_factory=time.monotonic)
    active: int = 0


@dataclass(slots=True)
class _Stats:
    """Per model id, kept across evictions (shown in heartbeats and /v1/models)."""

    loads: int = 0
    evictions: int = 0
    attempts: int = 0
    last_error: SieError | None = None


RunBatch = Callable[[Engine], Callable[[Hashable, Sequence[Any]], Sequence[Any]]]


class ModelCache:
    """Owns engines and their batchers. Run ``run()`` in a task group first.

    Args:
        allowed_modules: the worker bundle's adapter modules (what may be imported), or a
            callable returning them at load time (the bundle may arrive from the config
            service after the cache is built).
        run_batch: builds the batch function for an engine (see ``sie.roles.worker.tasks``).
        device: torch device string, e.g. ``"cpu"``.
        max_batch_requests / max_batch_wait_s: batcher limits (docs/api.md §10).
        engine_concurrency: engine calls of one model that may run at once on a CPU,
            for engines that allow it (``sie.engines.runtime.threads``).
        memory_budget_bytes: most bytes of loaded models (None: unlimited).
        idle_evict_s: unload models unused this many seconds (None: never).
        pinned: model ids never evicted (the ``--preload`` list).
        estimate_bytes: a model's expected size before its load (weights on disk).
        trust: the operator's policy every load is checked against (default: allow
            nothing a config could ask for; ``sie.core.trust``).
        model_cache_dir: where engines that convert weights keep the result (the
            ``SIE_MODEL_CACHE_DIR`` setting; None: their default).
    """

    def __init__(
        self,
        *,
        allowed_modules: Sequence[str] | Callable[[], Sequence[str]],
        run_batch: RunBatch,
        device: str = "cpu",
        max_batch_requests: int = 64,
        max_batch_wait_s: float = 0.010,
        engine_concurrency: int = 2,
        on_batch: Callable[[str, int, int, float], Any] | None = None,
        on_change: Callable[[], Any] | None = None,
        memory_budget_bytes: int | None = None,
        idle_evict_s: float | None = None,
        pinned: Sequence[str] = (),
        estimate_bytes: Callable[[ModelEntry], int] | None = None,
        on_evict: Callable[[str, str], Any] | None = None,
        trust: ConfigTrust | None = None,
        model_cache_dir: str | None = None,
    ) -> None:
        self._allowed = allowed_modules
        self._model_cache_dir = model_cache_dir or None
        self.trust = trust if trust is not None else ConfigTrust()
        self._run_batch = run_batch
        self._device = device
        self._max_batch_requests = max_batch_requests
        self._max_batch_wait_s = max_batch_wait_s
        self._engine_concurrency = engine_concurrency
        self._call_threads = CallThreads()
        self._on_batch = on_batch
        self._on_change = on_change
        self._listeners: list[Callable[[], Any]] = []
        self._on_evict = on_evict
        self.memory_budget_bytes = memory_budget_bytes
        self.idle_evict_s = idle_evict_s
        self.pinned = set(pinned)
        self._estimate = estimate_bytes
        self._slots: dict[str, _Slot] = {}
        self._stats: dict[str, _Stats] = {}
        self._budget_lock = anyio.Lock()
        # one engine load at a time: transformers builds models on a process-wide "meta"
        # device, and two loads at once can corrupt each other ("Cannot copy out of
        # meta tensor"), failing one model for good
        self._load_lock = anyio.Lock()
        self._tg: anyio.abc.TaskGroup | None = None

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                if self.idle_evict_s is not None:
                    tg.start_soon(self._idle_evictor, self.idle_evict_s)
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._tg = None
            for slot in self._slots.values():
                if slot.loaded is not None:
                    slot.loaded.engine.unload()

    # -- reporting ----------------------------------------------------------------------

    @property
    def loaded_bytes(self) -> int:
        return sum(s.loaded.bytes for s in self._slots.values() if s.loaded is not None)

    def statuses(self) -> list[ModelStatus]:
        """Every model this cache has seen, by name, for heartbeats and /v1/models;
        evicted models stay listed (``available``) with their counts."""
        out = []
        for name in sorted(set(self._slots) | set(self._stats)):
            slot = self._slots.get(name)
            stats = self._stats.get(name, _Stats())
            engine = slot.loaded.engine if slot is not None and slot.loaded else None
            engine_state: EngineState | None = None
            if is_generator(engine):  # the admission gate reads its scheduler state
                try:
                    engine_state = engine.state()
                except Exception:  # a state that cannot be read is simply not reported
                    log.debug("engine state of %s unavailable", name, exc_info=True)
            err = stats.last_error
            out.append(
                ModelStatus(
                    name=name,
                    state=slot.state if slot is not None else "available",
                    loads=stats.loads,
                    evictions=stats.evictions,
                    bytes=slot.loaded.bytes if slot is not None and slot.loaded else 0,
                    engine_state=engine_state if isinstance(engine_state, EngineState) else None,
                    engine=_served(engine),
                    last_error=None
                    if err is None
                    else {
                        **err.to_detail(),
                        "error_class": err.fields.get("error_class", "UNKNOWN"),
                        "attempts": stats.attempts,
                        "permanent": err.fields.get("permanent", True),
                    },
                )
            )
        return out

    def add_listener(self, fn: Callable[[], Any]) -> None:
        """Also call ``fn`` whenever a model's state changed (after ``on_change``)."""
        self._listeners.append(fn)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()
        for fn in self._listeners:
            fn()

    # -- use ----------------------------------------------------------------------------

    @asynccontextmanager
    async def use(
        self, entry: ModelEntry, wait_s: float | None = None
    ) -> AsyncIterator[LoadedModel]:
        """The loaded model for ``entry`` (loading it on first use), held in use, so
        it is not evicted, until the block exits.

        Raises:
            ModelLoadFailed: the load failed (now, or earlier and permanently).
            ModelLoading: still loading after ``wait_s`` seconds (as ``get``).
        """
        loaded = await self.get(entry, wait_s)
        slot = self._slots.get(entry.model_id)
        if slot is None or slot.loaded is not loaded:  # evicted between get and use: reload
            async with self.use(entry, wait_s) as again:
                yield again
            return
        slot.active += 1
        slot.last_used = time.monotonic()
        try:
            yield loaded
        finally:
            slot.active -= 1
            slot.last_used = time.monotonic()

    async def get(self, entry: ModelEntry, wait_s: float | None = None) -> LoadedModel:
        """The loaded model for ``entry``, loading it on first use.

        ``wait_s``: the longest wait for a load in progress (None: until it ends). The
        load belongs to the cache and goes on after the caller gives up.

        Raises:
            ModelLoadFailed: the load failed (now, or earlier and permanently).
            ModelLoading: still loading after ``wait_s`` seconds (503, Retry-After 5).
        """
        while True:
            key = entry.load_key
            slot = self._slots.get(entry.model_id)
            if slot is not None and slot.state == "unloading":
                await slot.gone.wait()
                continue
            if slot is not None and slot.config_key != key:
                await self.unload(entry.model_id)  # config changed: drop the old engine
                continue
            if slot is not None and slot.state == "failed":
                assert slot.error is not None
                if slot.error.fields.get("permanent", True):
                    raise slot.error
                self._slots.pop(entry.model_id, None)  # transient: try again
                slot = None
            if slot is None:
                assert self._tg is not None, "ModelCache.run() is not running"
                slot = self._slots[entry.model_id] = _Slot(state="loading", config_key=key)
                self._changed()
                # The load belongs to the cache, not to this caller: cancelling the caller
                # (an abandoned request) must not leave a half-loaded slot behind.
                self._tg.start_soon(self._load, entry, slot)
            if not slot.ready.is_set():  # anyio's wait yields even on a set event
                with anyio.move_on_after(wait_s):
                    await slot.ready.wait()
            if not slot.ready.is_set():
                raise ModelLoading(
                    f"model {entry.model_id!r} is loading on this worker; retry shortly",
                    model=entry.model_id,
                )
            if slot.loaded is None:
                assert slot.error is not None
                raise slot.error
            slot.last_used = time.monotonic()
            return slot.loaded

    # -- load and evict -----------------------------------------------------------------

    async def _load(self, entry: ModelEntry, slot: _Slot) -> None:
        assert self._tg is not None
        stats = self._stats.setdefault(entry.model_id, _Stats())
        stats.attempts += 1
        limiter = anyio.CapacityLimiter(1)
        t0 = time.monotonic()
        try:
            self.trust.check_load(entry.config, entry.profile)
            if self.memory_budget_bytes is not None:
                estimate = (
                    await anyio.to_thread.run_sync(self._estimate, entry) if self._estimate else 0
                )
                await self._make_room(estimate, keep=entry.model_id)
            factory = load_engine_class(
                entry.profile.adapter_path,
                self._allowed() if callable(self._allowed) else self._allowed,
            )
            extra: dict[str, Any] = {"trust": self.trust, "model_cache_dir": self._model_cache_dir}
            extra = {k: v for k, v in extra.items() if _takes(factory, k)}
            async with self._load_lock:
                engine = factory(entry.config, entry.profile, self._device, **extra)
                await anyio.to_thread.run_sync(engine.load, limiter=limiter)
        except SieError as exc:
            slot.state, slot.error = "failed", exc
        except Exception as exc:
            slot.state = "failed"
            slot.error = ModelLoadFailed(
                f"loading {entry.model_id!r} failed: {exc}", error_class="UNKNOWN", permanent=True
            )
        else:
            freeze_long_lived()  # the model lives until unloaded: out of GC walks (sie.gc_policy)
            on_batch = self._on_batch
            limiter.total_tokens = engine_slots(engine, self._device, self._engine_concurrency)
            batcher: TokenBudgetBatcher[Any, Any] = TokenBudgetBatcher(
                self._call_threads.wrap(self._run_batch(engine)),
                max_batch_tokens=entry.profile.max_batch_tokens,
                max_batch_requests=self._max_batch_requests,
                # an engine that runs one text per call gains nothing by waiting for company
                max_wait_s=(
                    self._max_batch_wait_s if getattr(engine, "gains_from_batching", True) else 0.0
                ),
                limiter=limiter,
                on_batch=(lambda n, c, s: on_batch(entry.model_id, n, c, s)) if on_batch else None,
                span_attributes={
                    "sie.model": entry.model_id,
                    "sie.adapter": entry.profile.adapter_path or "",
                },
            )
            stopped = anyio.Event()
            scope = await self._tg.start(self._run_batcher, batcher, stopped)
            size = memory_bytes(engine)
            slot.loaded = LoadedModel(entry, engine, batcher, limiter, scope, stopped, bytes=size)
            slot.state = "loaded"
            slot.last_used = time.monotonic()
            stats.loads += 1
            stats.attempts = 0
            stats.last_error = None
            log.info(
                "loaded %s in %.2fs (%.1f MB)", entry.model_id, time.monotonic() - t0, size / 1e6
            )
        finally:
            raw = slot.error
            if raw is not None:
                # the full message stays in the worker's log; clients see no paths of ours
                log.error("model %s failed to load: %s", entry.model_id, raw.message)
                keep = (entry.config.weights_path,) if entry.config.weights_path else ()
                slot.error = redact_error(raw, keep)
                slot.error.fields["attempts"] = stats.attempts
                stats.last_error = slot.error
            slot.ready.set()
            self._changed()
        if slot.error is None and self.memory_budget_bytes is not None:
            await self._make_room(0, keep=entry.model_id)  # the real size is known now

    async def _make_room(self, need: int, *, keep: str) -> None:
        """Evict least recently used idle, unpinned models until ``need`` more bytes fit."""
        budget = self.memory_budget_bytes
        if budget is None:
            return
        async with self._budget_lock:
            while self.loaded_bytes + need > budget:
                idle = [
                    (s.last_used, name)
                    for name, s in self._slots.items()
                    if name != keep
                    and name not in self.pinned
                    and s.state == "loaded"
                    and s.active == 0
                ]
                if not idle:
                    log.warning(
                        "memory budget %.1f MB exceeded (%.1f MB loaded, %.1f MB needed) and no "
                        "idle model can be evicted",
                        budget / 1e6,
                        self.loaded_bytes / 1e6,
                        need / 1e6,
                    )
                    return
                _, victim = min(idle)
                log.info("evicting %s (least recently used) for the memory budget", victim)
                await self.unload(victim, reason="memory")

    async def _idle_evictor(self, ttl_s: float) -> None:
        while True:
            await anyio.sleep(max(0.05, min(ttl_s / 2, 5.0)))
            now = time.monotonic()
            for name, s in list(self._slots.items()):
                if (
                    name not in self.pinned
                    and s.state == "loaded"
                    and s.active == 0
                    and now - s.last_used > ttl_s
                ):
                    log.info("evicting %s (idle %.0fs)", name, now - s.last_used)
                    await self.unload(name, reason="idle")

    @staticmethod
    async def _run_batcher(
        batcher: TokenBudgetBatcher[Any, Any],
        stopped: anyio.Event,
        *,
        task_status: anyio.abc.TaskStatus[anyio.CancelScope],
    ) -> None:
        try:
            with anyio.CancelScope() as scope:
                task_status.started(scope)
                await batcher.run()
        finally:
            stopped.set()

    async def unload(self, model_id: str, *, reason: str | None = None) -> None:
        """Unload ``model_id`` (``unloading`` meanwhile); ``reason`` counts an eviction."""
        slot = self._slots.get(model_id)
        if slot is None or slot.state == "unloading":
            return
        slot.state = "unloading"
        self._changed()
        try:
            if slot.loaded is not None:
                limiter = slot.loaded.limiter
                slot.loaded.scope.cancel()
                stopped = slot.loaded.stopped
                engine = slot.loaded.engine

                def release() -> None:
                    engine.unload()
                    gc.collect()  # torch frees a module's tensors when nothing refers to them

                slot.loaded = None
                with anyio.CancelScope(shield=True):
                    await stopped.wait()  # every engine call in flight has returned
                    await anyio.to_thread.run_sync(release, limiter=limiter)
                if reason is not None:
                    self._stats.setdefault(model_id, _Stats()).evictions += 1
                    if self._on_evict is not None:
                        self._on_evict(model_id, reason)
        finally:
            if self._slots.get(model_id) is slot:
                del self._slots[model_id]
            slot.gone.set()
            self._changed()


def _takes(factory: Any, keyword: str) -> bool:
    """Whether an engine factory accepts ``keyword`` (``trust``, ``model_cache_dir``)."""
    try:
        return keyword in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
