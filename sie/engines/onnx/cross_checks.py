"""What a cross-encoder graph must pass before it serves (docs/performance.md "ONNX
Runtime engines"; the cosine checks of ``sie.engines.onnx.checks`` do not apply to
one logit per pair).

**Parity** (every load, float32): the engine's raw logits (no activation) on
``score_parity_probes`` (one unpadded pair, a padded batch of mixed lengths, and a
batch truncated longest-first: a long doc, a long query, both long) against the torch
``CrossEncoder.predict`` logits of the same pairs: for every pair
``|onnx - torch| <= SCORE_PARITY_ATOL + SCORE_PARITY_RTOL * |torch|`` (1e-4 each: a
float32 export of the same weights differs by float rounding only: 2.4e-7 on the
distilled MiniLM cross-encoder), else ``ModelLoadFailed`` (CONFIG, permanent) naming
the largest difference, the pair and the probe.

**int8 quality** (``compute_precision: int8``): each of the ``GATE_QUERIES`` (10
queries) is scored against every text of ``sie.engines.onnx.checks.INT8_PROBES`` (50
varied texts) by the float32 and the int8 graph, a ``[10, 50]`` logit matrix each;
the int8 graph serves when

- the largest ``|int8 - fp32|`` over the 500 pairs, as a share of the float32
  logits' spread (max - min over the 500), is <= ``int8_max_score_diff`` (default
  0.15): logit scales differ from model to model, the spread makes the bound
  scale-free;
- the lowest per-query Spearman correlation of the two rankings of the 50 texts is
  >= ``int8_min_spearman`` (default 0.94);
- the mean per-query top-10 agreement (the share of float32's 10 best texts that int8
  also ranks in its 10 best) is >= ``int8_min_top10`` (default 0.9);

else ``ModelLoadFailed`` (CONFIG, permanent) listing each measure against its bound.
The bounds are loadtime options (numbers in 0..1).

The defaults separate the recipes measured on the distilled MiniLM cross-encoder of
the tests (``tests/distill.py``; float32 logits -0.13..1.00 on the gate's pairs): the
shipped one (``sie.engines.onnx.quantize``: per-channel, MatMul only) gives max
difference 0.092 of the spread (mean 0.011), min Spearman 0.962, top-10 0.95; a naive
per-tensor int8 of every op gives 0.139 / 0.918 / 0.88, per-tensor MatMul only 0.165 /
0.906 / 0.83, both refused. A random tiny cross-encoder, whose logits barely vary
(spread 2e-4), is refused (max difference 1.7 of its spread, min Spearman -0.05).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sie.core.errors import ModelLoadFailed
from sie.engines.onnx.checks import fractions_from_loadtime

__all__ = [
    "GATE_QUERIES",
    "SCORE_PARITY_ATOL",
    "SCORE_PARITY_RTOL",
    "ScoreInt8Bounds",
    "ScoreInt8Quality",
    "check_score_int8",
    "check_score_parity",
    "score_parity_probes",
    "spearman",
]

#: A float32 graph's logit may differ from torch's by this much, plus the relative part.
SCORE_PARITY_ATOL = 1e-4
#: ... and by this share of the torch logit's magnitude.
SCORE_PARITY_RTOL = 1e-4

#: The int8 gate's queries, each scored against every ``INT8_PROBES`` text; most have
#: a relevant text among them, some several.
GATE_QUERIES = (
    "how long should sourdough dough rise",
    "who first climbed the Matterhorn",
    "filter a python list by a condition",
    "why do central banks raise interest rates",
    "signs of low vitamin D",
    "distance from the earth to the moon",
    "who painted the Mona Lisa",
    "I forgot my password",
    "postgres refuses connections",
    "largest planet in the solar system",
)

Pair = tuple[str, str]


def score_parity_probes(window: int) -> list[tuple[str, list[Pair]]]:
    """``(name, pairs)`` batches: unpadded, padded (mixed lengths), truncated (a doc, a
    query and both sides of ``2 * window`` words next to a short pair)."""
    long = "word " * (window * 2)
    return [
        ("unpadded", [("warm-up query", "a probe document")]),
        (
            "padded",
            [
                ("short", "doc"),
                ("a longer query that needs padding", "a document of a few more words than most"),
                ("mid length query", "mid length document"),
            ],
        ),
        ("truncated", [("a query", long), (long, "a short document"), (long, long), ("q", "d")]),
    ]


Scores = Callable[[list[Pair]], Sequence[float] | np.ndarray]


def check_score_parity(
    sie_id: str,
    reference: Scores,
    candidate: Scores,
    probes: Sequence[tuple[str, list[Pair]]],
    atol: float = SCORE_PARITY_ATOL,
    rtol: float = SCORE_PARITY_RTOL,
) -> float:
    """The largest ``|candidate - reference|`` over ``probes``' pairs; both map pairs to
    one logit per pair.

    Raises:
        ModelLoadFailed: (CONFIG, permanent) a pair's difference exceeds
            ``atol + rtol * |reference|`` (or the lengths differ, or a score is not
            finite), naming the difference, the pair and the probe.
    """
    worst, excess, where = 0.0, 0.0, ""
    for name, pairs in probes:
        want = np.asarray(reference(pairs), dtype=np.float64).reshape(-1)
        got = np.asarray(candidate(pairs), dtype=np.float64).reshape(-1)
        if want.shape != got.shape or not np.all(np.isfinite(got)):
            worst, excess = float("inf"), float("inf")
            where = f"the {name} probe ({len(got)} scores for {len(want)} pairs, or not finite)"
            break
        diff = np.abs(got - want)
        over = diff / (atol + rtol * np.abs(want))
        i = int(np.argmax(over))
        worst = max(worst, float(diff.max()))
        if over[i] > excess:
            excess, where = float(over[i]), f"pair {i} of the {name} probe"
    if excess > 1.0:
        raise ModelLoadFailed(
            f"model {sie_id!r}: the ONNX graph does not reproduce the torch cross-encoder: "
            f"a logit differs by {worst:.3g} (bound {atol} + {rtol} x |torch logit|) on "
            f"{where}; this profile is refused (the model's torch profiles are unaffected)",
            error_class="CONFIG",
            permanent=True,
            max_abs_diff=worst,
        )
    return worst


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks along the last axis (0 = smallest; ties broken by position)."""
    return np.argsort(np.argsort(x, axis=-1, kind="stable"), axis=-1, kind="stable")


def spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman rank correlation of each row of ``a`` with the same row of ``b``
    (``[q, n]`` → ``[q]``); 1.0 for rows of under two items."""
    ra = _ranks(np.atleast_2d(a)).astype(np.float64)
    rb = _ranks(np.atleast_2d(b)).astype(np.float64)
    n = ra.shape[-1]
    if n < 2:
        return np.ones(ra.shape[0])
    d2 = np.sum((ra - rb) ** 2, axis=-1)
    return np.asarray(1.0 - 6.0 * d2 / (n * (n * n - 1)), dtype=np.float64)


def _top_k(a: np.ndarray, b: np.ndarray, k: int) -> float:
    """Mean over rows of the share of ``a``'s ``k`` largest that ``b`` ranks in its ``k``."""
    k = min(k, a.shape[-1])
    ta = np.argsort(-a, axis=-1, kind="stable")[:, :k]
    tb = np.argsort(-b, axis=-1, kind="stable")[:, :k]
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(ta, tb, strict=True)]))


@dataclass(frozen=True)
class ScoreInt8Quality:
    """int8 against float32 logits on the gate's pairs (module docstring)."""

    max_diff: float  # largest |int8 - fp32| / (fp32 max - fp32 min)
    min_spearman: float
    top10_overlap: float

    @classmethod
    def measure(cls, fp32: np.ndarray, int8: np.ndarray) -> ScoreInt8Quality:
        """From the two graphs' ``[queries, texts]`` logit matrices."""
        a, b = np.asarray(fp32, dtype=np.float64), np.asarray(int8, dtype=np.float64)
        if a.shape != b.shape or a.ndim != 2 or not np.all(np.isfinite(b)):
            return cls(float("inf"), -1.0, 0.0)
        spread = float(a.max() - a.min())
        diff = float(np.abs(a - b).max())
        rel = diff / spread if spread > 0 else (0.0 if diff == 0 else float("inf"))
        return cls(rel, float(spearman(a, b).min()), _top_k(a, b, 10))


@dataclass(frozen=True)
class ScoreInt8Bounds:
    """The cross-encoder int8 bound; loadtime ``int8_max_score_diff``,
    ``int8_min_spearman``, ``int8_min_top10`` override the defaults."""

    max_diff: float = 0.15
    min_spearman: float = 0.94
    top10_overlap: float = 0.9

    @classmethod
    def from_loadtime(cls, loadtime: Mapping[str, Any], sie_id: str) -> ScoreInt8Bounds:
        """Raises ModelLoadFailed (CONFIG, permanent) for a value not in 0..1."""
        return cls(
            **fractions_from_loadtime(
                loadtime,
                sie_id,
                {
                    "int8_max_score_diff": ("max_diff", cls.max_diff),
                    "int8_min_spearman": ("min_spearman", cls.min_spearman),
                    "int8_min_top10": ("top10_overlap", cls.top10_overlap),
                },
            )
        )


def check_score_int8(
    sie_id: str, fp32: np.ndarray, int8: np.ndarray, bounds: ScoreInt8Bounds
) -> ScoreInt8Quality:
    """``ScoreInt8Quality`` of ``int8`` against ``fp32`` (``[queries, texts]`` logits).

    Raises:
        ModelLoadFailed: (CONFIG, permanent) a measure is outside its bound; the message
            lists all three measures with their bounds.
    """
    q = ScoreInt8Quality.measure(fp32, int8)
    checks = [
        ("max score difference", q.max_diff, bounds.max_diff, q.max_diff <= bounds.max_diff),
        (
            "min Spearman",
            q.min_spearman,
            bounds.min_spearman,
            q.min_spearman >= bounds.min_spearman,
        ),
        (
            "top-10 agreement",
            q.top10_overlap,
            bounds.top10_overlap,
            q.top10_overlap >= bounds.top10_overlap,
        ),
    ]
    if not all(ok for *_, ok in checks):
        measured = ", ".join(
            f"{n} {got:.4f} ({'max' if n.startswith('max') else 'min'} {want})"
            for n, got, want, _ in checks
        )
        raise ModelLoadFailed(
            f"model {sie_id!r}: int8 quantisation changes the cross-encoder's scores too "
            f"much against float32 on {np.size(fp32)} probe pairs: {measured}; this profile "
            "is refused (serve a float32 profile of the model instead)",
            error_class="CONFIG",
            permanent=True,
        )
    return q
