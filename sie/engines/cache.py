"""Loaded models on a worker: load on first use, one batcher per model, states.

States follow reference §1.9/§4.4: ``available`` → ``loading`` → ``loaded``;
a failed load is sticky (``failed`` with ``last_error``) until the config changes.
Concurrent first requests share one load. Loads run on the model's own
inference thread, so they never block the event loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from sie.core.errors import ModelLoadFailed, SieError
from sie.core.registry import ModelEntry
from sie.engines.base import Engine, load_engine_class
from sie.engines.batching import TokenBudgetBatcher

__all__ = ["LoadedModel", "ModelCache"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadedModel:
    entry: ModelEntry
    engine: Any  # an Engine with one or more task methods (sie.engines.base)
    batcher: TokenBudgetBatcher[Any, Any]
    limiter: anyio.CapacityLimiter
    scope: anyio.CancelScope
    loaded_at: float = field(default_factory=time.time)


@dataclass(slots=True)
class _Slot:
    state: str = "available"
    loaded: LoadedModel | None = None
    ready: anyio.Event = field(default_factory=anyio.Event)
    error: SieError | None = None
    config_key: Any = None


RunBatch = Callable[[Engine], Callable[[Hashable, Sequence[Any]], Sequence[Any]]]


class ModelCache:
    """Owns engines and their batchers. Run ``run()`` in a task group first.

    Args:
        allowed_modules: the worker bundle's adapter modules (what may be imported), or a
            callable returning them at load time (the bundle may arrive from the config
            service after the cache is built).
        run_batch: builds the batch function for an engine (see ``roles.worker``).
        device: torch device string, e.g. ``"cpu"``.
        max_batch_requests / max_batch_wait_s: batcher limits (reference §4.6).
    """

    def __init__(
        self,
        *,
        allowed_modules: Sequence[str] | Callable[[], Sequence[str]],
        run_batch: RunBatch,
        device: str = "cpu",
        max_batch_requests: int = 64,
        max_batch_wait_s: float = 0.010,
        on_batch: Callable[[str, int, int, float], Any] | None = None,
        on_change: Callable[[], Any] | None = None,
    ) -> None:
        self._allowed = allowed_modules
        self._run_batch = run_batch
        self._device = device
        self._max_batch_requests = max_batch_requests
        self._max_batch_wait_s = max_batch_wait_s
        self._on_batch = on_batch
        self._on_change = on_change
        self._slots: dict[str, _Slot] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._tg = None
            for slot in self._slots.values():
                if slot.loaded is not None:
                    slot.loaded.engine.unload()

    def statuses(self) -> list[dict[str, Any]]:
        """``[{name, state, last_error?}]`` for heartbeats and /v1/models."""
        out = []
        for name, slot in sorted(self._slots.items()):
            d: dict[str, Any] = {"name": name, "state": slot.state}
            if slot.error is not None:
                d["last_error"] = {
                    **slot.error.to_detail(),
                    "permanent": slot.error.fields.get("permanent", True),
                }
            out.append(d)
        return out

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    async def get(self, entry: ModelEntry) -> LoadedModel:
        """The loaded model for ``entry``, loading it on first use.

        Raises:
            ModelLoadFailed: the load failed (now or earlier, sticky for this config).
        """
        key = entry.load_key
        slot = self._slots.get(entry.model_id)
        if slot is not None and slot.config_key != key:
            await self.unload(entry.model_id)  # config changed: drop the old engine / failure
            slot = None
        if slot is None:
            assert self._tg is not None, "ModelCache.run() is not running"
            slot = self._slots[entry.model_id] = _Slot(state="loading", config_key=key)
            self._changed()
            # The load belongs to the cache, not to this caller: cancelling the caller
            # (an abandoned request) must not leave a half-loaded slot behind.
            self._tg.start_soon(self._load, entry, slot)
        await slot.ready.wait()
        if slot.loaded is None:
            assert slot.error is not None
            raise slot.error
        return slot.loaded

    async def _load(self, entry: ModelEntry, slot: _Slot) -> None:
        assert self._tg is not None
        limiter = anyio.CapacityLimiter(1)
        t0 = time.monotonic()
        try:
            factory = load_engine_class(
                entry.profile.adapter_path,
                self._allowed() if callable(self._allowed) else self._allowed,
            )
            engine = factory(entry.config, entry.profile, self._device)
            await anyio.to_thread.run_sync(engine.load, limiter=limiter)
        except SieError as exc:
            slot.state, slot.error = "failed", exc
        except Exception as exc:
            slot.state = "failed"
            slot.error = ModelLoadFailed(
                f"loading {entry.model_id!r} failed: {exc}", error_class="UNKNOWN", permanent=True
            )
        else:
            on_batch = self._on_batch
            batcher: TokenBudgetBatcher[Any, Any] = TokenBudgetBatcher(
                self._run_batch(engine),
                max_batch_tokens=entry.profile.max_batch_tokens,
                max_batch_requests=self._max_batch_requests,
                max_wait_s=self._max_batch_wait_s,
                limiter=limiter,
                on_batch=(lambda n, c, s: on_batch(entry.model_id, n, c, s)) if on_batch else None,
            )
            scope = await self._tg.start(self._run_batcher, batcher)
            slot.loaded = LoadedModel(entry, engine, batcher, limiter, scope)
            slot.state = "loaded"
            log.info("loaded %s in %.2fs", entry.model_id, time.monotonic() - t0)
        finally:
            slot.ready.set()
            self._changed()
        if slot.error is not None:
            log.error("model %s failed to load: %s", entry.model_id, slot.error.message)

    @staticmethod
    async def _run_batcher(
        batcher: TokenBudgetBatcher[Any, Any],
        *,
        task_status: anyio.abc.TaskStatus[anyio.CancelScope],
    ) -> None:
        with anyio.CancelScope() as scope:
            task_status.started(scope)
            await batcher.run()

    async def unload(self, model_id: str) -> None:
        slot = self._slots.pop(model_id, None)
        if slot is not None and slot.loaded is not None:
            slot.loaded.scope.cancel()
            await anyio.to_thread.run_sync(slot.loaded.engine.unload, limiter=slot.loaded.limiter)
        self._changed()
