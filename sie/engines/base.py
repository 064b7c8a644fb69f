"""The engine port: what a worker needs from a model implementation.

Engines are synchronous. The worker runs ``load``, the task methods and ``unload``
on worker threads, never two at once for one model, unless the engine declares
``concurrent_calls = N`` (its task methods are thread-safe): then up to N task calls
run at once on a CPU (``sie.engines.runtime.threads``, ``sie.engines.runtime.batching``), still
never alongside ``load`` or ``unload``. Constructors take ``(config, profile,
device)`` and do no I/O; ``load`` does the heavy work.

An engine implements one or more task protocols, checked by method:
``EncodeEngine`` (``encode``), ``ScoreEngine`` (``score``), ``ExtractEngine``
(``extract``) — the three functions of the public API (docs/api.md §2-§4).
Every engine may report ``memory_bytes()`` after ``load`` (parameters plus buffers;
the worker's memory budget, docs/api.md §10).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypedDict, TypeGuard, runtime_checkable

import numpy as np

from sie.core.config import ModelConfig, ResolvedProfile, canonical_adapter_path
from sie.core.errors import ModelLoadFailed

__all__ = [
    "EncodeEngine",
    "Engine",
    "EngineFactory",
    "Entity",
    "ExtractEngine",
    "ScoreEngine",
    "implements",
    "is_encoder",
    "is_extractor",
    "is_scorer",
    "load_engine_class",
    "memory_bytes",
]


class Entity(TypedDict):
    """One extracted span (docs/api.md §4). ``start``/``end`` are character offsets
    into the original Python string, ``text == original[start:end]``; ``score`` in 0..1."""

    text: str
    label: str
    score: float
    start: int
    end: int


@runtime_checkable
class Engine(Protocol):
    """What every engine has: load and unload (on the model's inference thread)."""

    def load(self) -> None:
        """Load weights onto the device.

        Raises:
            ModelLoadFailed: weights not found or not loadable (names what was tried).
        """
        ...

    def unload(self) -> None:
        """Release weights and device memory; idempotent."""
        ...


@runtime_checkable
class ScoreEngine(Protocol):
    """Relevance of candidates to a query (docs/api.md §3): a reranker."""

    def load(self) -> None: ...

    def unload(self) -> None: ...

    def score(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        instruction: str | None,
        options: Mapping[str, Any],
    ) -> list[float]:
        """One score per ``(query, doc)`` pair, in input order; higher is more relevant.

        Pairs of several requests may share one call (the batcher groups by
        instruction and options), so a pair's score must not depend on the others.

        Raises:
            InvalidInput: an option the engine cannot honour.
            InferenceError: the forward pass failed.
        """
        ...


@runtime_checkable
class ExtractEngine(Protocol):
    """Entities found in texts (docs/api.md §4)."""

    def load(self) -> None: ...

    def unload(self) -> None: ...

    def extract(
        self,
        texts: Sequence[str],
        *,
        labels: Sequence[str] | None,
        options: Mapping[str, Any],
    ) -> list[list[Entity]]:
        """Entities per text, in input order, each sorted by ``start``.

        ``labels``: the entity types to look for (zero-shot engines; required there),
        ``None`` for engines with a fixed label set (which may filter by it when given).
        Texts longer than the model window are read in overlapping windows; offsets
        always refer to the whole original text.

        Raises:
            InvalidInput: missing or bad ``labels``, or an option the engine cannot honour.
            InferenceError: the forward pass failed.
        """
        ...


_IMPLEMENTS: dict[tuple[type, type], bool] = {}


def implements(engine: object, protocol: type) -> bool:
    """Whether ``engine`` has every member of the runtime-checkable ``protocol``,
    decided once per engine class (a protocol ``isinstance`` costs microseconds and
    the worker asks per item)."""
    key = (type(engine), protocol)
    got = _IMPLEMENTS.get(key)
    if got is None:
        got = _IMPLEMENTS[key] = isinstance(engine, protocol)
    return got


def is_encoder(engine: object) -> TypeGuard[EncodeEngine]:
    """``engine`` implements ``EncodeEngine`` (``outputs``, ``prepare``, ``encode``)."""
    return implements(engine, EncodeEngine)


def is_scorer(engine: object) -> TypeGuard[ScoreEngine]:
    """``engine`` implements ``ScoreEngine`` (``score``)."""
    return implements(engine, ScoreEngine)


def is_extractor(engine: object) -> TypeGuard[ExtractEngine]:
    """``engine`` implements ``ExtractEngine`` (``extract``)."""
    return implements(engine, ExtractEngine)


def memory_bytes(engine: object) -> int:
    """Bytes an engine holds (its ``memory_bytes()``; 0 when it cannot tell)."""
    fn = getattr(engine, "memory_bytes", None)
    try:
        return int(fn()) if callable(fn) else 0
    except Exception:
        return 0


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
    def __call__(self, config: ModelConfig, profile: ResolvedProfile, device: str) -> Engine: ...


def load_engine_class(adapter_path: str, allowed_modules: Sequence[str]) -> EngineFactory:
    """Import ``module:Class`` named by a profile, restricted to the worker bundle's modules.

    Raises:
        ModelLoadFailed: module not in the bundle, not importable, or no such class.
    """
    module_name, _, cls_name = canonical_adapter_path(adapter_path).partition(":")
    if module_name not in {canonical_adapter_path(m) for m in allowed_modules}:
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
