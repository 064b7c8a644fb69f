"""The engine port: what a worker needs from a model implementation.

Engines are synchronous and not thread-safe; the worker runs ``load``,
``encode`` and ``unload`` on one dedicated thread per model (see
``sie.engines.batching``). Constructors take ``(config, profile, device)`` and do
no I/O; ``load`` does the heavy work.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from sie.core.config import ModelConfig, ResolvedProfile
from sie.core.errors import ModelLoadFailed

__all__ = ["EncodeEngine", "EngineFactory", "load_engine_class"]


@runtime_checkable
class EncodeEngine(Protocol):
    """An engine that turns texts into vectors (architecture §16.2 step 3)."""

    #: Output types this engine can produce, e.g. ``("dense",)``.
    outputs: tuple[str, ...]

    def load(self) -> None:
        """Load weights onto the device.

        Raises:
            ModelLoadFailed: weights not found or not loadable (names what was tried).
        """
        ...

    def unload(self) -> None:
        """Release weights and device memory; idempotent."""
        ...

    def prepare(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None,
        is_query: bool,
        options: Mapping[str, Any],
    ) -> tuple[list[str], list[int]]:
        """Turn request texts into what the model reads, bounded, with token counts.

        Applies the instruction / query-or-document template (``sie.core.templates``),
        then bounds each result to the model window: long inputs are clipped to a
        prefix that encodes exactly like the whole under truncation to
        ``max_sequence_length``, so their cost is bounded.

        Returns:
            ``(texts, tokens)``: the model inputs and each one's token count after
            truncation (>= 1). Thread-safe with respect to a concurrent ``encode``.

        Raises:
            InvalidInput: a template that is not allowed.
        """
        ...

    def encode(
        self,
        texts: Sequence[str],
        *,
        output_types: Sequence[str],
        options: Mapping[str, Any],
        lengths: Sequence[int] | None = None,
    ) -> dict[str, np.ndarray]:
        """Encode a batch of prepared texts (``prepare``'s output).

        ``lengths`` are ``prepare``'s token counts, when the caller kept them
        (spares re-tokenising to plan padding).

        Returns:
            ``{"dense": float32 [len(texts), dim]}`` (L2-normalised when the
            runtime option ``normalize`` is true), one row per text in input order.
            A text's row does not depend on the other texts in the batch.

        Raises:
            InvalidInput: an option the engine cannot honour.
            InferenceError: the forward pass failed.
        """
        ...


class EngineFactory(Protocol):
    def __call__(
        self, config: ModelConfig, profile: ResolvedProfile, device: str
    ) -> EncodeEngine: ...


def load_engine_class(adapter_path: str, allowed_modules: Sequence[str]) -> EngineFactory:
    """Import ``module:Class`` named by a profile, restricted to the worker bundle's modules.

    Raises:
        ModelLoadFailed: module not in the bundle, not importable, or no such class.
    """
    module_name, _, cls_name = adapter_path.partition(":")
    if module_name not in allowed_modules:
        raise ModelLoadFailed(
            f"adapter module {module_name!r} is not in this worker's bundle {sorted(allowed_modules)}",
            error_class="DEPENDENCY",
            permanent=True,
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelLoadFailed(
            f"cannot import {module_name!r}: {exc} (install the extra that provides it)",
            error_class="DEPENDENCY",
            permanent=True,
        ) from exc
    factory = getattr(module, cls_name, None)
    if factory is None:
        raise ModelLoadFailed(
            f"{module_name!r} has no class {cls_name!r}", error_class="NOT_FOUND", permanent=True
        )
    return factory  # type: ignore[no-any-return]
