"""Collecting one request's results: a slot per item, filled from the gateway's inbox
in any order, complete when every item answered (architecture §16.2)."""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio

from sie.core.errors import InferenceError, error_for_code
from sie.core.registry import ModelEntry
from sie.core.wire import WorkResult

__all__ = ["Collected", "Collector", "raise_failures"]


@dataclass(slots=True)
class Collector:
    """The results of one request in flight: ``results[i]`` is item ``i``'s, or None
    until it arrives; ``done`` is set when ``remaining`` reaches 0."""

    total: int
    results: list[WorkResult | None]
    remaining: int
    done: anyio.Event = field(default_factory=anyio.Event)


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

    @property
    def workers(self) -> list[str]:
        return sorted({r.worker_id for r in self.results if r.worker_id})


def raise_failures(results: list[WorkResult]) -> None:
    """Raise the workers' error when every item failed with one code (e.g. 503
    ``MODEL_LOADING``), else ``InferenceError`` listing each failed item; nothing when
    every item succeeded."""
    failed = [r for r in results if not r.success]
    if not failed:
        return
    codes = {r.error_code for r in failed}
    if len(failed) == len(results) and len(codes) == 1:
        field = failed[0].error_field
        raise error_for_code(
            failed[0].error_code,
            failed[0].error or "worker error",
            **({"field": field} if field else {}),
        )
    raise InferenceError(
        f"{len(failed)} of {len(results)} items failed",
        details=[
            {"item_index": r.item_index, "code": r.error_code, "error": r.error} for r in failed
        ],
    )
