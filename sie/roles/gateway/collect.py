"""Collecting one request's results: a slot per item, filled from the gateway's inbox
in any order, complete when every item answered (architecture §16.2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio

from sie.core.chunks import Reassembly
from sie.core.errors import AllItemsFailed, InferenceError, SieError, error_for_code
from sie.core.registry import ModelEntry
from sie.core.wire import WorkResult

__all__ = [
    "REQUEST_WINDOW_ITEMS",
    "Collected",
    "Collector",
    "raise_failures",
    "window_credits",
]


@dataclass(slots=True)
class Collector:
    """The results of one request in flight: ``results[i]`` is item ``i``'s, or None
    until it arrives; ``done`` is set when ``remaining`` reaches 0."""

    total: int
    results: list[WorkResult | None]
    remaining: int
    done: anyio.Event = field(default_factory=anyio.Event)
    #: for a request over ``REQUEST_WINDOW_ITEMS`` items: one credit per item it may
    #: still publish; each arriving result returns one (``window_credits``)
    credits: anyio.Semaphore | None = None
    #: chunked results being reassembled (docs/api.md §12), made on the first chunk
    chunks: Reassembly | None = None
    #: set when the request fails as a whole (an invalid chunked result, a reply too big)
    failure: SieError | None = None
    #: bytes of encoded results collected so far
    result_bytes: int = 0
    #: items of a worker-direct request republished to the pool (architecture §8):
    #: a late result from the direct worker for one of them is ignored
    fallback: frozenset[int] = frozenset()


#: Items of one request in the work stream and on the workers at once, by default
#: (``SIE_GATEWAY_REQUEST_WINDOW_ITEMS``): a larger
#: request publishes the rest as its results arrive, so the stream never holds a long
#: run of one request's items and a small request's item is near the front (the
#: worker's batcher then serves requests round-robin; docs/api.md §10).
REQUEST_WINDOW_ITEMS = 128


def window_credits(n: int, window: int = REQUEST_WINDOW_ITEMS) -> anyio.Semaphore | None:
    """The publishing window of an ``n``-item request (None: it fits at once);
    ``window`` is ``SIE_GATEWAY_REQUEST_WINDOW_ITEMS``."""
    return anyio.Semaphore(window) if n > window else None


@dataclass(slots=True)
class Collected:
    """All results of one request, in input order, plus routing facts for headers.

    Times are milliseconds.
    """

    request_id: str
    entry: ModelEntry
    results: list[WorkResult]
    publish_ms: float
    total_ms: float

    def timing(self) -> dict[str, float]:
        def mx(attr: str) -> float:
            return max((getattr(r, attr) or 0.0) for r in self.results) if self.results else 0.0

        return {
            "publish_ms": self.publish_ms,
            "queue_ms": mx("queue_ms"),
            "inference_ms": mx("inference_ms"),
            "tokenization_ms": mx("tokenization_ms"),
            "total_ms": self.total_ms,
        }

    def payload_fetch_ms(self) -> float | None:
        """The longest fetch of an item sent by reference, or None when none was
        (docs/api.md §12)."""
        times = [r.payload_fetch_ms for r in self.results if r.payload_fetch_ms is not None]
        return max(times) if times else None

    def result_bytes(self) -> int:
        """Bytes of the workers' encoded results (the reply a compat route buffers)."""
        return sum(len(r.result_msgpack or b"") for r in self.results)

    @property
    def workers(self) -> list[str]:
        return sorted({r.worker_id for r in self.results if r.worker_id})


def load_failure_fields(details: Any) -> dict[str, Any]:
    """``error_class``, ``attempts`` and ``permanent`` of a MODEL_LOAD_FAILED body
    (architecture §2) from a worker's ``error_details``; what is missing or of the
    wrong type gets the conservative value (UNKNOWN, 1 attempt, permanent)."""
    d = details if isinstance(details, dict) else {}
    error_class, attempts, permanent = (
        d.get("error_class"),
        d.get("attempts"),
        d.get("permanent"),
    )
    return {
        "error_class": error_class if isinstance(error_class, str) else "UNKNOWN",
        "attempts": attempts
        if isinstance(attempts, int) and not isinstance(attempts, bool) and attempts > 0
        else 1,
        "permanent": permanent if isinstance(permanent, bool) else True,
    }


def raise_failures(results: list[WorkResult]) -> None:
    """Raise the workers' error when every failed item failed with one code and either
    every item failed (e.g. 503 ``MODEL_LOADING``) or that code is a client error (a
    4xx such as ``INVALID_INPUT``: the request is at fault, naming its first bad item,
    with ``details[]`` listing each); ``AllItemsFailed`` when every item failed with
    different codes; else ``InferenceError`` listing each failed item; nothing when
    every item succeeded (docs/api.md §8)."""
    failed = [r for r in results if not r.success]
    if not failed:
        return
    codes = {r.error_code for r in failed}
    details = [{"item_index": r.item_index, "code": r.error_code, "error": r.error} for r in failed]
    if len(codes) == 1:
        field = failed[0].error_field
        extra: dict[str, Any] = {"field": field} if field else {}
        if failed[0].error_code == "MODEL_LOAD_FAILED":
            extra |= load_failure_fields(failed[0].error_details)
        err = error_for_code(failed[0].error_code, failed[0].error or "worker error", **extra)
        if len(failed) == len(results):
            raise err
        if 400 <= err.status < 500:
            err.fields["details"] = details
            raise err
    kind = AllItemsFailed if len(failed) == len(results) else InferenceError
    raise kind(f"{len(failed)} of {len(results)} items failed", details=details)
