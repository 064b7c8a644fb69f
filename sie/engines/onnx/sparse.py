"""SPLADE sparse embeddings on ONNX Runtime (served from the bundle module
``sie.engines.onnx.encoders``; adapter ``sie.engines.onnx.encoders:OnnxSparseEncoder``).

The same outputs as ``sie.engines.encoders.sentence_transformers.SparseEncoder``
(docs/api.md §2): per text ``(indices int32 ascending, values float32 > 0)`` over the
vocabulary. The exported graph is the masked-language-model head and the SPLADE
pooling together (``sparse_embedding`` float32 ``[batch, vocab]``): logits times the
attention mask, ``log1p(relu(.))`` (twice for ``log1p_relu``), then max (or sum) over
the tokens, exactly as ``SpladePooling``; so only the pooled rows leave the graph, not
the ``[batch, seq, vocab]`` logits.

Reproduced: a ``SparseEncoder`` of a ``Transformer`` (fill-mask) and a
``SpladePooling`` module, without query/document prompts. Anything else (a
``Router`` with separate query and document paths, prompts, other modules) is refused
(CONFIG): its torch profile serves it. Queries and documents therefore encode alike,
as they do in that torch pipeline. Runtime option ``max_active_dims`` (int) keeps the
largest weights (default: the model's own setting). A ``model.onnx`` the weights ship
is not used (its output is usually the logits): the graph is always exported.
Load, checks, int8 and the other options: ``sie.engines.onnx.base`` and
``sie.engines.onnx.encoders``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sie.core.errors import ModelLoadFailed
from sie.engines.onnx.base import OnnxEncoderBase
from sie.engines.onnx.graphs import module_inputs
from sie.engines.options import runtime_positive_int

__all__ = ["OnnxSparseEncoder"]


def _splade_module(mlm: Any, strategy: str, activation: str) -> Any:
    """A torch module: ``input_ids``, ``attention_mask``, ``token_type_ids`` →
    ``{"sparse_embedding": [batch, vocab]}`` (``SpladePooling`` over ``mlm``'s logits)."""
    import torch

    takes_types = bool(module_inputs(mlm, ["token_type_ids"]))

    class SpladeHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mlm = mlm

        def forward(
            self,
            input_ids: Any,
            attention_mask: Any,
            token_type_ids: Any = None,
            return_dict: bool = True,
        ) -> dict[str, Any]:
            extra = {"token_type_ids": token_type_ids} if takes_types else {}
            logits = self.mlm(
                input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **extra
            ).logits
            x = torch.log1p(torch.relu(logits * attention_mask.unsqueeze(-1).to(logits.dtype)))
            if activation == "log1p_relu":
                x = torch.log1p(x)
            return {"sparse_embedding": x.amax(dim=1) if strategy == "max" else x.sum(dim=1)}

    return SpladeHead().eval()


class OnnxSparseEncoder(OnnxEncoderBase):
    """SPLADE sparse embeddings on onnxruntime (module docstring)."""

    outputs: tuple[str, ...] = ("sparse",)
    st_class = "SparseEncoder"
    head = "splade"
    output_name = "sparse_embedding"
    shipped_graphs = False

    _dim = 0
    _pooling = ("max", "relu")
    _max_active: int | None = None

    @property
    def sparse_dim(self) -> int:
        return self._dim

    def _refuse(self, what: str) -> ModelLoadFailed:
        return ModelLoadFailed(
            f"model {self.config.sie_id!r}: {what}; the ONNX SPLADE engine cannot "
            "reproduce it (use a torch profile)",
            error_class="CONFIG",
            permanent=True,
        )

    def _check_reference(self, reference: Any) -> None:
        kinds = [type(m).__name__ for m in reference]
        if len(kinds) != 2 or kinds[1] != "SpladePooling" or "Transformer" not in kinds[0]:
            raise self._refuse(f"the pipeline is {kinds}, not Transformer + SpladePooling")
        if any(p for p in (getattr(reference, "prompts", None) or {}).values()):
            raise self._refuse("the model has query/document prompts")
        pooling = reference[1]
        self._pooling = (str(pooling.pooling_strategy), str(pooling.activation_function))
        self._max_active = getattr(reference, "max_active_dims", None)
        mlm = self._export_module(reference)[0]
        self._dim = int(mlm.mlm.config.vocab_size)
        declared = self.config.dims.get("sparse")
        if declared is not None and declared != self._dim:
            raise ModelLoadFailed(
                f"model {self.config.sie_id!r}: tasks.encode.sparse.dim is {declared} but the "
                f"vocabulary has {self._dim} entries; fix the config",
                error_class="CONFIG",
                permanent=True,
            )

    def _export_module(self, reference: Any) -> tuple[Any, str]:
        first = reference[0]
        mlm = getattr(first, "auto_model", None) or first.model
        return _splade_module(mlm, *self._pooling), "sparse_embedding"

    def _reference_outputs(self, reference: Any, texts: list[str]) -> dict[str, Any]:
        import torch

        with torch.inference_mode():
            feats = reference.forward(reference.preprocess(list(texts)))
        return {"sparse": list(feats["sentence_embedding"].float().numpy())}

    def _rows(self, texts: Sequence[str], lengths: Sequence[int] | None) -> np.ndarray:
        """``[len(texts), vocab]`` SPLADE weights (dense), in input order."""
        inputs, sessions = self._loaded()
        rows = np.empty((len(texts), self._dim), dtype=np.float32)
        chunks = self._chunks(texts, lengths)
        passes = inputs.passes(texts, chunks)
        for chunk, out in zip(chunks, sessions.run_all(passes), strict=True):
            rows[chunk] = out
        return rows

    def _check_outputs(self, texts: list[str]) -> dict[str, Any]:
        return {"sparse": list(self._rows(texts, None))}

    def _gate_vectors(self, texts: list[str]) -> np.ndarray:
        return self._rows(texts, None)

    def encode(
        self,
        texts: Sequence[str],
        *,
        output_types: Sequence[str],
        options: Mapping[str, Any],
        lengths: Sequence[int] | None = None,
    ) -> dict[str, Any]:
        """``{"sparse": [(indices int32 (nnz,), values float32 (nnz,)), ...]}``.

        Raises:
            InvalidInput: ``max_active_dims`` is not a positive integer.
            InferenceError: not loaded, or onnxruntime failed.
        """
        max_active = runtime_positive_int(options, "max_active_dims") or self._max_active
        out: list[tuple[np.ndarray, np.ndarray]] = []
        for row in self._rows(texts, lengths):
            if max_active is not None and np.count_nonzero(row > 0) > max_active:
                keep = np.argpartition(-row, max_active - 1)[:max_active]
                kept = np.zeros_like(row)
                kept[keep] = row[keep]
                row = kept
            idx = np.flatnonzero(row > 0)
            out.append((idx.astype(np.int32), row[idx].astype(np.float32)))
        return {"sparse": out}

    def score(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        instruction: str | None,
        options: Mapping[str, Any],
    ) -> list[float]:
        """Sparse relevance as ``SparseEncoder.score``: the dot product of the query's
        (rendered with ``is_query``) and the doc's SPLADE weights."""
        qv, dv = self._encode_pairs(pairs, instruction, options, "sparse", options)
        qd = {q: dict(zip(i.tolist(), v.tolist(), strict=True)) for q, (i, v) in qv.items()}
        dd = {d: dict(zip(i.tolist(), v.tolist(), strict=True)) for d, (i, v) in dv.items()}
        return [float(sum(w * dd[d].get(k, 0.0) for k, w in qd[q].items())) for q, d in pairs]
