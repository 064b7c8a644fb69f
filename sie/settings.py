"""Frozen settings, built once at the edge (the CLI) from flags and ``SIE_*`` env vars.

The single registry of SIE environment variables: ``ENV_VARS`` (``sie.settings_env``,
re-exported here) maps each variable to its setting. Nothing in SIE reads ``os.environ`` at import time.
Units are in the names (``_s`` seconds, ``_bytes``).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from sie.settings_env import ENV_VARS
from sie.settings_views import ClientSettings, SettingsView, SyncSettings

__all__ = ["AUTH_MODES", "ENV_VARS", "ROLES", "ServeSettings", "client_settings", "is_loopback"]

V = TypeVar("V", bound=SettingsView)

ROLES = ("gateway", "config", "worker")
AUTH_MODES = ("none", "token", "static")


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname: it may resolve to any interface


_NAME = re.compile(r"[A-Za-z0-9_-]{1,63}")


def _name_tuples(value: str, sep: str, count: int, shape: str) -> tuple[tuple[str, ...], ...]:
    """A comma-separated list of ``count`` names joined by ``sep`` (pool, profile and
    bundle names: 1-63 of ``[A-Za-z0-9_-]``), lowercased, duplicates dropped.

    Raises:
        ValueError: an entry of another shape.
    """
    out = []
    for entry in (x.strip() for x in value.split(",") if x.strip()):
        parts = [p.strip() for p in entry.split(sep)]
        if len(parts) != count or not all(_NAME.fullmatch(p) for p in parts):
            raise ValueError(f"{entry!r} must be {shape}, names of 1-63 of [A-Za-z0-9_-]")
        out.append(tuple(p.lower() for p in parts))
    return tuple(dict.fromkeys(out))


class ServeSettings(BaseModel):
    """Everything ``sie serve`` needs. Immutable."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    roles: tuple[str, ...] = ROLES
    bus: Literal["memory", "nats"] = "memory"
    nats_url: str = "nats://127.0.0.1:4222"
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    config_port: int = Field(default=8081, ge=0, le=65535)  # unset: port + 1
    # /metrics, /healthz, /readyz of a process without a gateway (docs/observability.md)
    metrics_port: int = Field(default=9090, ge=0, le=65535)
    models_dir: str | None = None
    bundles_dir: str | None = None
    preload: tuple[str, ...] = ()
    # bare model id -> the profile it serves (docs/performance.md "Choosing a MiniLM profile")
    default_profiles: tuple[tuple[str, str], ...] = ()
    # identities / lanes (architecture §16.3)
    pool: str = "default"
    machine_profile: str = "default"
    bundle: str = "default"
    worker_id: str = Field(default_factory=lambda: f"worker-{socket.gethostname()}")
    router_id: str = Field(default_factory=lambda: f"gw-{socket.gethostname()}")
    device: str = "cpu"
    # gateway
    request_timeout_s: float = Field(default=30.0, gt=0)
    max_body_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    # generation bodies (admission-gate.md "Request parsing"): a 128k-token prompt fits
    max_generate_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    max_items_per_request: int = Field(default=4096, gt=0)
    max_text_chars: int = Field(default=1_000_000, gt=0)
    drain_timeout_s: float = Field(default=25.0, ge=0)
    # HTTP limits (docs/security.md "Limits"; sie.http.limits, sie.http.server)
    max_inflight_body_bytes: int = Field(default=1024 * 1024 * 1024, gt=0)
    # encoded worker results one request may collect (the reply is built from them)
    max_response_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    # an extract text is read whole, window by window: bounded so one fits the timeout
    max_extract_chars: int = Field(default=100_000, gt=0)
    http_header_timeout_s: float = Field(default=15.0, gt=0)
    http_body_timeout_s: float = Field(default=60.0, gt=0)
    http_send_timeout_s: float = Field(default=60.0, gt=0)
    max_large_body_reads: int = Field(default=4, ge=1)
    # backpressure (architecture §2)
    max_stream_pending: int = Field(default=50_000, gt=0)
    max_lane_in_flight_items: int = Field(default=10_000, gt=0)
    # a request's items in the work stream at once (fairness, docs/api.md §10)
    request_window_items: int = Field(default=128, ge=1, le=100_000)
    # pools (docs/pools.md): deploy-owned queue pools API pools may be backed by, and
    # where pools are kept (None: NATS key-value with the NATS bus, else memory)
    static_queue_pools: tuple[str, ...] = ()
    # the lane catalog (docs/pools.md "Lanes"): machine profiles, request aliases and
    # the declared physical lanes (pool, machine_profile, bundle), at most 1,024
    configured_gpus: tuple[str, ...] = ()
    gpu_aliases: tuple[tuple[str, str], ...] = ()
    configured_physical_lanes: tuple[tuple[str, str, str], ...] = ()
    pool_store: Literal["memory", "nats", "kubernetes"] | None = None
    pool_store_namespace: str | None = None
    # capped pools (docs/pools.md): seconds a worker-direct request may miss results
    # before they go to the pool; seconds between a worker's readings of the pools
    direct_fallback_s: float = Field(default=10.0, gt=0, le=3600)
    max_pools: int = Field(default=256, ge=1, le=10_000)
    pool_poll_s: float = Field(default=10.0, gt=0, le=3600)
    lane_backpressure_enforce: bool = False
    # streams (architecture §8.2)
    stream_max_age_s: float = 1800.0
    stream_max_msgs: int = 100_000
    stream_storage: Literal["memory", "file"] = "memory"
    stream_replicas: int = Field(default=1, ge=1, le=5)
    # work items over the bus's max_payload, by reference (docs/api.md §12); "" = derived
    payload_store_url: str = ""
    # worker
    max_batch_requests: int = Field(default=64, gt=0)
    max_batch_wait_ms: float = Field(default=10.0, ge=0)
    max_inflight_items: int = Field(default=512, gt=0)
    # engine calls of one model in flight at once on a CPU (sie.engines.runtime.threads)
    engine_concurrency: int = Field(default=2, ge=1, le=64)
    # worker memory (docs/api.md §10): bytes, else this fraction of RAM (VRAM on CUDA)
    memory_budget_bytes: int | None = Field(default=None, gt=0)
    memory_budget_fraction: float = Field(default=0.85, gt=0, le=1)
    idle_evict_s: float | None = Field(default=None, gt=0)
    # a request for a model still loading after this long answers 503 MODEL_LOADING
    model_load_wait_s: float = Field(default=5.0, ge=0)
    # short: a dead worker's items move within seconds; live workers keep theirs alive
    ack_wait_s: float = Field(default=5.0, gt=0)
    max_deliver: int = 20
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    # The worker's inference threads take the GIL back between tensor ops and after
    # each ONNX pass; Python's default 5 ms switch interval stalls each such hand-over
    # behind the event loop (docs/performance.md "GIL switch interval").
    gil_switch_interval_ms: float = Field(default=0.05, gt=0, le=100)
    log_level: str = "INFO"
    # observability (docs/observability.md): JSON log lines, the share of successful
    # requests with an access line, span export (with an OTLP endpoint, OTEL_* vars)
    log_json: bool = False
    access_log_sample: float = Field(default=1.0, ge=0.0, le=1.0)
    tracing_enabled: bool = False
    # drop-in routes (docs/api.md §15): the model a TEI- or Cohere-shaped request without
    # a ``model`` field runs on (None: such a request is 400 naming the setting)
    default_embed_model: str | None = None
    default_sparse_model: str | None = None
    default_rerank_model: str | None = None
    # config authority (architecture §3, §9, §13 "Config service")
    config_store_dir: str | None = None
    config_restore: bool = False
    config_producer_id: str = Field(default_factory=lambda: f"sie-config-{socket.gethostname()}")
    # most models the config authority holds before refusing new ones (409
    # MODEL_LIMIT_EXCEEDED; docs/security.md "Config role")
    config_max_models: int = Field(default=1_000, ge=1)
    # config sync on gateways and workers (architecture §4, §13 "Gateway")
    config_service_url: str | None = None
    gateway_url: str = "http://127.0.0.1:8080"  # what the SDK calls (docs/sdk.md)
    config_poll_interval_s: float = Field(default=30.0, gt=0)
    config_trusted_producers: tuple[str, ...] = ("sie-config",)
    config_trust_any_producer: bool = False
    # what config writers may ask of workers (docs/security.md "Trust model"; sie.core.trust):
    # weights_path roots (empty: the model caches and shipped weight packages), remote
    # code, upstream URL prefixes, env var names for api_key_env (their values, captured
    # by from_env, never a config-named lookup)
    weights_roots: tuple[str, ...] = ()
    #: where workers dequantise packaged GGUF models once (empty: ~/.cache/sie/models)
    model_cache_dir: str = ""
    allow_trust_remote_code: bool = False
    upstream_base_urls: tuple[str, ...] = ()
    upstream_api_key_envs: tuple[str, ...] = ()
    upstream_api_keys: dict[str, SecretStr] = Field(default_factory=dict, repr=False)
    # auth (architecture §3 step 1, §13; docs/security.md "Authentication"): unset is
    # "none" on a loopback address; any other address needs it stated
    auth_mode: Literal["none", "token", "static"] | None = None
    auth_token: SecretStr | None = None
    auth_tokens: tuple[SecretStr, ...] = ()
    admin_token: SecretStr | None = None
    auth_exempt_operational: bool = False
    # engine-state admission for generation (admission-gate.md; sie.core.admission)
    admission_kv_threshold: float = Field(default=0.90, gt=0, le=1)
    admission_max_inflight: int | None = Field(default=None, ge=1)
    admission_max_park_s: float = Field(default=120.0, ge=0)
    admission_observe_models: tuple[str, ...] = ()
    admission_poll_interval_s: float = Field(default=2.0, gt=0)
    admission_keepalive_s: float = Field(default=15.0, gt=0)

    @field_validator("auth_mode", mode="before")
    @classmethod
    def _auth_mode(cls, v: object) -> object:
        if isinstance(v, str):
            mode = v.strip().lower()
            if mode not in AUTH_MODES:  # fail closed: a typo never turns auth off
                raise ValueError(
                    f"SIE_AUTH_MODE={v!r} is not one of {', '.join(AUTH_MODES)}; refusing to start"
                )
            return mode
        return v

    @model_validator(mode="before")
    @classmethod
    def _config_port_follows(cls, data: object) -> object:
        """Unset: the gateway port + 1 (0, a free port, after 0 or 65535; README)."""
        if isinstance(data, dict) and data.get("config_port") is None:
            port = data.get("port", 8080)  # a bad value is named by the port's own check
            if isinstance(port, int) or str(port).strip().isdigit():
                data = {**data, "config_port": int(port) + 1 if 0 < int(port) < 65535 else 0}
        return data

    @model_validator(mode="after")
    def _auth_on_open_address(self) -> ServeSettings:
        if self.auth_mode is None and not is_loopback(self.host):
            raise ValueError(
                f"listening on {self.host} (not a loopback address) with auth unset: set "
                "SIE_AUTH_MODE=token with SIE_AUTH_TOKEN and SIE_ADMIN_TOKEN, or state "
                "SIE_AUTH_MODE=none to serve without auth"
            )
        return self

    @property
    def effective_auth_mode(self) -> str:
        """``auth_mode`` with unset read as ``none``."""
        return self.auth_mode or "none"

    @field_validator("roles", mode="before")
    @classmethod
    def _roles(cls, v: object) -> tuple[str, ...]:
        raw = v.split(",") if isinstance(v, str) else [str(r) for r in v]  # type: ignore[attr-defined]
        items = [r.strip() for r in raw if r.strip()]
        bad = [r for r in items if r not in ROLES]
        if bad or not items:
            raise ValueError(
                f"roles must be a non-empty subset of {','.join(ROLES)}; got {bad or 'nothing'}"
            )
        return tuple(dict.fromkeys(items))

    @field_validator("pool", "machine_profile", "bundle")
    @classmethod
    def _lane_token(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", v):
            raise ValueError(f"{v!r} must match [A-Za-z0-9_-]+")
        return v.lower()

    @field_validator("config_trusted_producers", "auth_tokens", mode="before")
    @classmethod
    def _csv_any(cls, v: object) -> object:
        if isinstance(v, str):
            return tuple(x.strip() for x in v.split(",") if x.strip())
        return v

    @field_validator("weights_roots", "upstream_base_urls", "upstream_api_key_envs", mode="before")
    @classmethod
    def _csv_trust(cls, v: object) -> object:
        if isinstance(v, str):
            return tuple(x.strip() for x in v.split(",") if x.strip())
        return v

    @field_validator("upstream_base_urls")
    @classmethod
    def _upstream_urls(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        from sie.core.trust import parse_upstream_url

        for url in v:
            try:
                parse_upstream_url(url)
            except ValueError as exc:
                raise ValueError(f"SIE_UPSTREAM_BASE_URLS entry {url!r} {exc}") from exc
        return v

    @field_validator("upstream_api_key_envs")
    @classmethod
    def _api_key_envs(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for name in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"SIE_UPSTREAM_API_KEY_ENVS: {name!r} is not a variable name")
            if name in ENV_VARS:  # SIE_ADMIN_TOKEN, SIE_AUTH_TOKEN...: never sent upstream
                raise ValueError(
                    f"SIE_UPSTREAM_API_KEY_ENVS: {name!r} is an SIE setting, not an upstream key"
                )
        return v

    @field_validator("auth_token", "admin_token", mode="before")
    @classmethod
    def _blank_is_none(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v

    def inference_tokens(self) -> list[str]:
        """Tokens accepted on inference and read routes (``SIE_AUTH_TOKENS`` + ``SIE_AUTH_TOKEN``)."""
        out = [t.get_secret_value() for t in self.auth_tokens]
        if self.auth_token is not None:
            out.append(self.auth_token.get_secret_value())
        return [t for t in out if t]

    def admin(self) -> str | None:
        return self.admin_token.get_secret_value() if self.admin_token is not None else None

    def view(self, cls: type[V]) -> V:
        """The per-concern view ``cls`` (``sie.settings_views``) of these settings: its
        fields copied from here (a view field this model lacks is a bug: KeyError)."""
        return cls.model_validate(
            {name: getattr(self, name) for name in cls.model_fields if name != "read_token"}
        )

    def sync_view(self) -> SyncSettings:
        """The config-convergence view, with the token the export poller presents
        (export is admin-only; without an admin token the inference token still reads)."""
        token = self.admin() or next(iter(self.inference_tokens()), None)
        return self.view(SyncSettings).model_copy(
            update={"read_token": SecretStr(token) if token else None}
        )

    @field_validator("gpu_aliases", mode="before")
    @classmethod
    def _aliases(cls, v: object) -> object:
        return _name_tuples(v, "=", 2, "alias=profile") if isinstance(v, str) else v

    @field_validator("configured_physical_lanes", mode="before")
    @classmethod
    def _lanes(cls, v: object) -> object:
        if not isinstance(v, str):
            return v
        lanes = _name_tuples(v, "/", 3, "pool/machine_profile/bundle")
        if len(lanes) > 1024:
            raise ValueError("at most 1024 physical lanes")
        return lanes

    @field_validator("static_queue_pools", "configured_gpus", mode="before")
    @classmethod
    def _queue_pools(cls, v: object) -> tuple[str, ...]:
        raw = v if isinstance(v, str) else ",".join(str(x) for x in v)  # type: ignore[attr-defined]
        return tuple(t[0] for t in _name_tuples(raw, "/", 1, "a name"))

    @field_validator("preload", mode="before")
    @classmethod
    def _csv(cls, v: object) -> tuple[str, ...]:
        if isinstance(v, str):
            return tuple(x.strip() for x in v.split(",") if x.strip())
        return tuple(v)  # type: ignore[arg-type]

    @field_validator("default_profiles", mode="before")
    @classmethod
    def _default_profiles(cls, v: object) -> object:
        """``MODEL=PROFILE[,MODEL=PROFILE...]`` (one profile per model)."""
        if not isinstance(v, str):
            return v
        out: dict[str, str] = {}
        for entry in (x.strip() for x in v.split(",") if x.strip()):
            model, sep, profile = (p.strip() for p in entry.partition("="))
            if not sep or not model or not _NAME.fullmatch(profile) or ":" in model:
                raise ValueError(
                    f"{entry!r} must be MODEL=PROFILE (a bare model id, a profile name)"
                )
            if out.setdefault(model, profile) != profile:
                raise ValueError(f"{model!r} is given two default profiles")
        return tuple(out.items())

    @field_validator("admission_observe_models", mode="before")
    @classmethod
    def _csv_models(cls, v: object) -> object:
        if isinstance(v, str):
            return tuple(x.strip() for x in v.split(",") if x.strip())
        return v

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> ServeSettings:
        """Settings from ``env`` (``ENV_VARS``; default: the process environment), then
        explicit ``overrides`` (flags) win. The only reader of the environment in SIE.

        The values of the variables ``SIE_UPSTREAM_API_KEY_ENVS`` names are captured here
        into ``upstream_api_keys`` (unset or empty ones are left out), so no other code
        reads a config-named variable.
        """
        env = os.environ if env is None else env
        values: dict[str, object] = {f: env[k] for k, f in ENV_VARS.items() if env.get(k, "") != ""}
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls.model_validate(values)
        if "upstream_api_keys" not in values and settings.upstream_api_key_envs:
            keys = {n: env[n] for n in settings.upstream_api_key_envs if env.get(n)}
            settings = cls.model_validate({**values, "upstream_api_keys": keys})
        return settings


#: Environment defaults for the model libraries a worker loads: offline (weights come
#: from ``weights_path``, packages or the local cache) and no tokenizer thread pools.
LIBRARY_ENV_DEFAULTS: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # no progress bars in server logs (model loads would draw them)
    "TQDM_DISABLE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}


def client_settings(env: Mapping[str, str] | None = None, **overrides: object) -> ClientSettings:
    """The SDK's settings from ``env`` (default: the process environment; docs/sdk.md)."""
    return ClientSettings.from_env(os.environ if env is None else env, ENV_VARS, **overrides)


def otel_env() -> dict[str, str]:
    """The ``OTEL_*`` variables of the process environment (OpenTelemetry's own
    settings, read by ``sie.tracing``; docs/observability.md "Traces")."""
    return {k: v for k, v in os.environ.items() if k.startswith("OTEL_")}


def apply_library_env_defaults() -> None:
    """Set ``LIBRARY_ENV_DEFAULTS`` in the process environment where unset (``sie
    serve`` calls it once, before any model library is imported)."""
    for name, value in LIBRARY_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
