"""``(query, doc)`` pairs to cross-encoder inputs (``sie.engines.onnx.cross``).

A pair is one sequence: the tokenizer's pair template around the two sides (BERT:
``[CLS] query [SEP] doc [SEP]``, ``token_type_ids`` 0 then 1; RoBERTa-like:
``<s> query </s></s> doc </s>``), at most ``window`` tokens, the sides truncated
longest-first as the Hugging Face tokenizer (and so ``CrossEncoder``) does
(``longest_first``). The truncation is done here, on token ids: the ``tokenizers``
library's own pair truncation combines every overflow piece of one side with every
piece of the other, a cost quadratic in the sides' lengths (one pair of two 8,192-
character sides: 0.5 s and 180 MB; two huge sides exhaust the memory), whereas each side
is tokenised once here, linearly, after the same bound as single texts
(``TextInputs._clip``: a huge side costs no more than a window's worth of words).

The template (the special tokens before, between and after the sides, and each part's
type id) is read from the tokenizer by encoding probe pairs, and checked to reproduce
the tokenizer's own encoding of other pairs; a tokenizer whose template is not of that
shape falls back to its own pair truncation (after the same bound on each side).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sie.engines.onnx.runtime import TextInputs

__all__ = ["PairInputs", "PairTemplate", "longest_first"]

Pair = tuple[str, str]


def longest_first(n1: int, n2: int, budget: int) -> tuple[int, int]:
    """The lengths ``tokenizers`` keeps of two sides of ``n1`` and ``n2`` tokens when
    they may hold ``budget`` tokens together (``TruncationStrategy::LongestFirst``):
    unchanged when they fit; else a side of at most half the budget is kept whole and
    the other cut to the rest; else each gets half (the longer side, or the second on
    a tie, the odd token)."""
    if n1 + n2 <= budget:
        return n1, n2
    swap = n1 > n2
    short, long_ = (n2, n1) if swap else (n1, n2)
    long_ = short if short > budget else max(short, budget - short)
    if short + long_ > budget:
        short = budget // 2
        long_ = short + budget % 2
    return (long_, short) if swap else (short, long_)


@dataclass(frozen=True)
class PairTemplate:
    """A pair's layout: ``before + A + between + B + after`` (ids and type ids)."""

    before: tuple[int, ...]
    between: tuple[int, ...]
    after: tuple[int, ...]
    before_types: tuple[int, ...]
    between_types: tuple[int, ...]
    after_types: tuple[int, ...]
    a_type: int
    b_type: int

    @property
    def specials(self) -> int:
        return len(self.before) + len(self.between) + len(self.after)

    def row(self, a: Sequence[int], b: Sequence[int]) -> tuple[list[int], list[int]]:
        """``(ids, type ids)`` of the pair of side ids ``a`` and ``b``."""
        ids = [*self.before, *a, *self.between, *b, *self.after]
        types = [
            *self.before_types,
            *([self.a_type] * len(a)),
            *self.between_types,
            *([self.b_type] * len(b)),
            *self.after_types,
        ]
        return ids, types

    @classmethod
    def read(cls, tokenizer: Any) -> PairTemplate | None:
        """The template of ``tokenizer`` (no truncation, no padding), or ``None`` when its
        pair encoding is not ``before + A + between + B + after`` on the probes."""
        a, b = "alpha beta", "gamma"
        ia = tokenizer.encode(a, add_special_tokens=False).ids
        ib = tokenizer.encode(b, add_special_tokens=False).ids
        full = tokenizer.encode(a, b)
        ids, types = list(full.ids), list(full.type_ids)
        i = next((k for k in range(len(ids)) if ids[k : k + len(ia)] == ia), -1)
        j = next((k for k in range(i + len(ia), len(ids)) if ids[k : k + len(ib)] == ib), -1)
        if i < 0 or j < 0 or not ia or not ib:
            return None
        ta, tb = set(types[i : i + len(ia)]), set(types[j : j + len(ib)])
        if len(ta) != 1 or len(tb) != 1:
            return None
        end = j + len(ib)
        template = cls(
            tuple(ids[:i]),
            tuple(ids[i + len(ia) : j]),
            tuple(ids[end:]),
            tuple(types[:i]),
            tuple(types[i + len(ia) : j]),
            tuple(types[end:]),
            ta.pop(),
            tb.pop(),
        )
        for x, y in (("one", "two three four five"), ("a longer first side here", "b")):
            got = template.row(
                tokenizer.encode(x, add_special_tokens=False).ids,
                tokenizer.encode(y, add_special_tokens=False).ids,
            )
            want = tokenizer.encode(x, y)
            if got != (list(want.ids), list(want.type_ids)):
                return None
        return template


class PairInputs(TextInputs):
    """``TextInputs`` that also turn ``(query, doc)`` pairs into a cross-encoder's inputs
    (module docstring); single texts work as in ``TextInputs``."""

    def __init__(self, root: Path, window: int, lowercase: bool, names: Sequence[str]) -> None:
        super().__init__(root, window, lowercase, names)
        self.template = PairTemplate.read(self._counter)
        pad = self._batcher.padding or {}
        self._pad_id = int(pad.get("pad_id") or 0)
        self._pad_type = int(pad.get("pad_type_id") or 0)

    def _side(self, text: str) -> str:
        return text.lower() if self.lowercase else text

    def _length(self, text: str) -> int:
        return len(self._counter.encode(self._side(text), add_special_tokens=False).ids)

    def rows(self, pairs: Sequence[Pair]) -> list[tuple[list[int], list[int]]]:
        """Each pair's ``(ids, type ids)``, special tokens included, truncated
        longest-first to the window (module docstring)."""
        clipped = [(self._clip(q), self._clip(d)) for q, d in pairs]
        if self.template is None:  # the tokenizer's own pair truncation (bounded sides)
            encs = self._batcher.encode_batch([(self._side(q), self._side(d)) for q, d in clipped])
            real = [sum(e.attention_mask) for e in encs]  # the batcher pads: drop it
            return [
                (list(e.ids[:n]), list(e.type_ids[:n])) for e, n in zip(encs, real, strict=True)
            ]
        sides = [self._side(t) for pair in clipped for t in pair]
        ids = [e.ids for e in self._counter.encode_batch(sides, add_special_tokens=False)]
        budget = max(0, self.window - self.template.specials)
        out = []
        for k, (pair, full) in enumerate(zip(clipped, pairs, strict=True)):
            a, b = ids[2 * k], ids[2 * k + 1]
            na, nb = len(a), len(b)
            if min(na, nb) > budget and pair != full:
                # both sides cut to half the budget: which keeps the odd token depends on
                # the full sides' lengths, which a clipped side no longer shows (linear)
                na, nb = (self._length(full[0]), self._length(full[1]))
            ka, kb = longest_first(na, nb, budget)
            out.append(self.template.row(a[:ka], b[:kb]))
        return out

    def pad(self, rows: Sequence[tuple[list[int], list[int]]]) -> dict[str, np.ndarray]:
        """The graph's inputs for ``rows``: int64 ``[len(rows), longest]`` each, padded
        right (attention mask 0 on padding)."""
        width = max((len(ids) for ids, _ in rows), default=0)
        n = len(rows)
        input_ids = np.full((n, width), self._pad_id, dtype=np.int64)
        type_ids = np.full((n, width), self._pad_type, dtype=np.int64)
        mask = np.zeros((n, width), dtype=np.int64)
        for r, (ids, types) in enumerate(rows):
            input_ids[r, : len(ids)] = ids
            type_ids[r, : len(types)] = types
            mask[r, : len(ids)] = 1
        fields = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": type_ids}
        return {name: fields[name] for name in self.names}

    def pair_features(self, pairs: Sequence[Pair]) -> dict[str, np.ndarray]:
        """``pad(rows(pairs))``."""
        return self.pad(self.rows(pairs))
