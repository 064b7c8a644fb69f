"""Choosing one token from one row of logits for the transformers engine's scheduler
(``sie.engines.generators.scheduler``; OpenAI semantics, docs/api.md §5.1), with vLLM's
order of operations so the two engines agree:

1. penalties over the completion so far (``frequency_penalty`` x count +
   ``presence_penalty`` if present; the prompt does not count), then ``logit_bias``;
2. temperature 0: the highest logit; else softmax at the temperature, ``top_p``
   nucleus, a draw from the sequence's own ``torch.Generator``;
3. ``response_format`` ``json_object``: a candidate whose bytes do not continue the
   JSON object (``json_mode``) is set aside and the next is tried: greedy in logit
   order; sampled by redrawing without it, then in probability order.

Log probabilities (``logprob_entries``) come from the raw row, before penalties,
biases and temperature (vLLM's default ``raw_logprobs``). torch is passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sie.core.errors import InferenceError
from sie.engines.generation import SamplingParams, logprob_entry
from sie.engines.generators.json_mode import JsonPrefix, pick

__all__ = ["adjust", "choose", "logprob_entries"]

#: Draws tried before a constrained sampled step falls back to probability order.
JSON_REDRAWS = 16


def adjust(torch: Any, raw: Any, sp: SamplingParams, out_ids: Sequence[int]) -> Any:
    """``raw`` (float32, ``[vocab]``) with the penalties and the bias applied (a new
    tensor; ``raw`` itself when neither is set)."""
    if not (sp.logit_bias or ((sp.presence_penalty or sp.frequency_penalty) and out_ids)):
        return raw
    row = raw.clone()
    n = row.numel()
    if out_ids and (sp.presence_penalty or sp.frequency_penalty):
        ids = torch.tensor([i for i in out_ids if i < n], dtype=torch.long)
        counts = torch.bincount(ids, minlength=n)[:n].to(row.dtype)
        row -= sp.frequency_penalty * counts + sp.presence_penalty * (counts > 0).to(row.dtype)
    for tid, bias in sp.logit_bias.items():
        if tid < n:
            row[tid] += bias
    return row


def _probs(torch: Any, row: Any, sp: SamplingParams) -> Any:
    probs = torch.softmax(row / sp.temperature, dim=-1)
    if sp.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        sorted_p[(cum - sorted_p) >= sp.top_p] = 0.0  # keep the smallest head >= top_p
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return probs


def choose(
    torch: Any,
    row: Any,
    sp: SamplingParams,
    generator: Any,
    json: JsonPrefix | None = None,
    table: list[bytes] | None = None,
    eos: frozenset[int] = frozenset(),
) -> tuple[int, JsonPrefix | None]:
    """The next token of ``row`` (adjusted logits) and, in JSON mode (``json`` and the
    tokenizer's ``table`` given), the JSON state after it.

    Raises:
        InferenceError: JSON mode and no token of the vocabulary continues the object.
    """
    if json is None or table is None:
        if sp.temperature == 0:
            return int(torch.argmax(row)), None
        return int(torch.multinomial(_probs(torch, row, sp), 1, generator=generator)), None
    if sp.temperature == 0:
        got = pick(map(int, torch.argsort(row, descending=True)), json, table, eos)
    else:
        probs = _probs(torch, row, sp)
        got = None
        for _ in range(JSON_REDRAWS):
            if float(probs.sum()) <= 0.0:
                break
            tid = int(torch.multinomial(probs, 1, generator=generator))
            got = pick([tid], json, table, eos)
            if got is not None:
                break
            probs[tid] = 0.0
        if got is None:  # the nucleus, most likely first, then everything else
            got = pick(map(int, torch.argsort(probs, descending=True)), json, table, eos)
        if got is None:
            got = pick(map(int, torch.argsort(row, descending=True)), json, table, eos)
    if got is None:
        raise InferenceError("response_format json_object: no token continues the JSON object")
    return got


def logprob_entries(torch: Any, raw: Any, tid: int, k: int, table: list[bytes]) -> dict[str, Any]:
    """The OpenAI log-probability entry of token ``tid`` with the ``k`` most likely
    alternatives, from the raw logits row (``logprob_entry``)."""
    lp = torch.log_softmax(raw, dim=-1)

    def b(i: int) -> bytes:
        return table[i] if i < len(table) else b""

    top: list[tuple[bytes, float]] = []
    if k > 0:
        vals, idx = torch.topk(lp, k)
        top = [(b(int(i)), float(v)) for v, i in zip(vals, idx, strict=True)]
    return logprob_entry(b(tid), float(lp[tid]), top)
