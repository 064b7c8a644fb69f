"""Composition root: builds the bus, registry and requested roles, and runs them.

The only module that names concrete adapters (``MemoryBus``, ``NatsBus``).
Roles receive ports. Lifecycle (docs/architecture.md §1): roles start
in one task group; HTTP listeners start once their roles are running; on
shutdown the listeners drain in-flight requests (bounded by
``drain_timeout_s``), then the roles are cancelled. Unacknowledged work items
stay on the stream for redelivery.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field

import anyio
import anyio.abc
from starlette.applications import Starlette

from sie.control.authority import Publisher
from sie.control.seed import load_bundles, load_models
from sie.control.store import ConfigStore
from sie.control.sync import ConfigSync
from sie.core.errors import ConfigError, SieError
from sie.core.lane_catalog import LaneCatalog
from sie.core.registry import ModelRegistry
from sie.core.trust import ConfigTrust
from sie.gc_policy import freeze_long_lived
from sie.http.auth import AuthPolicy, audit_auth
from sie.http.config import build_config_app
from sie.http.gateway import build_gateway_app
from sie.http.limits import BodyBudget
from sie.http.server import ConnectionTimeouts, serve_app
from sie.http.worker import build_worker_app
from sie.roles.config import ConfigRole
from sie.roles.config_sync import build_config_sync
from sie.roles.gateway import GatewayRole
from sie.roles.gateway.admission import AdmissionGate, admission_config
from sie.roles.gateway.directory import WorkerDirectory
from sie.roles.gateway.pools import PoolManager
from sie.roles.trust import config_trust
from sie.roles.worker import WorkerRole
from sie.roles.worker.admission import PoolAdmission
from sie.roles.worker.models import build_model_cache
from sie.settings import ServeSettings, is_loopback
from sie.settings_views import (
    AdmissionSettings,
    BusSettings,
    ConfigRoleSettings,
    GatewaySettings,
    LimitsSettings,
    WorkerSettings,
)
from sie.telemetry import METRICS, Metrics
from sie.transport.base import Bus
from sie.transport.memory import MemoryBus
from sie.transport.payloads import FsspecPayloadStore, PayloadStore
from sie.transport.pools import MemoryPoolStore, PoolStore

__all__ = [
    "Container",
    "Running",
    "build_gateway_role",
    "build_payload_store",
    "build_registry",
    "build_worker_role",
    "open_config_role",
]

log = logging.getLogger(__name__)


def build_registry(settings: ServeSettings) -> ModelRegistry:
    """Load the seed: bundles first, then models (architecture §4 step 1).

    Raises:
        ConfigError: an unreadable or invalid seed file (named).
    """
    registry = ModelRegistry(dict(settings.default_profiles))
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
    """The bus named by ``--bus``: ``memory`` (one process) or ``nats`` (``SIE_NATS_URL``).

    Raises:
        ConfigError: ``nats`` without the ``nats`` extra installed.
    """
    if settings.bus == "memory":
        return MemoryBus()
    try:
        from sie.transport.nats import NatsBus
    except ImportError as exc:
        raise ConfigError(str(exc), field="bus") from exc
    return NatsBus(settings.nats_url, name=f"sie-{'-'.join(settings.roles)}")


def build_payload_store(settings: ServeSettings) -> PayloadStore:
    """Where work items over the bus's ``max_payload`` go (docs/api.md §12):
    ``SIE_PAYLOAD_STORE_URL``, else ``memory://`` for the one-process memory bus and a
    directory under the system temp dir for NATS (processes on one machine; workers on
    other machines need a shared URL such as ``s3://…``)."""
    url = settings.payload_store_url
    if not url:
        if settings.bus == "memory":
            url = "memory://sie-payloads"
        else:
            url = os.path.join(tempfile.gettempdir(), "sie-payloads")
    return FsspecPayloadStore(url)


def build_pool_store(settings: ServeSettings, bus: Bus) -> PoolStore:
    """Where pools are kept (docs/pools.md): ``SIE_POOL_STORE``, else a JetStream
    key-value bucket with the NATS bus (every gateway on the broker shares it) and this
    process's memory with the memory bus; ``kubernetes``: ConfigMaps in the pod's
    namespace (or ``SIE_POOL_STORE_NAMESPACE``), with its service account."""
    kind = settings.pool_store or ("nats" if settings.bus == "nats" else "memory")
    if kind == "memory":
        return MemoryPoolStore()
    if kind == "kubernetes":
        from sie.transport.k8s_pools import InClusterPoolStore

        return InClusterPoolStore(settings.pool_store_namespace)
    from sie.transport.nats import NatsBus
    from sie.transport.nats_kv import NatsKvPoolStore

    if not isinstance(bus, NatsBus):
        raise ConfigError("SIE_POOL_STORE=nats needs the NATS bus (--bus=nats)", field="pool_store")
    return NatsKvPoolStore(bus, replicas=settings.stream_replicas)


@dataclass
class Running:
    """What a started container exposes (ports are the real bound ports).

    ``registry`` is the gateway's registry when a gateway runs, else the worker's;
    each role converges its own registry through the bus and the config service.
    """

    registry: ModelRegistry | None
    bus: Bus
    gateway: GatewayRole | None = None
    worker: WorkerRole | None = None
    config: ConfigRole | None = None
    gateway_port: int | None = None
    config_port: int | None = None
    metrics_port: int | None = None  # a worker without a gateway: /metrics and probes
    config_url: str | None = None
    apps: dict[str, Starlette] = field(default_factory=dict)


def auth_policy(settings: ServeSettings) -> AuthPolicy:
    return AuthPolicy(
        mode=settings.effective_auth_mode,
        tokens=tuple(settings.inference_tokens()),
        admin_token=settings.admin(),
        exempt_operational=settings.auth_exempt_operational,
    )


def _local_url(host: str, port: int) -> str:
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _config_sync(
    registry: ModelRegistry,
    settings: ServeSettings,
    config_service_url: str | None,
    metrics: Metrics,
    role: str,
) -> ConfigSync:
    return build_config_sync(
        registry,
        settings.sync_view(),
        config_service_url=config_service_url,
        metrics=metrics,
        role=role,
    )


def build_gateway_role(
    bus: Bus,
    registry: ModelRegistry,
    settings: ServeSettings,
    *,
    config_service_url: str | None = None,
    metrics: Metrics = METRICS,
    payloads: PayloadStore | None = None,
    pool_store: PoolStore | None = None,
) -> GatewayRole:
    """A gateway role with its collaborators built from ``settings``' views: config
    sync, the admission gate and the worker directory (docs/architecture.md §1). No I/O."""
    gateway = settings.view(GatewaySettings)
    directory = WorkerDirectory(gateway.heartbeat_interval_s)
    return GatewayRole(
        bus,
        registry,
        gateway,
        streams=settings.view(BusSettings),
        limits=settings.view(LimitsSettings),
        sync=_config_sync(registry, settings, config_service_url, metrics, "gateway"),
        admission=AdmissionGate(admission_config(settings.view(AdmissionSettings)), metrics),
        directory=directory,
        payloads=payloads if payloads is not None else build_payload_store(settings),
        pools=PoolManager(
            pool_store if pool_store is not None else build_pool_store(settings, bus),
            directory,
            registry,
            static_queue_pools=gateway.static_queue_pools,
            catalog=LaneCatalog(
                configured_gpus=frozenset(gateway.configured_gpus),
                gpu_aliases=dict(gateway.gpu_aliases),
                physical_lanes=frozenset(gateway.configured_physical_lanes),
            ),
            default_profile=gateway.machine_profile,
            max_pools=gateway.max_pools,
        ),
        metrics=metrics,
    )


def build_worker_role(
    bus: Bus,
    registry: ModelRegistry,
    settings: ServeSettings,
    metrics: Metrics = METRICS,
    *,
    config_service_url: str | None = None,
    trust: ConfigTrust | None = None,
    payloads: PayloadStore | None = None,
    pool_store: PoolStore | None = None,
) -> WorkerRole:
    """A worker role with its collaborators built from ``settings``' views: config
    sync and the model cache; ``trust`` defaults to the policy ``settings`` describe
    (``sie.roles.trust.config_trust``). No I/O."""
    worker = settings.view(WorkerSettings)
    policy = trust if trust is not None else config_trust(settings)
    models = build_model_cache(registry, worker, metrics, policy)
    return WorkerRole(
        bus,
        registry,
        worker,
        metrics,
        streams=settings.view(BusSettings),
        sync=_config_sync(registry, settings, config_service_url, metrics, "worker"),
        models=models,
        trust=policy,
        payloads=payloads if payloads is not None else build_payload_store(settings),
        pools=PoolAdmission(
            pool_store if pool_store is not None else build_pool_store(settings, bus),
            worker,
            registry,
            models,
        ),
    )


def open_config_role(
    settings: ServeSettings,
    publisher: Publisher | None,
    metrics: Metrics = METRICS,
    trust: ConfigTrust | None = None,
) -> ConfigRole:
    """The config role over the store ``SIE_CONFIG_STORE_DIR`` names (if any), with
    the seed loaded and the store replayed as ``ConfigRole.open`` says.

    Raises:
        SieError: the store cannot be read.
    """
    store = ConfigStore(settings.config_store_dir) if settings.config_store_dir else None
    return ConfigRole.open(
        settings.view(ConfigRoleSettings),
        publisher,
        metrics,
        store=store,
        trust=trust if trust is not None else config_trust(settings),
    )


class Container:
    """Builds and runs ``settings.roles`` in one process.

    Each role owns its registry (as when the roles run as separate processes): the
    config role loads the authoritative one; gateway and worker load the filesystem
    seed (when ``--models-dir``/``--bundles-dir`` are given) and then converge on the
    authority through deltas and the epoch poller. With the config role in the same
    process and no ``SIE_CONFIG_SERVICE_URL``, they use the local config port.
    """

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
        self._registry = registry
        self.metrics = metrics
        policy = auth_policy(settings)
        for finding in audit_auth(policy):
            (log.error if finding.startswith("error") else log.warning)("auth: %s", finding)
        syncs = {"gateway", "worker"} & set(settings.roles)
        if syncs and settings.inference_tokens() and not settings.admin():
            log.warning(
                "SIE_AUTH_TOKEN is set but SIE_ADMIN_TOKEN is not: the config role refuses "
                "/v1/configs/export without the admin token, so %s cannot bootstrap from it",
                " and ".join(sorted(syncs)),
            )
        if settings.auth_mode == "none" and not is_loopback(settings.host):
            log.warning(
                "auth is off (SIE_AUTH_MODE=none) on %s: anyone who reaches this address "
                "can run inference, read configs and write them",
                settings.host,
            )
        if settings.config_trust_any_producer:
            log.warning("SIE_NATS_CONFIG_TRUST_ANY_PRODUCER is on: any config delta is applied")
        # what config writers may ask of workers: checked at write (config role) and at
        # every load (worker); docs/security.md "Trust model"
        self.trust = config_trust(settings) if {"config", "worker"} & set(settings.roles) else None
        self.payloads = build_payload_store(settings)  # shared by gateway and worker
        self.pool_store = build_pool_store(settings, self.bus)  # likewise

    def _seed_registry(self) -> ModelRegistry:
        return self._registry if self._registry is not None else build_registry(self.settings)

    async def run(
        self,
        shutdown: anyio.Event,
        *,
        task_status: anyio.abc.TaskStatus[Running] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until ``shutdown`` is set, then drain and stop."""
        s = self.settings
        policy = auth_policy(s)
        running = Running(None, self.bus)
        budget = BodyBudget(s.max_inflight_body_bytes)  # one per process (docs/security.md)
        # the config listener outlives the gateway's drain: co-located pollers use it
        config_stop = anyio.Event()
        async with self.bus, anyio.create_task_group() as roles:
            async with anyio.create_task_group() as http:
                # config first: co-located gateway/worker sync from its real port
                if "config" in s.roles:
                    running.config = open_config_role(s, self.bus, self.metrics, self.trust)
                    await roles.start(running.config.run)
                    capp = build_config_app(
                        running.config, self.metrics, policy, budget, s.http_body_timeout_s
                    )
                    running.apps["config"] = capp
                    running.config_port = await http.start(
                        _serve,
                        capp,
                        s.host,
                        s.config_port,
                        config_stop,
                        "config",
                        s.drain_timeout_s,
                        ConnectionTimeouts(s.http_header_timeout_s, s.http_send_timeout_s),
                    )
                running.config_url = s.config_service_url or (
                    _local_url(s.host, running.config_port) if running.config_port else None
                )
                # the gateway subscribes before the worker, so it hears the first heartbeat
                if "gateway" in s.roles:
                    running.gateway = build_gateway_role(
                        self.bus,
                        self._seed_registry(),
                        s,
                        config_service_url=running.config_url,
                        metrics=self.metrics,
                        payloads=self.payloads,
                        pool_store=self.pool_store,
                    )
                    await roles.start(running.gateway.run)
                if "worker" in s.roles:
                    running.worker = build_worker_role(
                        self.bus,
                        self._seed_registry(),
                        s,
                        self.metrics,
                        config_service_url=running.config_url,
                        trust=self.trust,
                        payloads=self.payloads,
                        pool_store=self.pool_store,
                    )
                    await roles.start(running.worker.run)
                if running.gateway is not None:
                    app = build_gateway_app(running.gateway, self.metrics, policy, budget)
                    running.apps["gateway"] = app
                    running.gateway_port = await http.start(
                        _serve,
                        app,
                        s.host,
                        s.port,
                        shutdown,
                        "gateway",
                        s.drain_timeout_s,
                        ConnectionTimeouts(s.http_header_timeout_s, s.http_send_timeout_s),
                        config_stop,
                    )
                elif running.worker is not None:  # its series need a port of their own
                    worker = running.worker
                    wapp = build_worker_app(self.metrics, lambda: worker.ready, policy)
                    running.apps["worker"] = wapp
                    running.metrics_port = await http.start(
                        _serve,
                        wapp,
                        s.host,
                        s.metrics_port,
                        shutdown,
                        "worker",
                        s.drain_timeout_s,
                        ConnectionTimeouts(s.http_header_timeout_s, s.http_send_timeout_s),
                    )
                running.registry = (
                    running.gateway.registry
                    if running.gateway
                    else running.worker.registry
                    if running.worker
                    else running.config.registry
                    if running.config
                    else None
                )
                freeze_long_lived()  # imports and seed state live as long as the process
                task_status.started(running)
                await shutdown.wait()
                for app in running.apps.values():
                    app.state.draining = True
                if running.gateway is None:
                    config_stop.set()
                else:  # cancelled with the roles once the drain is over
                    roles.start_soon(_give_up_before_drain_ends, running.gateway, s.drain_timeout_s)
            roles.cancel_scope.cancel()


async def _give_up_before_drain_ends(gateway: GatewayRole, drain_s: float) -> None:
    """Near the end of the drain, requests still waiting for workers answer 503
    ``SHUTTING_DOWN`` while the listener can still send it (at the drain bound the
    server cancels them, and a client would see a bare 500)."""
    await anyio.sleep(max(0.0, drain_s - 1.0) if drain_s >= 2.0 else drain_s / 2)
    gateway.give_up_waiting()


async def _serve(
    app: Starlette,
    host: str,
    port: int,
    shutdown: anyio.Event,
    name: str,
    drain_s: float,
    timeouts: ConnectionTimeouts,
    stopped: anyio.Event | None = None,
    *,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` until ``shutdown`` and its drain end; then set ``stopped``."""
    try:
        await serve_app(
            app,
            host,
            port,
            shutdown,
            name=name,
            graceful_timeout_s=drain_s,
            header_timeout_s=timeouts.header_s,
            send_timeout_s=timeouts.send_s,
            task_status=task_status,
        )
    finally:
        if stopped is not None:
            stopped.set()
