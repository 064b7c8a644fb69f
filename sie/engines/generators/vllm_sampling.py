"""The vLLM engine's request mapping (``sie.engines.generators.vllm_engine``;
docs/api.md §5.1): SIE's ``SamplingParams`` as vLLM's, and vLLM's per-token log
probabilities as OpenAI entries.

* ``sampling_params``: ``n=1``, ``max_tokens`` (null: the room left in the window),
  ``temperature``, ``top_p``, ``seed``, ``stop``, ``presence_penalty``,
  ``frequency_penalty``, ``logit_bias`` (token id -> bias), ``logprobs`` (the number
  of alternatives; vLLM always adds the sampled token), and for ``response_format``
  ``json_object`` vLLM's structured outputs: ``structured_outputs=
  StructuredOutputsParams(json_object=True)`` (vLLM >= 0.11), else the older
  ``guided_decoding=GuidedDecodingParams(json_object=True)``. The optional fields are
  passed only when the request sets them.
* ``LogprobCursor``: vLLM's outputs are cumulative; ``take`` returns the entries of
  the tokens added since the last call (``CompletionOutput.logprobs``: per position a
  ``{token_id: Logprob(logprob, rank, decoded_token)}`` holding the sampled token and
  the top ``logprobs`` by rank). The EOS that ends a completion gets no entry (as
  with the transformers engine; OpenAI shows none).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sie.core.errors import InvalidInput
from sie.engines.generation import GenerationRequest, logprob_entry

__all__ = ["LogprobCursor", "sampling_params"]


def _structured(vllm: Any) -> tuple[str, Any]:
    """``(SamplingParams keyword, params class)`` of this vLLM's structured outputs."""
    mod = getattr(vllm, "sampling_params", None)
    for kw, name in (
        ("structured_outputs", "StructuredOutputsParams"),
        ("guided_decoding", "GuidedDecodingParams"),
    ):
        cls = getattr(mod, name, None) or getattr(vllm, name, None)
        if cls is not None:
            return kw, cls
    raise InvalidInput(
        "response_format: this vLLM has no structured outputs; see docs/api.md §5.1",
        field="response_format",
    )


def sampling_params(vllm: Any, req: GenerationRequest, room: int) -> Any:
    """vLLM's ``SamplingParams`` for ``req`` with ``room`` tokens left in the window.

    Raises:
        InvalidInput: ``json_object`` asked of a vLLM without structured outputs.
    """
    sp = req.sampling
    kw: dict[str, Any] = {
        "n": 1,
        "max_tokens": min(sp.max_tokens, room) if sp.max_tokens is not None else room,
        "temperature": float(sp.temperature),
        "top_p": float(sp.top_p),
        "seed": sp.seed,
        "stop": list(sp.stop),
    }
    if sp.presence_penalty:
        kw["presence_penalty"] = float(sp.presence_penalty)
    if sp.frequency_penalty:
        kw["frequency_penalty"] = float(sp.frequency_penalty)
    if sp.logit_bias:
        kw["logit_bias"] = {int(t): float(b) for t, b in sp.logit_bias.items()}
    if sp.logprobs is not None:
        kw["logprobs"] = int(sp.logprobs)
    if sp.response_format == "json_object":
        name, cls = _structured(vllm)
        kw[name] = cls(json_object=True)
    return vllm.SamplingParams(**kw)


class LogprobCursor:
    """Turns a request's cumulative vLLM outputs into OpenAI entries (module docstring).

    Args:
        k: alternatives asked for per token.
        tokenizer: decodes a token whose ``decoded_token`` vLLM left empty.
    """

    def __init__(self, k: int, tokenizer: Any) -> None:
        self.k = k
        self.tokenizer = tokenizer
        self.done = 0  # positions already turned into entries

    def _bytes(self, tid: int, lp: Any) -> bytes:
        text = getattr(lp, "decoded_token", None)
        if text is None:
            text = self.tokenizer.decode([tid])
        return str(text).encode("utf-8")

    def take(self, token_ids: Sequence[int], logprobs: Any, eos_last: bool) -> list[dict[str, Any]]:
        """Entries for the positions after the last call; ``eos_last``: the final output
        ended on an EOS, which gets none."""
        end = len(token_ids) - (1 if eos_last else 0)
        out: list[dict[str, Any]] = []
        if not logprobs:
            self.done = max(self.done, end)
            return out
        for pos in range(self.done, min(end, len(logprobs))):
            tid = int(token_ids[pos])
            step = logprobs[pos] or {}
            own = step.get(tid)
            ranked = sorted(
                ((lp.rank if lp.rank is not None else 1 << 30, t, lp) for t, lp in step.items()),
                key=lambda x: x[0],
            )
            top = [(self._bytes(t, lp), float(lp.logprob)) for _, t, lp in ranked[: self.k]]
            logprob = float(own.logprob) if own is not None else float("-inf")
            out.append(logprob_entry(self._bytes(tid, own), logprob, top))
        self.done = max(self.done, end)
        return out
