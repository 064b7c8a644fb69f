"""sentence-transformers engines (bundle module ``sie.engines.sentence_transformers``).

``DenseEncoder``: ``SentenceTransformer`` → ``dense: float32 [n, dim]`` and
``multivector`` (per-token embeddings); scores by cosine for ``tasks.score`` models.
``SparseEncoder``: SPLADE through ``sentence_transformers.SparseEncoder`` →
``sparse`` ``(indices int32 ascending, values float32 > 0)`` per text over the
vocabulary (reference §1.5).
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
from sie.core.errors import InferenceError, InvalidInput, ModelLoadFailed
from sie.core.templates import render_input
from sie.engines.batching import plan_padding_chunks
from sie.engines.weights import resolve_weights

__all__ = ["DenseEncoder", "SparseEncoder"]


def _l2(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` scaled to unit length (zero rows stay zero)."""
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.where(norm > 0, norm, 1.0)).astype(np.float32)


def _torch_bytes(model: Any) -> int:
    """Parameter plus buffer bytes of a torch module (0 when not loaded)."""
    if model is None:
        return 0
    tensors = [*model.parameters(), *model.buffers()]
    return int(sum(t.numel() * t.element_size() for t in tensors))


class DenseEncoder:
    """Dense text embeddings from a sentence-transformers model directory."""

    outputs: tuple[str, ...] = ("dense", "multivector")

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
    ) -> dict[str, Any]:
        """``dense``: float32 ``(n, dim)``; ``multivector``: per text a float32
        ``(num_tokens, dim)`` array of the transformer's token embeddings, padding
        tokens removed (one forward pass serves both). ``normalize`` L2-normalises
        the dense rows and each token vector."""
        if self._model is None:
            raise InferenceError(f"model {self.config.sie_id!r} is not loaded")
        normalize = bool(options.get("normalize", False))
        want_multi = "multivector" in output_types
        dense = np.empty((len(texts), self.dim), dtype=np.float32)
        multi: list[np.ndarray] = [np.empty((0, self.dim), dtype=np.float32)] * len(texts)
        for chunk in self._chunks(texts, lengths):
            batch = [texts[i] for i in chunk]
            try:
                if not want_multi:
                    dense[chunk] = self._model.encode(
                        batch,
                        batch_size=len(chunk),
                        convert_to_numpy=True,
                        normalize_embeddings=normalize,
                        show_progress_bar=False,
                    )
                    continue
                rows = self._model.encode(
                    batch, batch_size=len(chunk), output_value=None, show_progress_bar=False
                )
            except Exception as exc:
                raise InferenceError(f"encode failed: {exc}") from exc
            for i, row in zip(chunk, rows, strict=True):
                vec = row["sentence_embedding"].float().cpu().numpy()
                dense[i] = _l2(vec) if normalize else vec
                mask = row["attention_mask"].bool().cpu().numpy()
                tokens = row["token_embeddings"].float().cpu().numpy()[mask]  # no padding
                multi[i] = _l2(tokens) if normalize else tokens
        out: dict[str, Any] = {}
        if "dense" in output_types:
            out["dense"] = dense
        if want_multi:
            out["multivector"] = multi
        return out

    def score(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        instruction: str | None,
        options: Mapping[str, Any],
    ) -> list[float]:
        """Bi-encoder relevance: cosine of the query's and each doc's dense vectors
        (query rendered with ``is_query``, docs without), for models whose config
        declares ``tasks.score``."""
        queries = sorted({q for q, _ in pairs})
        docs = sorted({d for _, d in pairs})
        q_in, _ = self.prepare(queries, instruction=instruction, is_query=True, options=options)
        d_in, _ = self.prepare(docs, instruction=None, is_query=False, options=options)
        vecs = self.encode([*q_in, *d_in], output_types=("dense",), options={"normalize": True})
        unit = vecs["dense"]
        qv = dict(zip(queries, unit[: len(queries)], strict=True))
        dv = dict(zip(docs, unit[len(queries) :], strict=True))
        return [float(np.dot(qv[q], dv[d])) for q, d in pairs]

    def memory_bytes(self) -> int:
        return _torch_bytes(self._model)

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


class SparseEncoder(DenseEncoder):
    """SPLADE sparse embeddings (``sentence_transformers.SparseEncoder``).

    Queries are encoded with ``encode_query`` and documents with ``encode_document``
    (the model's own prompts/heads for each side). Each text becomes ``(indices,
    values)``: the non-zero vocabulary dimensions, ascending, with values > 0.
    Runtime option ``max_active_dims`` (int) keeps only the largest weights.
    """

    outputs = ("sparse",)

    def load(self) -> None:
        path = resolve_weights(self.config)
        try:
            from sentence_transformers import SparseEncoder as StSparseEncoder
        except ImportError as exc:
            raise ModelLoadFailed(
                "sentence-transformers is not installed (pip install 'sie[st]')",
                error_class="DEPENDENCY",
                permanent=True,
            ) from exc
        try:
            model = StSparseEncoder(str(path), device=self.device, local_files_only=True)
        except Exception as exc:
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
        # the output width is the MLM vocabulary; get_embedding_dimension() reports the
        # last module's hidden size for some checkpoints, so measure it once
        try:
            self._dim = int(model.encode(["probe"], convert_to_sparse_tensor=True).shape[-1])
        except Exception as exc:
            raise ModelLoadFailed(
                f"model {self.config.sie_id!r} loaded but cannot encode: {exc}",
                error_class="UNKNOWN",
                permanent=True,
            ) from exc
        enc = self.config.tasks.encode
        declared = enc.sparse.dim if enc is not None and enc.sparse is not None else None
        if declared is not None and declared != self._dim:
            raise ModelLoadFailed(
                f"model {self.config.sie_id!r}: tasks.encode.sparse.dim is {declared} but the "
                f"vocabulary has {self._dim} dimensions; fix the config",
                error_class="CONFIG",
                permanent=True,
            )
        backend = getattr(model.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            backend = copy.deepcopy(backend)
            backend.no_truncation()
            backend.no_padding()
        self._counter = backend

    @property
    def sparse_dim(self) -> int:
        return self._dim

    def encode(
        self,
        texts: Sequence[str],
        *,
        output_types: Sequence[str],
        options: Mapping[str, Any],
        lengths: Sequence[int] | None = None,
    ) -> dict[str, Any]:
        """``{"sparse": [(indices int32 (nnz,), values float32 (nnz,)), ...]}``."""
        if self._model is None:
            raise InferenceError(f"model {self.config.sie_id!r} is not loaded")
        max_active = options.get("max_active_dims")
        if max_active is not None and (
            isinstance(max_active, bool) or not isinstance(max_active, int) or max_active < 1
        ):
            raise InvalidInput(
                "params.options.max_active_dims must be a positive integer",
                field="params.options.max_active_dims",
            )
        is_query = bool(options.get("is_query", False))
        fn = self._model.encode_query if is_query else self._model.encode_document
        out: list[tuple[np.ndarray, np.ndarray]] = [
            (np.empty(0, np.int32), np.empty(0, np.float32))
        ] * len(texts)
        for chunk in self._chunks(texts, lengths):
            try:
                rows = fn(
                    [texts[i] for i in chunk],
                    batch_size=len(chunk),
                    convert_to_sparse_tensor=True,
                    max_active_dims=max_active,
                    show_progress_bar=False,
                ).coalesce()
            except Exception as exc:
                raise InferenceError(f"encode failed: {exc}") from exc
            idx = rows.indices().cpu().numpy()
            vals = rows.values().float().cpu().numpy()
            for j, i in enumerate(chunk):
                sel = (idx[0] == j) & (vals > 0)
                order = np.argsort(idx[1][sel], kind="stable")
                out[i] = (idx[1][sel][order].astype(np.int32), vals[sel][order])
        return {"sparse": out}

    def score(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        instruction: str | None,
        options: Mapping[str, Any],
    ) -> list[float]:
        """Sparse relevance: dot product of the query's and the doc's SPLADE weights."""
        queries = sorted({q for q, _ in pairs})
        docs = sorted({d for _, d in pairs})
        qs = self.encode(
            self.prepare(queries, instruction=instruction, is_query=True, options=options)[0],
            output_types=("sparse",),
            options={"is_query": True},
        )["sparse"]
        ds = self.encode(
            self.prepare(docs, instruction=None, is_query=False, options=options)[0],
            output_types=("sparse",),
            options={},
        )["sparse"]
        qd = {
            q: dict(zip(i.tolist(), v.tolist(), strict=True))
            for q, (i, v) in zip(queries, qs, strict=True)
        }
        dd = {
            d: dict(zip(i.tolist(), v.tolist(), strict=True))
            for d, (i, v) in zip(docs, ds, strict=True)
        }
        return [float(sum(w * dd[d].get(k, 0.0) for k, w in qd[q].items())) for q, d in pairs]
