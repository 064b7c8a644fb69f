"""ONNX Runtime text encoders (bundle module ``sie.engines.onnx.encoders``).

``OnnxDenseEncoder``: a sentence-transformers text encoder (``Transformer`` →
``Pooling`` mean or CLS → optional ``Normalize``) run by onnxruntime →
``dense: float32 [n, dim]`` and ``multivector`` (per text the transformer's token
embeddings ``float32 [tokens, dim]``, padding removed), the same outputs as
``sie.engines.encoders.sentence_transformers.DenseEncoder`` (docs/api.md §2), and
``score`` by cosine for models whose config declares ``tasks.score``.
``OnnxSparseEncoder`` (``sie.engines.onnx.sparse``): SPLADE, as ``SparseEncoder``.

Load and checks: ``sie.engines.onnx.base`` (docs/performance.md "ONNX Runtime
engines"): the float32 graph must match the torch pipeline within cosine 0.99999, an
int8 one must keep the int8 bound against float32, else ``ModelLoadFailed`` (CONFIG);
the model's torch profiles are unaffected. int8 runs one text per session call.

Profile options: ``compute_precision`` (unset/``float32`` or ``int8``); loadtime
``trust_remote_code`` (the reference load), ``onnx_file`` (a graph inside the weights
directory to use instead of exporting), ``intra_op_num_threads`` (the cores to share;
default this process's), ``int8_min_cosine`` / ``int8_mean_cosine`` /
``int8_min_top10`` (the int8 bound, ``sie.engines.onnx.checks``),
``int8_activation_scales`` (``tensor``, the default, or ``token``:
``sie.engines.onnx.quantize``); runtime ``normalize``
(bool: L2-normalise dense rows and token vectors; dense rows are unit length anyway
when the pipeline has a ``Normalize`` module), ``query_template`` / ``doc_template``
(``sie.core.templates``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sie.core.errors import ModelLoadFailed
from sie.engines.onnx.base import OnnxEncoderBase
from sie.engines.onnx.graphs import StPipeline, read_st_pipeline
from sie.engines.onnx.sparse import OnnxSparseEncoder

__all__ = ["OnnxDenseEncoder", "OnnxSparseEncoder"]


def _l2(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` scaled to unit length (zero rows stay zero)."""
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.where(norm > 0, norm, 1.0)).astype(np.float32)


class OnnxDenseEncoder(OnnxEncoderBase):
    """Dense and multivector text embeddings on onnxruntime (module docstring)."""

    outputs: tuple[str, ...] = ("dense", "multivector")

    _pipeline = StPipeline("mean", False, False)
    _dim = 0

    @property
    def dim(self) -> int:
        return self._dim

    def _read_pipeline(self, root: Path) -> None:
        self._pipeline = read_st_pipeline(root, self.config.sie_id)
        self._lowercase = self._pipeline.lowercase

    def _check_reference(self, reference: Any) -> None:
        get_dim: Any = (
            getattr(reference, "get_embedding_dimension", None)
            or reference.get_sentence_embedding_dimension
        )
        self._dim = int(get_dim() or 0)
        declared = self.config.dims.get("dense")
        if declared is not None and declared != self._dim:
            raise ModelLoadFailed(
                f"model {self.config.sie_id!r}: tasks.encode.dense.dim is {declared} but the "
                f"weights produce {self._dim} dimensions; fix the config",
                error_class="CONFIG",
                permanent=True,
            )

    def _export_module(self, reference: Any) -> tuple[Any, str]:
        first = reference[0]
        return getattr(first, "auto_model", None) or first.model, "last_hidden_state"

    def _reference_outputs(self, reference: Any, texts: list[str]) -> dict[str, Any]:
        """``forward`` of ``preprocess``: the numbers ``SentenceTransformer.encode`` gives."""
        import torch

        with torch.inference_mode():
            feats = reference.forward(reference.preprocess(list(texts)))
        mask = feats["attention_mask"].bool().numpy()
        tokens = feats["token_embeddings"].float().numpy()
        return {
            "dense": feats["sentence_embedding"].float().numpy(),
            "multivector": [tokens[i][mask[i]] for i in range(len(texts))],
        }

    def _check_outputs(self, texts: list[str]) -> dict[str, Any]:
        """This engine's outputs for the parity check (no template, no option)."""
        return self.encode(texts, output_types=("dense", "multivector"), options={})

    def _gate_vectors(self, texts: list[str]) -> np.ndarray:
        out: np.ndarray = self.encode(texts, output_types=("dense",), options={})["dense"]
        return out

    def encode(
        self,
        texts: Sequence[str],
        *,
        output_types: Sequence[str],
        options: Mapping[str, Any],
        lengths: Sequence[int] | None = None,
    ) -> dict[str, Any]:
        """``dense``: float32 ``(n, dim)``; ``multivector``: per text float32
        ``(num_tokens, dim)``, padding removed (one forward pass serves both).
        ``normalize`` L2-normalises dense rows and each token vector.

        Raises:
            InferenceError: not loaded, or onnxruntime failed.
        """
        inputs, sessions = self._loaded()
        normalize = bool(options.get("normalize", False))
        unit_dense = normalize or self._pipeline.normalize
        want_multi = "multivector" in output_types
        dense = np.empty((len(texts), self.dim), dtype=np.float32)
        multi: list[np.ndarray] = [np.empty((0, self.dim), dtype=np.float32)] * len(texts)
        chunks = self._chunks(texts, lengths)
        passes = inputs.passes(texts, chunks)
        for chunk, feats, out_ in zip(chunks, passes, sessions.run_all(passes), strict=True):
            hidden = out_.astype(np.float32, copy=False)
            mask = feats["attention_mask"]
            if self._pipeline.pooling == "cls":
                pooled = hidden[:, 0]
            else:
                weights = mask[..., None].astype(np.float32)
                pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            dense[chunk] = _l2(pooled) if unit_dense else pooled
            if want_multi:
                for row, i in enumerate(chunk):
                    vecs = hidden[row][mask[row].astype(bool)]  # no padding
                    multi[i] = _l2(vecs) if normalize else vecs
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
        """Bi-encoder relevance as ``DenseEncoder.score``: the cosine of the query's
        (rendered with ``is_query``) and each doc's dense vectors."""
        qv, dv = self._encode_pairs(pairs, instruction, options, "dense", {"normalize": True})
        return [float(np.clip(np.dot(qv[q], dv[d]), -1.0, 1.0)) for q, d in pairs]
