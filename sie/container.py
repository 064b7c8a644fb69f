"""Composition root: builds the bus, registry and requested roles, and runs them.

The only module that names concrete adapters (``MemoryBus``; the NATS adapter
arrives with its issue). Roles receive ports. Lifecycle (DESIGN.md): roles start
in one task group; HTTP listeners start once their roles are running; on
shutdown the listeners drain in-flight requests (bounded by
``drain_timeout_s``), then the roles are cancelled. Unacknowledged work items
stay on the stream for redelivery.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import anyio
import anyio.abc
from starlette.applications import Starlette

from sie.control.seed import load_bundles, load_models
from sie.core.errors import ConfigError, SieError
from sie.core.registry import ModelRegistry
from sie.http.config import build_config_app
from sie.http.gateway import build_gateway_app
from sie.http.server import serve_app
from sie.roles.config import ConfigRole
from sie.roles.gateway import GatewayRole
from sie.roles.worker import WorkerRole
from sie.settings import ServeSettings
from sie.telemetry import METRICS, Metrics
from sie.transport.base import Bus
from sie.transport.memory import MemoryBus

__all__ = ["Container", "Running", "build_registry"]

log = logging.getLogger(__name__)


def build_registry(settings: ServeSettings) -> ModelRegistry:
    """Load the seed: bundles first, then models (architecture §4 step 1).

    Raises:
        ConfigError: an unreadable or invalid seed file (named).
    """
    registry = ModelRegistry()
    if settings.bundles_dir:
        registry.install_bundles(load_bundles(settings.bundles_dir))
    if settings.models_dir:
        for cfg in load_models(settings.models_dir):
            try:
                registry.add_model_config(cfg)
            except SieError as exc:
                log.warning("seed model %s is not routable: %s", cfg.sie_id, exc.message)
    return registry


def build_bus(settings: ServeSettings) -> Bus:
    if settings.bus == "memory":
        return MemoryBus()
    raise ConfigError(
        "--bus=nats: the NATS adapter is not part of this build yet; use --bus=memory", field="bus"
    )


@dataclass
class Running:
    """What a started container exposes (ports are the real bound ports)."""

    registry: ModelRegistry
    bus: Bus
    gateway: GatewayRole | None = None
    worker: WorkerRole | None = None
    config: ConfigRole | None = None
    gateway_port: int | None = None
    config_port: int | None = None
    apps: dict[str, Starlette] = field(default_factory=dict)


class Container:
    """Builds and runs ``settings.roles`` in one process."""

    def __init__(
        self,
        settings: ServeSettings,
        *,
        bus: Bus | None = None,
        registry: ModelRegistry | None = None,
        metrics: Metrics = METRICS,
    ) -> None:
        self.settings = settings
        self.bus = bus if bus is not None else build_bus(settings)
        self.registry = registry if registry is not None else build_registry(settings)
        self.metrics = metrics

    async def run(
        self,
        shutdown: anyio.Event,
        *,
        task_status: anyio.abc.TaskStatus[Running] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until ``shutdown`` is set, then drain and stop."""
        s = self.settings
        running = Running(self.registry, self.bus)
        async with self.bus, anyio.create_task_group() as roles:
            # the gateway subscribes first, so it hears the worker's first heartbeat
            if "gateway" in s.roles:
                running.gateway = GatewayRole(self.bus, self.registry, s)
                await roles.start(running.gateway.run)
            if "worker" in s.roles:
                running.worker = WorkerRole(self.bus, self.registry, s, self.metrics)
                await roles.start(running.worker.run)
            if "config" in s.roles:
                running.config = ConfigRole(self.registry)
                await roles.start(running.config.run)
            async with anyio.create_task_group() as http:
                if running.gateway is not None:
                    app = build_gateway_app(running.gateway, self.metrics)
                    running.apps["gateway"] = app
                    running.gateway_port = await http.start(
                        _serve, app, s.host, s.port, shutdown, "gateway", s.drain_timeout_s
                    )
                if running.config is not None:
                    capp = build_config_app(running.config)
                    running.apps["config"] = capp
                    running.config_port = await http.start(
                        _serve, capp, s.host, s.config_port, shutdown, "config", s.drain_timeout_s
                    )
                task_status.started(running)
                await shutdown.wait()
                for app in running.apps.values():
                    app.state.draining = True
            roles.cancel_scope.cancel()


async def _serve(
    app: Starlette,
    host: str,
    port: int,
    shutdown: anyio.Event,
    name: str,
    drain_s: float,
    *,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    await serve_app(
        app, host, port, shutdown, name=name, graceful_timeout_s=drain_s, task_status=task_status
    )
