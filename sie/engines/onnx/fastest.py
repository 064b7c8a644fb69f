"""The fastest text encoder that passes its checks (bundle module
``sie.engines.onnx.fastest``; docs/performance.md "Choosing a MiniLM profile").

``FastestDenseEncoder`` loads, in order, and serves the first that loads:

1. ONNX Runtime dynamic int8 (``OnnxDenseEncoder`` with ``compute_precision: int8``):
   refused when its vectors leave the int8 bound against float32;
2. the same with per-token activation scales (loadtime ``int8_activation_scales:
   token``, ``sie.engines.onnx.token_scales``): closer to float32, 5-14% slower;
3. ONNX Runtime float32: refused when the export leaves cosine 0.99999 of the torch
   pipeline;
4. the torch pipeline (``DenseEncoder``).

Only a refusal by a check (``ModelLoadFailed`` with ``error_class`` CONFIG: a quality
gate, a pipeline the ONNX engines do not reproduce) or a missing ONNX stack
(DEPENDENCY) moves on to the next; missing weights (NOT_FOUND) fail the load at once,
as the next candidate would fail the same way. ``served`` names the one serving
(``onnx-int8``, ``onnx-int8-token``, ``onnx-float32`` or ``torch``), logged at load
with why the faster ones were refused. The profile's options reach every candidate (loadtime: the int8
bound, ``intra_op_num_threads``, ``trust_remote_code``; runtime: ``normalize`` and the
templates), so the outputs (``dense``, ``multivector``) and ``score`` are the same
contract whichever serves.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sie.core.config import ModelConfig, ResolvedProfile
from sie.core.errors import InferenceError, ModelLoadFailed
from sie.engines.encoders.sentence_transformers import DenseEncoder
from sie.engines.onnx.encoders import OnnxDenseEncoder

__all__ = ["CANDIDATES", "FastestDenseEncoder"]

log = logging.getLogger(__name__)

#: (name, engine class, compute_precision, int8_activation_scales), fastest first.
CANDIDATES: tuple[tuple[str, type, str | None, str | None], ...] = (
    ("onnx-int8", OnnxDenseEncoder, "int8", "tensor"),
    ("onnx-int8-token", OnnxDenseEncoder, "int8", "token"),
    ("onnx-float32", OnnxDenseEncoder, "float32", None),
    ("torch", DenseEncoder, None, None),
)
#: refusals that move on to the next candidate (module docstring)
_FALL_THROUGH = ("CONFIG", "DEPENDENCY")


class FastestDenseEncoder:
    """Dense and multivector embeddings from the fastest candidate that loads."""

    outputs: tuple[str, ...] = ("dense", "multivector")
    concurrent_calls = 8

    def __init__(
        self,
        config: ModelConfig,
        profile: ResolvedProfile,
        device: str = "cpu",
        model_cache_dir: str | Path | None = None,
    ) -> None:
        self.config = config
        self.profile = profile
        self.device = device
        self.model_cache_dir = model_cache_dir
        self.served: str | None = None
        #: why each faster candidate was refused: name → message
        self.refused: dict[str, str] = {}
        self._engine: Any = None

    def _build(self, cls: type, precision: str | None, scales: str | None) -> Any:
        update: dict[str, Any] = {"compute_precision": precision}
        if scales is not None:
            update["loadtime"] = {**self.profile.loadtime, "int8_activation_scales": scales}
        profile = self.profile.model_copy(update=update)
        kwargs: dict[str, Any] = {}
        if "model_cache_dir" in inspect.signature(cls).parameters:
            kwargs["model_cache_dir"] = self.model_cache_dir
        return cls(self.config, profile, self.device, **kwargs)

    def load(self) -> None:
        """Load the first candidate that passes its checks (module docstring).

        Raises:
            ModelLoadFailed: the last candidate's error, or a NOT_FOUND/UNKNOWN one.
        """
        self.refused = {}
        for name, cls, precision, scales in CANDIDATES:
            engine = self._build(cls, precision, scales)
            try:
                engine.load()
            except ModelLoadFailed as exc:
                if exc.fields.get("error_class") not in _FALL_THROUGH or name == CANDIDATES[-1][0]:
                    raise
                self.refused[name] = exc.message
                engine.unload()
                continue
            self._engine, self.served = engine, name
            break
        log.info(
            "%s: serving %s%s",
            self.config.sie_id,
            self.served,
            "".join(f"; {n} refused: {why}" for n, why in self.refused.items()),
        )

    def unload(self) -> None:
        if self._engine is not None:
            self._engine.unload()
        self._engine = None

    def _loaded(self) -> Any:
        if self._engine is None:
            raise InferenceError(f"model {self.config.sie_id!r} is not loaded")
        return self._engine

    @property
    def dim(self) -> int:
        return int(self._loaded().dim)

    @property
    def gains_from_batching(self) -> bool:
        """The serving engine's (``sie.engines.runtime.batching``: no wait for company)."""
        return bool(getattr(self._engine, "gains_from_batching", True))

    @property
    def wanted_engine_slots(self) -> int:
        """The serving engine's (``sie.engines.runtime.threads.engine_slots``)."""
        return int(getattr(self._engine, "wanted_engine_slots", 0) or 0)

    def memory_bytes(self) -> int:
        fn = getattr(self._engine, "memory_bytes", None)
        return int(fn()) if callable(fn) else 0

    def prepare(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None,
        is_query: bool,
        options: Mapping[str, Any],
    ) -> tuple[list[str], list[int]]:
        """``EncodeEngine.prepare`` of the serving engine."""
        out: tuple[list[str], list[int]] = self._loaded().prepare(
            texts, instruction=instruction, is_query=is_query, options=options
        )
        return out

    def encode(
        self,
        texts: Sequence[str],
        *,
        output_types: Sequence[str],
        options: Mapping[str, Any],
        lengths: Sequence[int] | None = None,
    ) -> dict[str, np.ndarray]:
        """``EncodeEngine.encode`` of the serving engine (``dense`` float32
        ``[n, dim]``, ``multivector`` per text ``[tokens, dim]``)."""
        out: dict[str, np.ndarray] = self._loaded().encode(
            texts, output_types=output_types, options=options, lengths=lengths
        )
        return out

    def score(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        instruction: str | None,
        options: Mapping[str, Any],
    ) -> list[float]:
        """Bi-encoder cosine relevance of the serving engine (``ScoreEngine.score``)."""
        out: list[float] = self._loaded().score(pairs, instruction=instruction, options=options)
        return out
