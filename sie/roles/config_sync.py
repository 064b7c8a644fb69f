"""Config convergence wiring shared by the gateway and worker roles (architecture §4).

``build_config_sync`` makes a ``ConfigSync`` from settings; ``run_config_sync``
subscribes to the delta subject (``sie.config.models._all`` for gateways,
``sie.config.models.{bundle}`` for workers), then runs bootstrap + poller and
applies deltas until cancelled.
"""

from __future__ import annotations

import anyio
import anyio.abc

from sie.control.sync import ConfigSync
from sie.core.epoch import ConfigEpoch
from sie.core.registry import ModelRegistry
from sie.settings_views import SyncSettings
from sie.telemetry import Metrics
from sie.transport.base import Bus

__all__ = ["build_config_sync", "run_config_sync"]


def build_config_sync(
    registry: ModelRegistry,
    settings: SyncSettings,
    *,
    config_service_url: str | None,
    metrics: Metrics,
    role: str,
) -> ConfigSync:
    """A ``ConfigSync`` for ``role`` (``gateway`` / ``worker``) over ``registry``: the
    export poller reads ``config_service_url`` (a co-located config role's real
    address) or ``SIE_CONFIG_SERVICE_URL``, presenting ``settings.read_token``. No I/O."""
    token = settings.read_token
    return ConfigSync(
        registry,
        ConfigEpoch(),
        base_url=config_service_url or settings.config_service_url,
        admin_token=token.get_secret_value() if token is not None else None,
        poll_interval_s=settings.config_poll_interval_s,
        trusted_producers=settings.config_trusted_producers,
        trust_any_producer=settings.config_trust_any_producer,
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
