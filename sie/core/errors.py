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
    │   └── UnroutableModel        422 UNROUTABLE_MODEL   (no bundle serves the adapter)
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
    └── WireError                  400 INVALID_PAYLOAD    (undecodable msgpack / JSON)
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "Backpressure",
    "BundleNotFound",
    "ConfigError",
    "GatewayTimeout",
    "InferenceError",
    "InvalidInput",
    "ModelLoadFailed",
    "ModelLoading",
    "ModelNotFound",
    "PayloadTooLarge",
    "Provisioning",
    "QueueUnavailable",
    "ResourceExhausted",
    "ShuttingDown",
    "SieError",
    "UnroutableModel",
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


class UnroutableModel(ConfigError):
    code = "UNROUTABLE_MODEL"
    status = 422


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
