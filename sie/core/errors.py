"""The one SIE error hierarchy.

Every error carries a stable machine-readable ``code`` (the strings of reference
§1.12 and architecture §2), the HTTP ``status`` it maps to, and optional
structured ``fields`` (e.g. the offending request field). ``sie.http.errors``
turns them into response envelopes; nothing else decides status codes.

Tree::

    SieError                       500 INTERNAL_ERROR
    ├── InvalidInput               400 INVALID_INPUT      (names the field)
    ├── ModelNotFound              404 MODEL_NOT_FOUND
    ├── BundleNotFound             404 BUNDLE_NOT_FOUND
    ├── ConfigError                400 INVALID_CONFIG     (bad model/bundle YAML; names keys)
    │   ├── ParseError             400 PARSE_ERROR        (not YAML / not a mapping)
    │   ├── InvalidModelId         400 INVALID_MODEL_ID   (architecture §3 _validate_model_id)
    │   ├── ValidationFailed       422 VALIDATION_ERROR   (config write fails the schema)
    │   │   └── UnroutableModel    422 UNROUTABLE_MODEL   (no bundle serves the adapter)
    │   └── ContentConflict        409 CONTENT_CONFLICT   (append-only rule broken, §3 step 3.3)
    ├── BundleConflict             409 BUNDLE_CONFLICT    (resolve: bundle cannot serve the model)
    ├── IdempotencyMismatch        422 IDEMPOTENCY_MISMATCH (same key, different body, §3)
    ├── IdempotentInflightCancelled 503 IDEMPOTENT_INFLIGHT_CANCELLED (owner cancelled, §3)
    ├── RegistryUnavailable        503 REGISTRY_UNAVAILABLE (config role: bundles failed, §11.8)
    ├── PublisherUnavailable       503 NATS_UNAVAILABLE   (delta publisher disconnected, §3 step 3.6)
    ├── StoreUnavailable           503 STORE_UNAVAILABLE  (config store write failed; nothing changed)
    ├── Unauthorized               401 UNAUTHORIZED       (missing/wrong bearer token, §13)
    ├── Forbidden                  403 FORBIDDEN          (token lacks the right, §3 step 1)
    ├── AuthMisconfigured          500 AUTH_MISCONFIGURED (auth on, no tokens configured, §13)
    ├── PayloadTooLarge            413 PAYLOAD_TOO_LARGE
    ├── ModelLoading               503 MODEL_LOADING      (retryable, Retry-After 5)
    ├── ModelLoadFailed            502 MODEL_LOAD_FAILED  (terminal, no Retry-After)
    ├── InferenceError             500 INFERENCE_ERROR
    ├── ResourceExhausted          503 RESOURCE_EXHAUSTED (retryable, Retry-After 5)
    ├── Backpressure               503 QUEUE_FULL         (retryable, Retry-After 5)
    ├── QueueUnavailable           503 QUEUE_UNAVAILABLE
    ├── Provisioning               503 PROVISIONING       (no worker serves the lane; Retry-After 60)
    ├── GatewayTimeout             504 GATEWAY_TIMEOUT    (retryable, Retry-After 5)
    ├── ShuttingDown               503 SHUTTING_DOWN      (retryable, Retry-After 5)
    ├── AdmissionRejected          503 ENGINE_SATURATED   (parked past the limit; Retry-After 5)
    └── WireError                  400 INVALID_PAYLOAD    (undecodable msgpack / JSON)
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "AdmissionRejected",
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
    "ModelLoadFailed",
    "ModelLoading",
    "ModelNotFound",
    "ParseError",
    "PayloadTooLarge",
    "Provisioning",
    "PublisherUnavailable",
    "QueueUnavailable",
    "RegistryUnavailable",
    "ResourceExhausted",
    "ShuttingDown",
    "SieError",
    "StoreUnavailable",
    "Unauthorized",
    "UnroutableModel",
    "UpstreamError",
    "UpstreamUnavailable",
    "ValidationFailed",
    "WireError",
    "error_for_code",
]


class SieError(Exception):
    """Base of every SIE error.

    Attributes:
        code: stable error code, e.g. ``"MODEL_NOT_FOUND"``.
        status: HTTP status the error maps to.
        retry_after_s: seconds for a ``Retry-After`` header, or None.
        message: human-readable text (names the field where one is at fault).
        fields: extra structured detail merged into the error envelope.
    """

    code: ClassVar[str] = "INTERNAL_ERROR"
    status: ClassVar[int] = 500
    retry_after_s: ClassVar[int | None] = None

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields

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


class ModelLoading(SieError):
    code = "MODEL_LOADING"
    status = 503
    retry_after_s = 5


class ModelLoadFailed(SieError):
    code = "MODEL_LOAD_FAILED"
    status = 502


class InferenceError(SieError):
    code = "INFERENCE_ERROR"
    status = 500


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
        ConfigError,
        UnroutableModel,
        ParseError,
        InvalidModelId,
        ValidationFailed,
        ContentConflict,
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
        ModelLoading,
        ModelLoadFailed,
        InferenceError,
        ResourceExhausted,
        Backpressure,
        QueueUnavailable,
        GatewayTimeout,
        Provisioning,
        ShuttingDown,
        AdmissionRejected,
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
