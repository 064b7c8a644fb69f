"""sentence-transformers engines (bundle module ``sie.engines.sentence_transformers``).

``DenseEncoder``: ``SentenceTransformer`` → ``dense: float32 [n, dim]``.
Profile options: loadtime ``trust_remote_code``; runtime ``normalize`` (bool,
L2-normalise), ``query_template`` / ``doc_template`` (``sie.core.templates``).
torch and sentence-transformers are imported in ``load`` only (extra ``st``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sie.core.config import ModelConfig, ResolvedProfile
from sie.core.errors import InferenceError, ModelLoadFailed
from sie.core.templates import render_input
from sie.engines.batching import plan_padding_chunks
from sie.engines.weights import resolve_weights

__all__ = ["DenseEncoder"]


class DenseEncoder:
    """Dense text embeddings from a sentence-transformers model directory."""

    outputs = ("dense",)

    def __init__(self, config: ModelConfig, profile: ResolvedProfile, device: str = "cpu") -> None:
        self.config = config
        self.profile = profile
        self.device = device
        self._model: Any = None
        self._counter: Any = None
        self._dim = 0

    def load(self) -> None:
        path = resolve_weights(self.config)
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ModelLoadFailed(
                "sentence-transformers is not installed (pip install 'sie[st]')",
                error_class="DEPENDENCY",
                permanent=True,
            ) from exc
        try:
            model = SentenceTransformer(
                str(path),
                device=self.device,
                trust_remote_code=bool(self.profile.loadtime.get("trust_remote_code", False)),
                local_files_only=True,
            )
        except Exception as exc:  # library raises OSError/ValueError/RuntimeError variously
            raise ModelLoadFailed(
                f"loading {self.config.sie_id!r} from {str(path)!r} failed: {exc}",
                error_class="UNKNOWN",
                permanent=True,
            ) from exc
        if self.config.max_sequence_length:
            model.max_seq_length = min(
                self.config.max_sequence_length, model.max_seq_length or 10**9
            )
        model.eval()
        self._model = model
        get_dim: Any = (
            getattr(model, "get_embedding_dimension", None)
            or model.get_sentence_embedding_dimension
        )
        self._dim = int(get_dim())
        enc = self.config.tasks.encode
        declared = enc.dense.dim if enc is not None and enc.dense is not None else None
        if declared is not None and declared != self._dim:
            raise ModelLoadFailed(
                f"model {self.config.sie_id!r}: tasks.encode.dense.dim is {declared} but the "
                f"weights produce {self._dim}-dimensional vectors; fix the config",
                error_class="CONFIG",
                permanent=True,
            )
        backend = getattr(model.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            # A private copy: the inference thread re-configures the shared tokenizer's
            # truncation/padding on every encode, so counting must not touch it.
            backend = copy.deepcopy(backend)
            backend.no_truncation()
            backend.no_padding()
        self._counter = backend

    def unload(self) -> None:
        self._model = None
        self._counter = None

    @property
    def dim(self) -> int:
        return self._dim

    def _clip(self, text: str, window: int) -> str:
        """A prefix of ``text`` that encodes exactly like it under truncation, else ``text``.

        Cut at ``n`` characters; the words wholly inside the cut tokenise as in the
        full text (only the last, possibly cut, word may differ). Once those words
        fill the ``window``, the prefix is enough. So a huge input costs a bounded
        amount of tokenisation and inference, whatever its script or spacing.
        """
        n = window * 32
        while n < len(text):
            words = self._counter.encode(text[:n], add_special_tokens=False).word_ids
            last = words[-1] if words else None
            if sum(1 for w in words if w != last) >= window:
                return text[:n]
            n *= 4
        return text

    def prepare(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None,
        is_query: bool,
        options: Mapping[str, Any],
    ) -> tuple[list[str], list[int]]:
        window = int(self._model.max_seq_length)
        rendered = [render_input(t, instruction, is_query, options) for t in texts]
        if self._counter is None:  # no fast tokenizer: estimate, reference §4.6 char count
            return rendered, [max(1, min(window, len(t) // 4)) for t in rendered]
        clipped = [self._clip(t, window) for t in rendered]
        encs = self._counter.encode_batch(clipped)
        return clipped, [max(1, min(window, len(e.ids))) for e in encs]

    def encode(
        self,
        texts: Sequence[str],
        *,
        output_types: Sequence[str],
        options: Mapping[str, Any],
        lengths: Sequence[int] | None = None,
    ) -> dict[str, np.ndarray]:
        if self._model is None:
            raise InferenceError(f"model {self.config.sie_id!r} is not loaded")
        normalize = bool(options.get("normalize", False))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for chunk in self._chunks(texts, lengths):
            try:
                vecs = self._model.encode(
                    [texts[i] for i in chunk],
                    batch_size=len(chunk),
                    convert_to_numpy=True,
                    normalize_embeddings=normalize,
                    show_progress_bar=False,
                )
            except Exception as exc:
                raise InferenceError(f"encode failed: {exc}") from exc
            out[chunk] = vecs
        return {"dense": out}

    def _chunks(
        self, texts: Sequence[str], lengths: Sequence[int] | None = None
    ) -> list[list[int]]:
        """Length-bucketed forward passes (``plan_padding_chunks``): less padding, same vectors."""
        if len(texts) <= 8 or (lengths is None and self._counter is None):
            return [list(range(len(texts)))]
        if lengths is None:
            window = int(self._model.max_seq_length)
            lengths = [min(window, len(e.ids)) for e in self._counter.encode_batch(list(texts))]
        return plan_padding_chunks(lengths)
