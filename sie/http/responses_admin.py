"""Response bodies of the operational routes — error envelopes, health, cluster status,
pools and the config surfaces — as pydantic models for ``sie.http.openapi``
(docs/api.md §7, §8, §11, §13; docs/pools.md). See ``sie.http.responses`` for the
conventions (required = always sent; extra keys allowed).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, RootModel

from sie.http.responses import Reply

__all__ = [
    "AssignedWorker",
    "BundleAck",
    "BundleList",
    "BundleRow",
    "ClusterStatus",
    "ConfigEpoch",
    "ConfigErrorDetail",
    "ConfigErrorEnvelope",
    "ConfigExport",
    "ConfigModelList",
    "ConfigModelRow",
    "ConfigWriteReply",
    "ErrorDetail",
    "ExportedModel",
    "GatewayHealth",
    "LookupErrorEnvelope",
    "ModelAckStatus",
    "ModelNotFoundReply",
    "OpenAIError",
    "OpenAIErrorEnvelope",
    "PoolDeleted",
    "PoolInfo",
    "PoolList",
    "PoolSpecInfo",
    "PoolStatus",
    "ProbeStatus",
    "ResolveReply",
    "SieClientErrorEnvelope",
    "SieServerErrorEnvelope",
]


# -- error envelopes (sie.http.errors; docs/api.md §11) ------------------------------------


class ErrorDetail(Reply):
    """The error object of every SIE envelope: a stable ``code``, a message naming the
    field at fault, and structured detail (``field``, ``errors``, ``retry_after`` ...)."""

    code: str = Field(description="stable machine-readable code, e.g. INVALID_INPUT")
    message: str
    field: str | None = None


class SieClientErrorEnvelope(Reply):
    """SIE-native 4xx: ``{"detail": {...}}``."""

    detail: ErrorDetail


class SieServerErrorEnvelope(Reply):
    """SIE-native 5xx: ``{"error": {...}}``, with ``X-SIE-Error-Code`` and, for retryable
    codes, ``Retry-After``."""

    error: ErrorDetail


class OpenAIError(Reply):
    message: str
    type: str = Field(description="invalid_request_error (4xx) or server_error (5xx)")
    param: str | None = Field(description="the request field at fault, when known")
    code: str = Field(description="the SIE code in lowercase, e.g. model_not_found")


class OpenAIErrorEnvelope(Reply):
    """The OpenAI envelope of ``/v1/embeddings`` and the generation routes."""

    error: OpenAIError


class LookupErrorEnvelope(Reply):
    """A model lookup's 404 (``GET /v1/models/{model}``): OpenAI's envelope, with the
    closest ids in ``suggestions``, beside SIE's ``detail``."""

    error: OpenAIError
    detail: ErrorDetail


class ModelNotFoundReply(RootModel[LookupErrorEnvelope | SieClientErrorEnvelope]):
    """``GET /v1/models/{model}``'s 404: the lookup's envelope, or SIE's plain one when
    the path names no route at all (an id with a line break)."""


class ConfigErrorDetail(ErrorDetail):
    error: str = Field(description="the sie-config slug: the code in lowercase")


class ConfigErrorEnvelope(Reply):
    """The config role's envelope, every status: ``{"detail": {code, error, message}}``."""

    detail: ConfigErrorDetail


# -- probes, health, cluster status -------------------------------------------------------


class ProbeStatus(Reply):
    """The config role's probes (``ok`` / ``ready``)."""

    status: str


class ClusterCapacity(Reply):
    worker_count: int
    gpu_count: int
    total_qps: float
    models_loaded: int


class HealthWorker(Reply):
    worker_id: str
    ready: bool
    pool: str
    machine_profile: str
    bundle: str
    bundle_config_hash: str
    models: list[dict[str, Any]]
    last_heartbeat_age_s: float


class HealthModel(Reply):
    name: str
    states: dict[str, str]
    workers: list[str]


class GatewayHealth(Reply):
    """``GET /health`` (docs/api.md §7): live workers, their models, and the capacity
    fields the SDK's ``get_capacity`` reads."""

    status: Literal["healthy", "degraded"]
    type: Literal["gateway"]
    version: str
    router_id: str
    uptime_s: float
    configured_gpu_types: list[str]
    live_gpu_types: list[str]
    cluster: ClusterCapacity
    workers: list[HealthWorker]
    models: list[HealthModel]


class StatusWorker(Reply):
    worker_id: str
    pool: str
    machine_profile: str
    bundle: str
    bundle_config_hash: str
    ready: bool
    healthy: bool
    status: Literal["ready", "starting", "lost"]
    loaded_models: list[str]
    models: list[dict[str, Any]]
    queue_depth: int | None
    running: int | None
    last_seen_s: float


class StatusModel(Reply):
    model_id: str
    state: str
    pool: str | None
    bundles: list[str]
    loaded_on: int
    workers: list[dict[str, Any]]
    last_error: dict[str, Any] | None


class StatusLane(Reply):
    pool: str
    machine_profile: str
    bundle: str
    workers: int
    ready_workers: int
    in_flight: int
    pending_demand: int


class ClusterCapacityFields(Reply):
    configured_gpu_types: list[str]
    live_gpu_types: list[str]
    cluster: ClusterCapacity


# -- pools (docs/pools.md) ----------------------------------------------------------------


class PoolSpecInfo(Reply):
    """A pool's spec as stored (names lowercase); the ``default`` pool shows only
    ``name``, ``gpus`` and ``queue_pool``."""

    name: str
    gpus: dict[str, int]
    queue_pool: str
    gpu_caps: dict[str, int] | None = None
    bundle: str | None = None
    ttl_seconds: int | None = None
    minimum_worker_count: int | None = None
    pinned_models: list[str] | None = None


class AssignedWorker(Reply):
    name: str
    gpu: str = Field(description="the worker's machine profile")
    bundle: str


class PoolStatus(Reply):
    state: Literal["pending", "active", "expired"]
    assigned_workers: list[AssignedWorker]
    created_at: float | None = Field(description="epoch seconds; null for default")
    last_renewed: float | None
    expires_at: float | None = Field(description="null: no lease (lasts until deleted)")


class PoolInfo(Reply):
    spec: PoolSpecInfo
    status: PoolStatus


class PoolList(Reply):
    pools: list[PoolInfo]


class PoolDeleted(Reply):
    name: str
    deleted: Literal[True]


class ClusterStatus(Reply):
    """``GET /v1/cluster/status`` and each ``/ws/cluster-status`` message (docs/api.md §13)."""

    generated_at: float
    version: str
    router_id: str
    uptime_s: float
    workers: list[StatusWorker]
    models: list[StatusModel]
    pools: list[PoolInfo]
    lanes: list[StatusLane]
    capacity: ClusterCapacityFields


# -- config surfaces (docs/api.md §8) ----------------------------------------------------


class ConfigModelRow(Reply):
    model_id: str
    profiles: list[str]
    source: str = Field(description="filesystem (the models dir) or api (written at runtime)")


class ConfigModelList(Reply):
    models: list[ConfigModelRow]


class BundleRow(Reply):
    bundle_id: str
    priority: int
    adapter_count: int
    source: str
    connected_workers: int | None = Field(default=None, description="gateway only")


class BundleList(Reply):
    bundles: list[BundleRow]


class ResolveReply(Reply):
    model: str
    resolved_bundle: str
    compatible_bundles: list[str]
    profiles: list[str]


class BundleAck(Reply):
    bundle_id: str
    pool: str
    expected_bundle_config_hash: str
    total_eligible_workers: int
    acked_workers: list[str]
    pending_workers: list[str]
    acked: bool


class ModelAckStatus(Reply):
    """A gateway's ``GET /v1/configs/models/{id}/status``: which workers run the
    model's current config (architecture §6)."""

    model_id: str
    config_epoch: int
    all_bundles_acked: bool
    no_bundles: bool
    bundles: list[BundleAck]
    source: str


class ConfigWriteReply(Reply):
    """``POST /v1/configs/models``: 201 when profiles were created, 200 for a no-op
    replay; ``epoch`` is the config epoch the write produced."""

    model_id: str
    created_profiles: list[str]
    existing_profiles_skipped: list[str]
    warnings: list[str]
    routable_bundles_by_profile: dict[str, list[str]]
    router_id: str
    epoch: int


class ConfigEpoch(Reply):
    epoch: int
    bundles_hash: str
    bundle_config_hashes_hash: str


class ExportedModel(Reply):
    model_id: str
    model_config_: dict[str, Any] = Field(alias="model_config")
    raw_yaml: str
    affected_bundles: list[str]
    source: str


class ConfigExport(Reply):
    """``GET /v1/configs/export`` (admin): the authoritative snapshot."""

    snapshot_version: int
    epoch: int
    generated_at: str
    bundles_hash: str
    bundle_config_hashes_hash: str
    models: list[ExportedModel]
