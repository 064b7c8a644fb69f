"""sentence-transformers engines (bundle module ``sie.engines.sentence_transformers``).

``DenseEncoder``: ``SentenceTransformer`` → ``dense: float32 [n, dim]``.
Profile options: loadtime ``trust_remote_code``; runtime ``normalize`` (bool,
L2-normalise), ``query_template`` / ``doc_template`` (``{text}``, ``{instruction}``).
torch and sentence-transformers are imported in ``load`` only (extra ``st``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sie.core.config import ModelConfig, ResolvedProfile
from sie.core.errors import InferenceError, InvalidInput, ModelLoadFailed
from sie.engines.batching import plan_padding_chunks
from sie.engines.weights import resolve_weights

__all__ = ["DenseEncoder", "apply_template"]


def apply_template(
    text: str, instruction: str | None, is_query: bool, options: Mapping[str, Any]
) -> str:
    """Reference §3.1 templates: ``query_template`` when ``is_query``, else
    ``doc_template``; without a template a non-empty instruction is prefixed."""
    name = "query_template" if is_query else "doc_template"
    template = options.get(name)
    if template:
        try:
            return str(template).format(text=text, instruction=instruction or "")
        except (KeyError, IndexError, ValueError) as exc:
            raise InvalidInput(
                f"options.{name}: {template!r} may only use the fields {{text}} and {{instruction}} ({exc!r})",
                field=f"params.options.{name}",
            ) from exc
    return f"{instruction} {text}" if instruction else text


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
        """A whitespace-bounded prefix holding at least ``window`` tokens, else ``text``.

        Encoding the prefix under truncation gives exactly the tokens of the full
        text, so huge inputs cost a bounded amount of tokenisation and inference.
        """
        n = window * 32
        while n < len(text):
            cut = max(text.rfind(" ", 0, n), text.rfind("\n", 0, n), text.rfind("\t", 0, n))
            if cut > 0:
                prefix = text[:cut]
                if len(self._counter.encode(prefix, add_special_tokens=False).ids) >= window:
                    return prefix
            n *= 4
        return text

    def prepare(self, texts: Sequence[str]) -> tuple[list[str], list[int]]:
        window = int(self._model.max_seq_length)
        if self._counter is None:  # no fast tokenizer: estimate, reference §4.6 char count
            return list(texts), [max(1, min(window, len(t) // 4)) for t in texts]
        clipped = [self._clip(t, window) for t in texts]
        encs = self._counter.encode_batch(clipped)
        return clipped, [max(1, min(window, len(e.ids))) for e in encs]

    def encode(
        self,
        texts: Sequence[str],
        *,
        output_types: Sequence[str],
        instruction: str | None,
        is_query: bool,
        options: Mapping[str, Any],
    ) -> dict[str, np.ndarray]:
        if self._model is None:
            raise InferenceError(f"model {self.config.sie_id!r} is not loaded")
        prepared = [apply_template(t, instruction, is_query, options) for t in texts]
        normalize = bool(options.get("normalize", False))
        out = np.empty((len(prepared), self.dim), dtype=np.float32)
        for chunk in self._chunks(prepared):
            try:
                vecs = self._model.encode(
                    [prepared[i] for i in chunk],
                    batch_size=len(chunk),
                    convert_to_numpy=True,
                    normalize_embeddings=normalize,
                    show_progress_bar=False,
                )
            except Exception as exc:
                raise InferenceError(f"encode failed: {exc}") from exc
            out[chunk] = vecs
        return {"dense": out}

    def _chunks(self, texts: Sequence[str]) -> list[list[int]]:
        """Length-bucketed forward passes (``plan_padding_chunks``): less padding, same vectors."""
        if self._counter is None or len(texts) <= 8:
            return [list(range(len(texts)))]
        window = int(self._model.max_seq_length)
        lengths = [min(window, len(e.ids)) for e in self._counter.encode_batch(list(texts))]
        return plan_padding_chunks(lengths)
