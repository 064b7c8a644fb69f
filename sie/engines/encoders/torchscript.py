"""A TorchScript trace of a sentence-transformers text encoder's transformer.

Eager PyTorch takes the GIL back between every tensor op (a MiniLM forward pass is
a few hundred ops), so an engine thread competes for it with the event loop and with
other engine threads; each hand-over can wait for Python's switch interval. A traced
transformer runs the whole pass in one call that holds no GIL, with the same aten ops
and so the same numbers. On 2 cores, two concurrent 1-thread MiniLM calls next to a
busy Python thread encode about 1.1x more sentences/s traced than eager
(``bench/bench_encode.py`` measures the served effect).

Only the common pipeline is traced: a ``Transformer`` first module whose forward
returns ``last_hidden_state`` as ``token_embeddings`` (BERT-style encoders), followed
by modules (pooling, dense, normalize) that stay eager. The trace is checked against
the eager pipeline at load on texts with and without padding and with truncation; any
difference above ``TOLERANCE``, or any failure, keeps the eager path (logged).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import Any

__all__ = ["TOLERANCE", "TracedEncoder", "trace_st_encoder"]

log = logging.getLogger(__name__)

#: Largest absolute difference from the eager pipeline the trace may show.
TOLERANCE = 1e-6

_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class TracedEncoder:
    """``texts -> features`` like ``SentenceTransformer.forward(preprocess(texts))``:
    ``sentence_embedding`` ``(batch, dim)``, ``token_embeddings`` ``(batch, seq, hidden)``
    and ``attention_mask`` ``(batch, seq)``, as CPU torch tensors. Thread-safe."""

    def __init__(self, model: Any, traced: Any, names: Sequence[str]) -> None:
        self._model = model
        self._traced = traced
        self._names = tuple(names)
        self._rest = list(model)[1:]

    def __call__(self, texts: Sequence[str]) -> dict[str, Any]:
        import torch

        with torch.inference_mode():
            features: dict[str, Any] = self._model.preprocess(list(texts))
            features["token_embeddings"] = self._traced(*(features[k] for k in self._names))
            for module in self._rest:
                features = module(features)
        return features


def _traceable(model: Any) -> Any:
    """The HF model inside ``model``'s first module when the pipeline is the plain
    text-encoder shape this module traces, else ``None``."""
    first = next(iter(model), None)
    if type(first).__name__ != "Transformer":
        return None
    config = getattr(first, "modality_config", {}).get("text", {})
    if config.get("method") != "forward" or config.get("method_output_name") not in (
        "last_hidden_state",
        ("last_hidden_state",),
        ["last_hidden_state"],
    ):
        return None
    if getattr(first, "module_output_name", "token_embeddings") != "token_embeddings":
        return None
    hf = getattr(first, "auto_model", None) or getattr(first, "model", None)
    if hf is None or getattr(getattr(hf, "config", None), "output_hidden_states", False):
        return None
    return hf


def trace_st_encoder(model: Any) -> TracedEncoder | None:
    """Trace ``model`` (a loaded CPU ``SentenceTransformer``) and check it against the
    eager pipeline; ``None`` (eager stays) when it is not the traceable shape, the
    trace fails, or any output differs by more than ``TOLERANCE``. Never raises."""
    try:
        import torch

        hf = _traceable(model)
        if hf is None:
            return None
        window = int(model.max_seq_length or 512)
        example = model.preprocess(["a", "a padded example with a few more words"])
        names = [k for k in _INPUTS if isinstance(example.get(k), torch.Tensor)]
        extra = [k for k, v in example.items() if isinstance(v, torch.Tensor) and k not in names]
        if "input_ids" not in names or extra:
            return None

        class _Forward(torch.nn.Module):
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, *tensors: Any) -> Any:
                kwargs = dict(zip(names, tensors, strict=True))
                return self.inner(**kwargs, return_dict=True)["last_hidden_state"]

        # The tracer reads every module attribute, properties included: transformers
        # then logs about a loss function inference never uses. Quiet it meanwhile.
        hf_log = logging.getLogger("transformers.modeling_utils")
        level = hf_log.level
        hf_log.setLevel(logging.ERROR)
        try:
            with torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # tracer notes on Python-side branches
                traced = torch.jit.trace(  # type: ignore[no-untyped-call]
                    _Forward(hf).eval(), tuple(example[k] for k in names), check_trace=False
                )
        finally:
            hf_log.setLevel(level)
        encoder = TracedEncoder(model, traced, names)
        probes = [
            ["warm-up"],  # no padding
            ["short", "a longer text that needs padding in the batch", "mid length text"],
            ["word " * (window * 2), "tiny"],  # truncated to the window
        ]
        for texts in probes:
            got = encoder(texts)
            with torch.inference_mode():
                want = model.forward(model.preprocess(list(texts)))
            for key in ("sentence_embedding", "token_embeddings"):
                diff = float((got[key] - want[key]).abs().max())
                if not diff <= TOLERANCE:
                    log.warning("traced encoder differs from eager (%s: %g); eager kept", key, diff)
                    return None
        return encoder
    except Exception as exc:  # any surprise: eager stays, and says why
        log.warning("encoder not traced (%s: %s); eager kept", type(exc).__name__, exc)
        return None
