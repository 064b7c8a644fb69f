"""Out of memory in an engine call is a retryable signal, not a worker failure
(architecture §2, docs/api.md §10): the batch is split in halves and each half tried
again, so the worker keeps serving smaller batches; an item that does not fit alone
fails with 503 ``RESOURCE_EXHAUSTED`` (Retry-After 5), and the worker stays healthy."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from sie.core.errors import ResourceExhausted

__all__ = ["is_out_of_memory", "split_on_oom"]

log = logging.getLogger(__name__)


def is_out_of_memory(exc: BaseException) -> bool:
    """``MemoryError``, torch's ``OutOfMemoryError`` (CUDA or not), or a runtime error
    an allocator raised saying it is out of memory."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def _free_memory() -> None:
    gc.collect()
    try:
        import torch  # already imported by any engine that can run out of device memory

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def split_on_oom(
    run: Callable[[Hashable, Sequence[Any]], list[Any]],
) -> Callable[[Hashable, Sequence[Any]], list[Any]]:
    """``run`` (a batcher's engine call: one result per payload, in order) that, when
    the engine runs out of memory, frees what it can and runs each half on its own.

    Raises:
        ResourceExhausted: a single payload does not fit.
    """

    def attempt(key: Hashable, payloads: Sequence[Any]) -> list[Any]:
        try:
            return run(key, payloads)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            _free_memory()
            if len(payloads) <= 1:
                raise ResourceExhausted(
                    "the engine ran out of memory on this item alone; retry later or send "
                    "a shorter input"
                ) from exc
            mid = len(payloads) // 2
            log.warning("out of memory on a batch of %d; retrying as two halves", len(payloads))
            return attempt(key, payloads[:mid]) + attempt(key, payloads[mid:])

    return attempt
