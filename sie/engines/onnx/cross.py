"""Cross-encoder rerankers on ONNX Runtime (bundle module ``sie.engines.onnx.cross``;
docs/performance.md "ONNX Runtime engines", "Cross-encoders on ONNX Runtime").

``OnnxCrossEncoderScorer``: the scores of
``sie.engines.scorers.cross_encoder.CrossEncoderScorer`` (docs/api.md §3: one float per
``(query, doc)`` pair, in input order, higher is more relevant) with the transformer
and its classification head run by onnxruntime: the graph is the sentence-transformers
``CrossEncoder``'s own Hugging Face model (``BertForSequenceClassification`` and the
like), exported with ``torch.onnx`` at the first load and cached by weights hash
(``sie.engines.onnx.export``; a ``model.onnx`` the weights ship is used instead), its
output the ``logits`` ``[batch, 1]``.

The same options as the torch engine: runtime ``activation`` (``"none"``, the default:
the raw logit; ``"sigmoid"``: squashed into (0, 1), same order; anything else is
``InvalidInput``); ``instruction`` is prepended to each query as
``f"{instruction} {query}"``; a pair is one sequence (``[CLS] query [SEP] doc [SEP]``,
``token_type_ids`` 0 then 1) truncated longest-first to the window: the config's
``max_sequence_length`` capped at the model's own (``sie.engines.onnx.pairs``). Equal pairs in one call are scored
once (they tie exactly); a pair's score does not depend on the rest of the batch
(padding is masked; int8 runs one pair per session call).

Reproduced: a ``CrossEncoder`` whose pipeline is one ``Transformer`` with a
single-logit (``num_labels=1``) sequence-classification head and no prompts; anything
else is refused (CONFIG) and its torch profile serves it.

Load (``sie.engines.onnx.base``): the float32 graph must give the torch
``CrossEncoder.predict`` logits within ``1e-4 + 1e-4 x |logit|`` on every probe pair
(padded, unpadded, truncated), and an int8 one (``compute_precision: int8``) must keep
the score bound against float32 (``sie.engines.onnx.cross_checks``), else
``ModelLoadFailed`` (CONFIG). Loadtime options: ``trust_remote_code``, ``onnx_file``,
``intra_op_num_threads`` (``sie.engines.onnx.encoders``), ``int8_max_score_diff`` /
``int8_min_spearman`` / ``int8_min_top10`` (the int8 bound).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sie.core.errors import InferenceError, ModelLoadFailed
from sie.engines.onnx.base import OnnxEncoderBase
from sie.engines.onnx.cross_checks import (
    GATE_QUERIES,
    ScoreInt8Bounds,
    check_score_int8,
    check_score_parity,
    score_parity_probes,
)
from sie.engines.onnx.pairs import PairInputs
from sie.engines.scorers.cross_encoder import activation_option

__all__ = ["OnnxCrossEncoderScorer"]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function without overflow for large ``|x|``."""
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64))))


class OnnxCrossEncoderScorer(OnnxEncoderBase):
    """Query-document relevance from a cross-encoder on onnxruntime (module docstring)."""

    st_class = "CrossEncoder"
    head = "cross-encoder"
    output_name = "logits"
    task = "score"
    inputs_class = PairInputs
    #: The parity check's largest logit difference to torch (set by ``load``).
    parity_max_diff: float | None = None

    def _refuse(self, what: str) -> ModelLoadFailed:
        return ModelLoadFailed(
            f"model {self.config.sie_id!r}: {what}; the ONNX cross-encoder engine cannot "
            "reproduce it (use a torch profile)",
            error_class="CONFIG",
            permanent=True,
        )

    def _check_reference(self, reference: Any) -> None:
        if int(getattr(reference, "num_labels", 0) or 0) != 1:
            raise ModelLoadFailed(
                f"model {self.config.sie_id!r}: a reranker needs a single-logit head, "
                f"but the weights have num_labels={getattr(reference, 'num_labels', None)}",
                error_class="CONFIG",
                permanent=True,
            )
        modules = list(reference) if hasattr(reference, "__iter__") else []
        kinds = [type(m).__name__ for m in modules]
        if kinds != ["Transformer"]:
            raise self._refuse(f"the pipeline is {kinds}, not one Transformer")
        first = modules[0]
        task = str(getattr(first, "transformer_task", "sequence-classification"))
        if task != "sequence-classification":
            raise self._refuse(f"the transformer's task is {task!r}, not sequence-classification")
        if any(p for p in (getattr(reference, "prompts", None) or {}).values()):
            raise self._refuse("the model has prompts")
        self._lowercase = bool(getattr(first, "do_lower_case", False))

    def _export_module(self, reference: Any) -> tuple[Any, str]:
        first = reference[0]
        return getattr(first, "auto_model", None) or first.model, "logits"

    def _reference_logits(self, reference: Any, pairs: list[tuple[str, str]]) -> np.ndarray:
        """``CrossEncoder.predict``'s raw logits, called as ``CrossEncoderScorer`` calls it."""
        import torch

        scores = reference.predict(
            [[q, d] for q, d in pairs],
            batch_size=len(pairs),
            show_progress_bar=False,
            activation_fn=torch.nn.Identity(),
            convert_to_numpy=True,
        )
        return np.asarray(scores, dtype=np.float32).reshape(-1)

    def _check_parity(self, reference: Any, window: int) -> str:
        def candidate(pairs: list[tuple[str, str]]) -> np.ndarray:
            try:
                return self._logits(pairs)
            except InferenceError as exc:  # a graph that cannot run these inputs
                raise self._refuse(f"the graph fails on the parity probes ({exc})") from exc

        self.parity_max_diff = check_score_parity(
            self.config.sie_id,
            lambda pairs: self._reference_logits(reference, pairs),
            candidate,
            score_parity_probes(window),
        )
        return f"parity max logit difference {self.parity_max_diff:.3g}"

    def _int8_bounds(self, loadtime: Mapping[str, Any]) -> ScoreInt8Bounds:
        return ScoreInt8Bounds.from_loadtime(loadtime, self.config.sie_id)

    def _gate_vectors(self, texts: list[str]) -> np.ndarray:
        """``[len(GATE_QUERIES), len(texts)]`` logits: each gate query against every text."""
        pairs = [(q, t) for q in GATE_QUERIES for t in texts]
        return self._logits(pairs).reshape(len(GATE_QUERIES), len(texts))

    def _check_int8(self, want: np.ndarray, got: np.ndarray, bounds: Any) -> Any:
        return check_score_int8(self.config.sie_id, want, got, bounds)

    def _logits(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """float32 ``[len(pairs)]`` raw logits in input order (``PairInputs.rows``;
        length-bucketed batches, one pair per call for int8)."""
        inputs, sessions = self._loaded()
        if not isinstance(inputs, PairInputs):
            raise InferenceError(f"model {self.config.sie_id!r}: not loaded for pairs")
        rows = inputs.rows(pairs)
        out = np.empty(len(rows), dtype=np.float32)
        chunks = self._chunks(pairs, [len(ids) for ids, _ in rows])
        passes = [inputs.pad([rows[i] for i in chunk]) for chunk in chunks]
        for chunk, logits in zip(chunks, sessions.run_all(passes), strict=True):
            if logits.ndim != 2 or logits.shape != (len(chunk), 1):
                raise InferenceError(
                    f"the cross-encoder graph returned logits of shape {logits.shape} for "
                    f"{len(chunk)} pairs, not ({len(chunk)}, 1)"
                )
            out[chunk] = logits[:, 0]
        return out

    def score(
        self,
        pairs: Sequence[tuple[str, str]],
        *,
        instruction: str | None,
        options: Mapping[str, Any],
    ) -> list[float]:
        """One score per pair, in input order (higher is more relevant): the logit, or
        its sigmoid with ``activation: sigmoid``.

        Raises:
            InvalidInput: ``activation`` is not one of ``ACTIVATIONS``.
            InferenceError: not loaded, or onnxruntime failed.
        """
        activation = activation_option(options)
        self._loaded()
        if not pairs:
            return []
        slots: dict[tuple[str, str], int] = {}
        order = [slots.setdefault((q, d), len(slots)) for q, d in pairs]
        rendered = [(f"{instruction} {q}" if instruction is not None else q, d) for q, d in slots]
        logits = self._logits(rendered)
        distinct = _sigmoid(logits) if activation == "sigmoid" else logits
        return [float(distinct[i]) for i in order]
