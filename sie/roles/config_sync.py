"""Config convergence wiring shared by the gateway and worker roles (architecture §4).

``build_config_sync`` makes a ``ConfigSync`` from settings; ``run_config_sync``
subscribes to the delta subject (``sie.config.models._all`` for gateways,
``sie.config.models.{bundle}`` for workers), then runs bootstrap + poller and
applies deltas until cancelled.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.abc

from sie.control.sync import ConfigSync
from sie.core.epoch import ConfigEpoch
from sie.core.registry import ModelRegistry
from sie.settings import ServeSettings
from sie.telemetry import Metrics
from sie.transport.base import Bus

__all__ = ["build_config_sync", "run_config_sync"]


def build_config_sync(
    registry: ModelRegistry,
    settings: ServeSettings,
    *,
    config_service_url: str | None,
    metrics: Metrics,
    role: str,
    on_change: Callable[[], None] | None = None,
) -> ConfigSync:
    return ConfigSync(
        registry,
        ConfigEpoch(),
        base_url=config_service_url or settings.config_service_url,
        # export is admin-only; without an admin token the inference token still reads
        admin_token=settings.admin() or next(iter(settings.inference_tokens()), None),
        poll_interval_s=settings.config_poll_interval_s,
        trusted_producers=settings.config_trusted_producers,
        trust_any_producer=settings.config_trust_any_producer,
        on_change=on_change,
        metrics=metrics,
        role=role,
    )


async def run_config_sync(
    bus: Bus,
    sync: ConfigSync,
    subject: str,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Subscribe to ``subject``, signal started, then sync until cancelled."""
    deltas = await bus.subscribe(subject)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(sync.run)
            task_status.started()
            async for msg in deltas:  # the YAML parse runs in a thread, off this loop
                await sync.handle_delta_async(msg.data)
    finally:
        with anyio.CancelScope(shield=True):
            await deltas.unsubscribe()
