"""Per-concern views of ``ServeSettings`` (docs/configuration.md; docs/architecture.md
"Where things go").

``ServeSettings`` stays the one registry of ``SIE_*`` names, parsed once at the edge.
Each role and collaborator receives only the view of its concern: frozen sub-models
whose fields are a subset of ``ServeSettings``' (same names, same validated values),
built by ``ServeSettings.view(cls)``. A field may appear in more than one view (both
the gateway and the worker know the heartbeat interval).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, SecretStr

__all__ = [
    "AdmissionSettings",
    "AuthSettings",
    "BusSettings",
    "ClientSettings",
    "ConfigRoleSettings",
    "GatewaySettings",
    "LimitsSettings",
    "SettingsView",
    "SyncSettings",
    "WorkerSettings",
]


class SettingsView(BaseModel):
    """Base of every view: frozen, and no field that ``ServeSettings`` lacks."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class BusSettings(SettingsView):
    """The bus and its work streams (architecture §8.2): which adapter, where, and the
    stream limits every publisher and consumer must agree on."""

    bus: Literal["memory", "nats"]
    nats_url: str
    stream_max_age_s: float
    stream_max_msgs: int
    stream_storage: Literal["memory", "file"]
    stream_replicas: int
    max_stream_pending: int
    ack_wait_s: float
    max_deliver: int
    payload_store_url: str


class LimitsSettings(SettingsView):
    """What one request may cost the gateway (docs/security.md "Limits")."""

    max_body_bytes: int
    max_generate_body_bytes: int
    max_items_per_request: int
    max_text_chars: int
    max_inflight_body_bytes: int
    http_header_timeout_s: float
    http_body_timeout_s: float
    http_send_timeout_s: float
    max_large_body_reads: int
    max_response_bytes: int
    max_extract_chars: int


class AuthSettings(SettingsView):
    """Who may call which route (docs/security.md "Trust model")."""

    auth_mode: Literal["none", "token", "static"] | None
    auth_token: SecretStr | None
    auth_tokens: tuple[SecretStr, ...]
    admin_token: SecretStr | None
    auth_exempt_operational: bool


class AdmissionSettings(SettingsView):
    """The engine-state admission gate for generation (admission-gate.md)."""

    admission_kv_threshold: float
    admission_max_inflight: int | None
    admission_max_park_s: float
    admission_observe_models: tuple[str, ...]
    admission_poll_interval_s: float
    admission_keepalive_s: float


class ClientSettings(SettingsView):
    """What the SDK and the ``sie`` client commands read (docs/sdk.md "Settings"): where
    the gateway and the config role are, and the tokens to present (the server's own
    variables). Built by ``sie.settings.client_settings``."""

    gateway_url: str = "http://127.0.0.1:8080"
    config_service_url: str | None = None
    auth_token: SecretStr | None = None
    auth_tokens: tuple[SecretStr, ...] = ()
    admin_token: SecretStr | None = None

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], env_vars: Mapping[str, str], **overrides: object
    ) -> ClientSettings:
        """Only the client's variables of ``env`` (``env_vars``: name → field), then
        ``overrides`` where not None: a server's other settings never stop a client."""
        values: dict[str, object] = {
            f: env[k] for k, f in env_vars.items() if f in cls.model_fields and env.get(k, "")
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        tokens = values.get("auth_tokens")
        if isinstance(tokens, str):
            values["auth_tokens"] = tuple(t.strip() for t in tokens.split(",") if t.strip())
        return cls.model_validate(values)

    def inference_token(self) -> str | None:
        """``SIE_AUTH_TOKEN``, else the first of ``SIE_AUTH_TOKENS``, else None."""
        for token in (self.auth_token, *self.auth_tokens):
            if token is not None and token.get_secret_value().strip():
                return token.get_secret_value().strip()
        return None

    def admin_token_value(self) -> str | None:
        """``SIE_ADMIN_TOKEN`` (pool and config writes), else None."""
        if self.admin_token is None or not self.admin_token.get_secret_value().strip():
            return None
        return self.admin_token.get_secret_value().strip()


class SyncSettings(SettingsView):
    """How a gateway or worker converges on the config authority (architecture §4).
    ``read_token``: what the export poller presents (the admin token, else an
    inference token), resolved by ``ServeSettings.sync``."""

    config_service_url: str | None
    config_poll_interval_s: float
    config_trusted_producers: tuple[str, ...]
    config_trust_any_producer: bool
    read_token: SecretStr | None = None


class GatewaySettings(SettingsView):
    """The gateway role's own settings (architecture §2, §16.3)."""

    router_id: str
    machine_profile: str
    request_timeout_s: float
    heartbeat_interval_s: float
    max_lane_in_flight_items: int
    lane_backpressure_enforce: bool
    request_window_items: int
    static_queue_pools: tuple[str, ...]
    configured_gpus: tuple[str, ...]
    gpu_aliases: tuple[tuple[str, str], ...]
    configured_physical_lanes: tuple[tuple[str, str, str], ...]
    pool_store: Literal["memory", "nats", "kubernetes"] | None
    pool_store_namespace: str | None
    direct_fallback_s: float
    max_pools: int
    access_log_sample: float
    default_embed_model: str | None
    default_sparse_model: str | None
    default_rerank_model: str | None


class WorkerSettings(SettingsView):
    """The worker role's own settings: its lane, batching, memory and heartbeats
    (architecture §8, §16.2)."""

    worker_id: str
    pool: str
    machine_profile: str
    bundle: str
    device: str
    preload: tuple[str, ...]
    max_batch_requests: int
    max_batch_wait_ms: float
    max_inflight_items: int
    engine_concurrency: int
    memory_budget_bytes: int | None
    memory_budget_fraction: float
    idle_evict_s: float | None
    heartbeat_interval_s: float
    admission_poll_interval_s: float
    model_cache_dir: str
    model_load_wait_s: float
    pool_poll_s: float


class ConfigRoleSettings(SettingsView):
    """The config authority's settings: its store, seeds and bounds (architecture §3, §9)."""

    config_store_dir: str | None
    config_restore: bool
    config_producer_id: str
    config_max_models: int
    models_dir: str | None
    bundles_dir: str | None
