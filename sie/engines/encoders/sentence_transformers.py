"""sentence-transformers engines (bundle module ``sie.engines.encoders.sentence_transformers``).

``DenseEncoder``: ``SentenceTransformer`` → ``dense: float32 [n, dim]`` and
``multivector`` (per-token embeddings); scores by cosine for ``tasks.score`` models.
``SparseEncoder``: SPLADE through ``sentence_transformers.SparseEncoder`` →
``sparse`` ``(indices int32 ascending, values float32 > 0)`` per text over the
vocabulary (docs/api.md §2).
Profile options: loadtime ``trust_remote_code``; runtime ``normalize`` (bool,
L2-normalise), ``query_template`` / ``doc_template`` (``sie.core.templates``).
torch and sentence-transformers are imported in ``load`` only (extra ``st``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from sie.core.config import ModelConfig, ResolvedProfile
from sie.core.errors import InferenceError, ModelLoadFailed
from sie.core.templates import render_input
from sie.engines.encoders.torchscript import TracedEncoder, trace_st_encoder
from sie.engines.options import runtime_positive_int
from sie.engines.runtime.batching import plan_padding_chunks
from sie.engines.tokens import counting_tokenizer, torch_bytes
from sie.engines.truncation import apply_truncation
from sie.engines.weights import resolve_weights

T = TypeVar("T")

__all__ = ["DenseEncoder", "SparseEncoder", "load_st_model", "probe_loaded"]


def _l2(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` scaled to unit length (zero rows stay zero)."""
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.where(norm > 0, norm, 1.0)).astype(np.float32)


def probe_loaded(config: ModelConfig, task: str, call: Callable[[], T]) -> T:
    """Run one small ``call`` on a just-loaded model (a warm-up or a measurement) and
    return its result.

    Raises:
        ModelLoadFailed: the call failed (permanent: the weights load but cannot ``task``).
    """
    try:
        return call()
    except Exception as exc:
        raise ModelLoadFailed(
            f"model {config.sie_id!r} loaded but cannot {task}: {exc}",
            error_class="UNKNOWN",
            permanent=True,
        ) from exc


def load_st_model(
    config: ModelConfig, profile: ResolvedProfile, device: str, class_name: str, **kwargs: Any
) -> Any:
    """Construct ``sentence_transformers.<class_name>`` from the config's weights, offline.

    ``max_sequence_length`` caps the model's window (never raises it).

    Raises:
        ModelLoadFailed: weights not found (NOT_FOUND), sentence-transformers missing
            (DEPENDENCY), or the library failed to load them (UNKNOWN); all permanent.
    """
    path = resolve_weights(config)
    try:
        cls = getattr(importlib.import_module("sentence_transformers"), class_name)
    except (ImportError, AttributeError) as exc:
        raise ModelLoadFailed(
            f"sentence-transformers with {class_name} is not installed (pip install 'sie[st]')",
            error_class="DEPENDENCY",
            permanent=True,
        ) from exc
    try:
        model = cls(
            str(path),
            device=device,
            trust_remote_code=bool(profile.loadtime.get("trust_remote_code", False)),
            local_files_only=True,
            **kwargs,
        )
    except Exception as exc:  # library raises OSError/ValueError/RuntimeError variously
        raise ModelLoadFailed(
            f"loading {config.sie_id!r} from {str(path)!r} failed: {exc}",
            error_class="UNKNOWN",
            permanent=True,
        ) from exc
    window = getattr(model, "max_seq_length", None)
    if config.max_sequence_length and window is not None:
        model.max_seq_length = min(config.max_sequence_length, window or 10**9)
    model.eval()
    return model


def _check_declared_dim(config: ModelConfig, output: str, actual: int) -> None:
    """``tasks.encode.<output>.dim``, when declared, must match the weights.

    Raises:
        ModelLoadFailed: (CONFIG, permanent) they differ.
    """
    declared = config.dims.get(output)
    if declared is not None and declared != actual:
        raise ModelLoadFailed(
            f"model {config.sie_id!r}: tasks.encode.{output}.dim is {declared} but the "
            f"weights produce {actual} dimensions; fix the config",
            error_class="CONFIG",
            permanent=True,
        )


class DenseEncoder:
    """Dense text embeddings from a sentence-transformers model directory."""

    outputs: tuple[str, ...] = ("dense", "multivector")
    #: Task methods may run on several threads at once (sie.engines.runtime.threads): torch
    #: modules in inference mode, and a tokenizer configured once by ``load``'s warm-up
    #: call (later calls only read its truncation/padding settings).
    concurrent_calls = 8

    def __init__(self, config: ModelConfig, profile: ResolvedProfile, device: str = "cpu") -> None:
        self.config = config
        self.profile = profile
        self.device = device
        self._model: Any = None
        self._counter: Any = None
        self._traced: TracedEncoder | None = None
        self._dim = 0

    def load(self) -> None:
        model = load_st_model(self.config, self.profile, self.device, "SentenceTransformer")
        self._model = model
        get_dim: Any = (
            getattr(model, "get_embedding_dimension", None)
            or model.get_sentence_embedding_dimension
        )
        self._dim = int(get_dim())
        _check_declared_dim(self.config, "dense", self._dim)
        self._counter = counting_tokenizer(model.tokenizer)
        # warm-up: torch's lazy init, and the tokenizer's settings, before any request
        probe_loaded(
            self.config, "encode", lambda: model.encode(["warm-up"], show_progress_bar=False)
        )
        # CPU: the transformer as one GIL-free call when it matches eager exactly
        self._traced = trace_st_encoder(model) if self.device.startswith("cpu") else None

    def unload(self) -> None:
        self._model = None
        self._counter = None
        self._traced = None

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
        if self._counter is None:  # no fast tokenizer: estimate, docs/api.md §10 char count
            apply_truncation(None, rendered, rendered, options, window, self.config.sie_id)
            return rendered, [max(1, min(window, len(t) // 4)) for t in rendered]
        clipped = [self._clip(t, window) for t in rendered]
        # options truncate / max_input_tokens (docs/api.md §6)
        clipped = apply_truncation(
            self._counter, rendered, clipped, options, window, self.config.sie_id
        )
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
            if self._traced is not None:
                self._encode_traced(batch, chunk, dense, multi if want_multi else None, normalize)
                continue
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

    def _encode_traced(
        self,
        batch: list[str],
        chunk: list[int],
        dense: np.ndarray,
        multi: list[np.ndarray] | None,
        normalize: bool,
    ) -> None:
        """One forward pass through the traced encoder, written into ``dense`` (and
        ``multi``) at ``chunk``'s rows; the same numbers as ``SentenceTransformer.encode``."""
        import torch

        assert self._traced is not None
        try:
            feats = self._traced(batch)
        except Exception as exc:
            raise InferenceError(f"encode failed: {exc}") from exc
        emb = feats["sentence_embedding"]
        if normalize:
            emb = torch.nn.functional.normalize(emb, p=2, dim=1)
        dense[chunk] = emb.float().numpy()
        if multi is None:
            return
        masks = feats["attention_mask"].bool().numpy()
        tokens = feats["token_embeddings"].float().numpy()
        for row, i in enumerate(chunk):
            vecs = tokens[row][masks[row]]  # no padding
            multi[i] = _l2(vecs) if normalize else vecs

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
        # unit vectors: clip the float32 rounding that puts identical texts above 1
        return [float(np.clip(np.dot(qv[q], dv[d]), -1.0, 1.0)) for q, d in pairs]

    def memory_bytes(self) -> int:
        return torch_bytes(self._model)

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
        model = load_st_model(self.config, self.profile, self.device, "SparseEncoder")
        self._model = model
        # the output width is the MLM vocabulary; get_embedding_dimension() reports the
        # last module's hidden size for some checkpoints, so measure it once
        self._dim = probe_loaded(
            self.config,
            "encode",
            lambda: int(
                model.encode(
                    ["probe"], convert_to_sparse_tensor=True, show_progress_bar=False
                ).shape[-1]
            ),
        )
        _check_declared_dim(self.config, "sparse", self._dim)
        self._counter = counting_tokenizer(model.tokenizer)

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
        max_active = runtime_positive_int(options, "max_active_dims")
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
            options={**options, "is_query": True},
        )["sparse"]
        ds = self.encode(
            self.prepare(docs, instruction=None, is_query=False, options=options)[0],
            output_types=("sparse",),
            options={**options, "is_query": False},
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
