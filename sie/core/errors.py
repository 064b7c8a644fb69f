"""The one SIE error hierarchy.

Every error carries a stable machine-readable ``code`` (the strings of reference
§1.12 and architecture §2), the HTTP ``status`` it maps to, and optional
structured ``fields`` (e.g. the offending request field). ``sie.http.errors``
turns them into response envelopes; nothing else decides status codes.

Echo bounds (docs/security.md "Limits"): an error never echoes more than a bounded
part of what the client sent. ``echo`` shortens one client value (an id, a path) to
``MAX_ECHO_CHARS`` characters plus its length; every error shortens its string
``fields`` the same way and its ``message`` to ``MAX_MESSAGE_CHARS`` (head and tail
kept, the middle elided), whoever built it.

Tree::

    SieError                       500 INTERNAL_ERROR
    ├── InvalidInput               400 INVALID_INPUT      (names the field)
    ├── ModelNotFound              404 MODEL_NOT_FOUND
    ├── BundleNotFound             404 BUNDLE_NOT_FOUND
    ├── PoolNotFound               404 POOL_NOT_FOUND     (X-SIE-Pool names no pool: fails closed)
    ├── PoolConflict               409 POOL_CONFLICT      (exists with another spec / changed meanwhile)
    ├── PoolLimitExceeded          409 POOL_LIMIT_EXCEEDED (the store holds SIE_MAX_POOLS)
    ├── ConfigError                400 INVALID_CONFIG     (bad model/bundle YAML; names keys)
    │   ├── ParseError             400 PARSE_ERROR        (not YAML / not a mapping)
    │   ├── InvalidModelId         400 INVALID_MODEL_ID   (architecture §3 _validate_model_id)
    │   ├── ValidationFailed       422 VALIDATION_ERROR   (config write fails the schema)
    │   │   └── UnroutableModel    422 UNROUTABLE_MODEL   (no bundle serves the adapter)
    │   ├── ContentConflict        409 CONTENT_CONFLICT   (append-only rule broken, §3 step 3.3)
    │   └── ModelIdConflict        409 MODEL_ID_CONFLICT  (another model has the same subject token)
    ├── ModelLimitExceeded         409 MODEL_LIMIT_EXCEEDED (the authority holds SIE_CONFIG_MAX_MODELS)
    ├── BundleConflict             409 BUNDLE_CONFLICT    (resolve: bundle cannot serve the model)
    ├── IdempotencyMismatch        422 IDEMPOTENCY_MISMATCH (same key, different body, §3)
    ├── IdempotentInflightCancelled 503 IDEMPOTENT_INFLIGHT_CANCELLED (owner cancelled, §3)
    ├── RegistryUnavailable        503 REGISTRY_UNAVAILABLE (config role: bundles failed, §11.8)
    ├── PublisherUnavailable       503 NATS_UNAVAILABLE   (delta publisher disconnected, §3 step 3.6)
    ├── StoreUnavailable           503 STORE_UNAVAILABLE  (config store write failed; nothing changed)
    ├── Unauthorized               401 UNAUTHORIZED       (missing/wrong bearer token, §13)
    ├── Forbidden                  403 FORBIDDEN          (token lacks the right, §3 step 1)
    ├── AuthMisconfigured          500 AUTH_MISCONFIGURED (auth on, no tokens configured, §13)
    ├── RequestTimeout             408 REQUEST_TIMEOUT    (the body did not arrive in time)
    ├── PayloadTooLarge            413 PAYLOAD_TOO_LARGE
    ├── UnsupportedMediaType       415 UNSUPPORTED_MEDIA_TYPE (a charset other than UTF-8)
    ├── ModelLoading               503 MODEL_LOADING      (retryable, Retry-After 5)
    ├── ModelLoadFailed            502 MODEL_LOAD_FAILED  (terminal, no Retry-After)
    ├── LoraLoading                503 LORA_LOADING       (retryable, Retry-After 1)
    ├── InferenceError             500 INFERENCE_ERROR
    │   └── AllItemsFailed         500 ALL_ITEMS_FAILED   (every item failed, with different codes)
    ├── ResourceExhausted          503 RESOURCE_EXHAUSTED (retryable, Retry-After 5)
    ├── Backpressure               503 QUEUE_FULL         (retryable, Retry-After 5)
    ├── QueueUnavailable           503 QUEUE_UNAVAILABLE
    ├── Provisioning               503 PROVISIONING       (no worker serves the lane; Retry-After 60)
    ├── GatewayTimeout             504 GATEWAY_TIMEOUT    (retryable, Retry-After 5)
    ├── ShuttingDown               503 SHUTTING_DOWN      (retryable, Retry-After 5)
    ├── AdmissionRejected          503 ENGINE_SATURATED   (parked past the limit; Retry-After 5)
    ├── PayloadUnavailable         503 PAYLOAD_UNAVAILABLE (payload store failed; Retry-After 5)
    ├── TransportFailure           503 TRANSPORT_FAILURE  (an invalid chunked result; no Retry-After)
    ├── WorkerLost                 503 WORKER_LOST        (a generation's worker died mid-stream)
    └── WireError                  400 INVALID_PAYLOAD    (undecodable msgpack / JSON)
"""

from __future__ import annotations

from typing import Any, ClassVar

from sie.core.echo import MAX_ECHO_CHARS, MAX_MESSAGE_CHARS, bound_message, echo

__all__ = [
    "MAX_ECHO_CHARS",
    "MAX_MESSAGE_CHARS",
    "AdmissionRejected",
    "AllItemsFailed",
    "AuthMisconfigured",
    "Backpressure",
    "BundleConflict",
    "BundleNotFound",
    "ConfigError",
    "ContentConflict",
    "Forbidden",
    "GatewayTimeout",
    "IdempotencyMismatch",
    "IdempotentInflightCancelled",
    "InferenceError",
    "InvalidInput",
    "InvalidModelId",
    "LoraLoading",
    "ModelIdConflict",
    "ModelLimitExceeded",
    "ModelLoadFailed",
    "ModelLoading",
    "ModelNotFound",
    "ParseError",
    "PayloadTooLarge",
    "PayloadUnavailable",
    "PoolConflict",
    "PoolLimitExceeded",
    "PoolNotFound",
    "Provisioning",
    "PublisherUnavailable",
    "QueueUnavailable",
    "RegistryUnavailable",
    "RequestTimeout",
    "ResourceExhausted",
    "ShuttingDown",
    "SieError",
    "StoreUnavailable",
    "TransportFailure",
    "Unauthorized",
    "UnroutableModel",
    "UnsupportedMediaType",
    "UpstreamError",
    "UpstreamUnavailable",
    "ValidationFailed",
    "WireError",
    "WorkerLost",
    "echo",
    "error_for_code",
]


class SieError(Exception):
    """Base of every SIE error.

    Attributes:
        code: stable error code, e.g. ``"MODEL_NOT_FOUND"``.
        status: HTTP status the error maps to.
        retry_after_s: seconds for a ``Retry-After`` header, or None.
        message: human-readable text (names the field where one is at fault); at
            most ``MAX_MESSAGE_CHARS`` characters.
        fields: extra structured detail merged into the error envelope; string values
            are shortened by ``echo``.
    """

    code: ClassVar[str] = "INTERNAL_ERROR"
    status: ClassVar[int] = 500
    retry_after_s: ClassVar[int | None] = None

    def __init__(self, message: str, **fields: Any) -> None:
        message = bound_message(message)
        super().__init__(message)
        self.message = message
        self.fields = {k: echo(v) if isinstance(v, str) else v for k, v in fields.items()}

    def to_detail(self) -> dict[str, Any]:
        """The ``{"code", "message", ...fields}`` object used in every envelope."""
        return {"code": self.code, "message": self.message, **self.fields}


class InvalidInput(SieError):
    code = "INVALID_INPUT"
    status = 400


class WireError(InvalidInput):
    code = "INVALID_PAYLOAD"


class ModelNotFound(SieError):
    code = "MODEL_NOT_FOUND"
    status = 404


class BundleNotFound(SieError):
    code = "BUNDLE_NOT_FOUND"
    status = 404


class PoolNotFound(SieError):
    """A named pool that does not exist (or whose lease ran out): requests for it fail
    closed rather than spill onto shared capacity (architecture §16.3)."""

    code = "POOL_NOT_FOUND"
    status = 404


class PoolConflict(SieError):
    """The pool exists with another spec, or changed since it was read (409)."""

    code = "POOL_CONFLICT"
    status = 409


class ConfigError(SieError):
    code = "INVALID_CONFIG"
    status = 400


class ParseError(ConfigError):
    code = "PARSE_ERROR"


class InvalidModelId(ConfigError):
    code = "INVALID_MODEL_ID"


class ValidationFailed(ConfigError):
    code = "VALIDATION_ERROR"
    status = 422


class UnroutableModel(ValidationFailed):
    code = "UNROUTABLE_MODEL"
    status = 422


class ContentConflict(ConfigError):
    code = "CONTENT_CONFLICT"
    status = 409


class ModelIdConflict(ConfigError):
    """A new model id maps to the NATS subject token of another model's id
    (``sec/x.y`` and ``sec/x_dot_y`` are both ``sec__x_dot_y``, architecture §8.2):
    served together, the two would share one work subject. Fields: ``field``
    (``sie_id``), ``conflicting_model``, ``subject_token``."""

    code = "MODEL_ID_CONFLICT"
    status = 409


class ModelLimitExceeded(SieError):
    """A write would create a model beyond the authority's ``SIE_CONFIG_MAX_MODELS``
    (docs/security.md "Config role"). 409, like the other refusals of a valid document
    because of what the authority already holds; writes to existing models still work.
    Fields: ``field`` (``sie_id``), ``limit``."""

    code = "MODEL_LIMIT_EXCEEDED"
    status = 409


class PoolLimitExceeded(SieError):
    """A new pool beyond ``SIE_MAX_POOLS`` (docs/pools.md). Fields: ``limit``."""

    code = "POOL_LIMIT_EXCEEDED"
    status = 409


class BundleConflict(SieError):
    code = "BUNDLE_CONFLICT"
    status = 409


class IdempotencyMismatch(SieError):
    code = "IDEMPOTENCY_MISMATCH"
    status = 422


class IdempotentInflightCancelled(SieError):
    code = "IDEMPOTENT_INFLIGHT_CANCELLED"
    status = 503
    retry_after_s = 1


class RegistryUnavailable(SieError):
    code = "REGISTRY_UNAVAILABLE"
    status = 503
    retry_after_s = 30


class PublisherUnavailable(SieError):
    code = "NATS_UNAVAILABLE"
    status = 503
    retry_after_s = 5


class StoreUnavailable(SieError):
    code = "STORE_UNAVAILABLE"
    status = 503
    retry_after_s = 5


class Unauthorized(SieError):
    code = "UNAUTHORIZED"
    status = 401


class Forbidden(SieError):
    code = "FORBIDDEN"
    status = 403


class AuthMisconfigured(SieError):
    code = "AUTH_MISCONFIGURED"
    status = 500


class PayloadTooLarge(SieError):
    code = "PAYLOAD_TOO_LARGE"
    status = 413


class RequestTimeout(SieError):
    code = "REQUEST_TIMEOUT"
    status = 408


class UnsupportedMediaType(SieError):
    code = "UNSUPPORTED_MEDIA_TYPE"
    status = 415


class ModelLoading(SieError):
    code = "MODEL_LOADING"
    status = 503
    retry_after_s = 5


class ModelLoadFailed(SieError):
    code = "MODEL_LOAD_FAILED"
    status = 502


class LoraLoading(SieError):
    """A LoRA adapter the request names is still loading (architecture §2); the SDK
    retries it up to ten times. Recognised on the wire; no shipped engine loads LoRA
    adapters yet."""

    code = "LORA_LOADING"
    status = 503
    retry_after_s = 1


class InferenceError(SieError):
    code = "INFERENCE_ERROR"
    status = 500


class AllItemsFailed(InferenceError):
    """Every item of a request failed, not all with one code (architecture §2): 500 with
    each item's ``item_index``, ``code`` and ``error`` in ``details``."""

    code = "ALL_ITEMS_FAILED"


class ResourceExhausted(SieError):
    code = "RESOURCE_EXHAUSTED"
    status = 503
    retry_after_s = 5


class Backpressure(SieError):
    code = "QUEUE_FULL"
    status = 503
    retry_after_s = 5


class QueueUnavailable(SieError):
    code = "QUEUE_UNAVAILABLE"
    status = 503
    retry_after_s = 5


class GatewayTimeout(SieError):
    code = "GATEWAY_TIMEOUT"
    status = 504
    retry_after_s = 5


class Provisioning(SieError):
    """No live worker serves the requested lane (architecture §2: pre-execution, retry later)."""

    code = "PROVISIONING"
    status = 503
    retry_after_s = 60


class ShuttingDown(SieError):
    code = "SHUTTING_DOWN"
    status = 503
    retry_after_s = 5


class AdmissionRejected(SieError):
    """A generation request stayed parked by the engine-state admission gate for
    ``ADMISSION_MAX_PARK_SECONDS`` (admission-gate.md "The decision"); retry later."""

    code = "ENGINE_SATURATED"
    status = 503
    retry_after_s = 5


class PayloadUnavailable(SieError):
    """A work item's offloaded payload could not be stored or fetched (docs/api.md §12)."""

    code = "PAYLOAD_UNAVAILABLE"
    status = 503
    retry_after_s = 5


class TransportFailure(SieError):
    """A result arrived in chunks that do not fit together (docs/api.md §12): the
    request fails closed at once, with a static message and no retry hint."""

    code = "TRANSPORT_FAILURE"
    status = 503


class WorkerLost(SieError):
    """The worker running a generation stopped being live after it started answering
    (docs/topologies.md): the stream ends with this error; retry the request."""

    code = "WORKER_LOST"
    status = 503
    retry_after_s = 1


class UpstreamError(InferenceError):
    """An upstream OpenAI-compatible server failed: an error status, a broken or
    truncated stream (502)."""

    code = "UPSTREAM_ERROR"
    status = 502


class UpstreamUnavailable(UpstreamError):
    """The upstream server is unreachable or overloaded (429/503); retry later."""

    code = "UPSTREAM_UNAVAILABLE"
    status = 503
    retry_after_s = 5


_BY_CODE: dict[str, type[SieError]] = {
    cls.code: cls
    for cls in (
        SieError,
        InvalidInput,
        WireError,
        ModelNotFound,
        BundleNotFound,
        PoolNotFound,
        PoolConflict,
        ConfigError,
        UnroutableModel,
        ParseError,
        InvalidModelId,
        ValidationFailed,
        ContentConflict,
        ModelIdConflict,
        ModelLimitExceeded,
        BundleConflict,
        IdempotencyMismatch,
        IdempotentInflightCancelled,
        RegistryUnavailable,
        PublisherUnavailable,
        StoreUnavailable,
        Unauthorized,
        Forbidden,
        AuthMisconfigured,
        PayloadTooLarge,
        UnsupportedMediaType,
        RequestTimeout,
        ModelLoading,
        ModelLoadFailed,
        LoraLoading,
        InferenceError,
        AllItemsFailed,
        ResourceExhausted,
        Backpressure,
        QueueUnavailable,
        GatewayTimeout,
        Provisioning,
        ShuttingDown,
        AdmissionRejected,
        PayloadUnavailable,
        TransportFailure,
        WorkerLost,
        UpstreamError,
        UpstreamUnavailable,
    )
}


def error_for_code(code: str | None, message: str, **fields: Any) -> SieError:
    """Rebuild an error from a code carried on the wire (e.g. ``WorkResult.error_code``).

    Unknown codes become ``InferenceError`` carrying the original code in ``fields``.
    """
    cls = _BY_CODE.get(code or "")
    if cls is None:
        return InferenceError(message, worker_code=code)
    return cls(message, **fields)
