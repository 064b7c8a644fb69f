"""The worker's model cache as its settings describe it (docs/architecture.md §16.2):
built by the container and injected into ``WorkerRole``, which listens to its changes.

``build_model_cache`` wires the engine runtime (``sie.engines.runtime.cache``) to the
worker's bundle (only its adapter modules may be imported), its memory budget (bytes,
or a fraction of the device's memory), batching bounds, the operator's trust policy
and the batch and eviction metrics. No I/O.
"""

from __future__ import annotations

from sie.core.registry import ModelRegistry
from sie.core.trust import ConfigTrust
from sie.engines.runtime.cache import ModelCache, device_memory_bytes
from sie.engines.weights import weights_bytes
from sie.roles.worker.tasks import engine_batch_fn
from sie.settings_views import WorkerSettings
from sie.telemetry import Metrics

__all__ = ["build_model_cache", "bundle_adapters"]


def bundle_adapters(registry: ModelRegistry, bundle: str) -> tuple[str, ...]:
    """The adapter modules ``bundle`` lists in ``registry`` now (``()`` while unknown)."""
    found = registry.snapshot.bundles.get(bundle)
    return tuple(found.adapters) if found else ()


def build_model_cache(
    registry: ModelRegistry, settings: WorkerSettings, metrics: Metrics, trust: ConfigTrust
) -> ModelCache:
    """The ``ModelCache`` of a worker with ``settings`` serving ``registry``'s bundle."""

    def on_batch(model: str, n: int, tokens: int, seconds: float) -> None:
        metrics.batch_size.labels(model).observe(n)
        metrics.batch_inference.labels(model).observe(seconds)
        metrics.tokens.labels(model).inc(tokens)

    budget = settings.memory_budget_bytes or int(
        settings.memory_budget_fraction * device_memory_bytes(settings.device)
    )
    return ModelCache(
        allowed_modules=lambda: bundle_adapters(registry, settings.bundle),
        run_batch=engine_batch_fn,
        device=settings.device,
        max_batch_requests=settings.max_batch_requests,
        max_batch_wait_s=settings.max_batch_wait_ms / 1000.0,
        engine_concurrency=settings.engine_concurrency,
        on_batch=on_batch,
        memory_budget_bytes=budget,
        idle_evict_s=settings.idle_evict_s,
        pinned=settings.preload,
        estimate_bytes=lambda entry: weights_bytes(entry.config),
        on_evict=lambda model, reason: metrics.evictions.labels(model, reason).inc(),
        trust=trust,
        model_cache_dir=settings.model_cache_dir,
    )
