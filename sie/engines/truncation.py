"""Per-request truncation of encode inputs: the runtime options ``truncate`` and
``max_input_tokens`` (docs/api.md §2, §6, §5.1), honoured by every encoder's
``prepare`` (sentence-transformers and ONNX engines).

- ``truncate`` (bool, default true): true keeps SIE's default, an input longer than the
  model reads is cut to its window; false refuses such an input, 400 naming the text
  with its token count and the limit (``tokens``, ``limit`` in the error).
- ``max_input_tokens`` (int >= 1, at most the model's window): read at most this many
  tokens of each input, special tokens included (vLLM's ``truncate_prompt_tokens``;
  the end of a text is cut, as by the window). With ``truncate: false`` it is the limit
  an input must fit.

Token counts are the engine's own tokenizer's (a fast tokenizer's backend without
truncation, ``sie.engines.tokens.counting_tokenizer``), special tokens included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sie.core.errors import InvalidInput

__all__ = ["apply_truncation", "read_truncation"]


def read_truncation(options: Mapping[str, Any], window: int, sie_id: str) -> tuple[bool, int]:
    """``(truncate, limit)`` from the runtime options (``limit``: the tokens an input
    may have, at most ``window``).

    Raises:
        InvalidInput: a malformed option, or ``max_input_tokens`` over ``window``
            (field ``options.truncate`` / ``options.max_input_tokens``).
    """
    truncate = options.get("truncate", True)
    if truncate is None:
        truncate = True
    if not isinstance(truncate, bool):
        raise InvalidInput("options.truncate must be true or false", field="options.truncate")
    k = options.get("max_input_tokens")
    if k is None:
        return truncate, window
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInput(
            f"options.max_input_tokens must be a positive integer, got {k!r}",
            field="options.max_input_tokens",
        )
    if k > window:
        raise InvalidInput(
            f"options.max_input_tokens: {k} is more than model {sie_id!r} reads ({window} tokens)",
            field="options.max_input_tokens",
            limit=window,
        )
    return truncate, k


def _cut(counter: Any, text: str, k: int, lower: bool) -> str:
    """The longest prefix of ``text`` (cut at a token boundary) of at most ``k`` tokens."""
    seen = text.lower() if lower else text
    enc = counter.encode(seen)
    if len(enc.ids) <= k:
        return text
    content = [i for i, special in enumerate(enc.special_tokens_mask) if not special]
    keep = max(0, k - (len(enc.ids) - len(content)))
    source = text if len(seen) == len(text) else seen  # offsets index ``seen``
    while keep > 0:
        cut = source[: enc.offsets[content[keep - 1]][1]]
        if len(counter.encode(cut.lower() if lower else cut).ids) <= k:
            return cut
        keep -= 1  # a cut that merges differently: one token less
    return ""


def apply_truncation(
    counter: Any,
    rendered: Sequence[str],
    clipped: Sequence[str],
    options: Mapping[str, Any],
    window: int,
    sie_id: str,
    *,
    lower: bool = False,
) -> list[str]:
    """``clipped`` (the engine's window-bounded texts) bounded by the request's options.

    ``counter``: the engine's counting tokenizer (``tokenizers.Tokenizer``, no
    truncation), None when it has none; ``rendered``: the whole texts (templates
    applied), to count when ``truncate`` is false; ``lower``: the engine lowercases.

    Raises:
        InvalidInput: ``truncate: false`` and a text over the limit (field ``text``,
            with ``tokens`` and ``limit``); an option this engine cannot honour.
    """
    truncate, limit = read_truncation(options, window, sie_id)
    if truncate and limit >= window:
        return list(clipped)
    if counter is None:
        raise InvalidInput(
            f"model {sie_id!r} has no fast tokenizer to count tokens with: "
            "options.truncate / max_input_tokens are not supported",
            field="options.truncate",
        )
    if not truncate:
        for text in rendered:
            n = len(counter.encode(text.lower() if lower else text).ids)
            if n > limit:
                raise InvalidInput(
                    f"text is {n} tokens, more than the {limit} model {sie_id!r} reads "
                    "(truncation was turned off)",
                    field="text",
                    tokens=n,
                    limit=limit,
                )
        return list(clipped)
    return [_cut(counter, t, limit, lower) for t in clipped]
