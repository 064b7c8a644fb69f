"""What an ONNX graph must pass before it serves (docs/performance.md "ONNX Runtime engines").

**Parity** (every load, float32 and the graph int8 is made from): the engine's
outputs on ``parity_probes`` (one unpadded text, a padded batch of mixed lengths, and
a batch where one text is truncated to the window) against the torch
(sentence-transformers) pipeline's, row by row (each dense vector, each token vector):
cosine >= ``PARITY_MIN_COSINE`` (0.99999) everywhere, else the load fails with
``ModelLoadFailed`` (CONFIG, permanent) naming the worst cosine, the output and the
probe. The refusal is the profile's only: the model's torch profiles (its ``default``)
are separate loads and keep serving.

**int8 quality** (``compute_precision: int8``): the int8 and float32 graphs encode
``INT8_PROBES`` (50 varied texts: queries, sentences, paragraphs, code, numbers, other
languages); the int8 graph serves when, over the dense vectors,

- the lowest cosine to float32 >= ``int8_min_cosine`` (default 0.95),
- the mean cosine >= ``int8_mean_cosine`` (default 0.99),
- top-10 retrieval agreement >= ``int8_min_top10`` (default 0.9): each probe as a
  query over the other 49, the share of float32's 10 nearest that int8 also ranks in
  its 10 nearest, averaged over the probes;

else the load fails with ``ModelLoadFailed`` (CONFIG, permanent) listing each measure
against its bound. The bounds are loadtime options (numbers in 0..1).

The defaults separate the two recipes measured on all-MiniLM-L6-v2: the shipped one
(``sie.engines.onnx.quantize``: per-channel, MatMul only) gives min 0.964 (on
"Thanks!": one- and two-word texts are the hardest; 0.989 and up from 8 words), mean
0.993, top-10 0.914; a naive per-tensor int8 gives min 0.79, mean 0.958, top-10 0.80
and is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sie.core.errors import ModelLoadFailed

__all__ = [
    "INT8_PROBES",
    "PARITY_MIN_COSINE",
    "Int8Bounds",
    "Int8Quality",
    "check_int8",
    "check_parity",
    "fractions_from_loadtime",
    "parity_probes",
    "row_cosines",
    "top_k_overlap",
]

#: Lowest cosine to the torch pipeline a float32 graph may show on any row.
PARITY_MIN_COSINE = 0.99999

#: The int8 probe set: varied in topic, length and script.
INT8_PROBES = (
    "how do I bake sourdough bread",
    "Knead the dough for ten minutes, let it rise overnight, then bake at 230C.",
    "best hiking trails near Zurich",
    "The Matterhorn was first climbed in 1865 by Edward Whymper's party.",
    "python list comprehension with condition",
    "squares = [x * x for x in range(10) if x % 2 == 0]",
    "What causes inflation?",
    "Central banks raise interest rates to slow the growth of prices.",
    "The stock market fell sharply after the earnings report.",
    "quarterly revenue grew 12% year over year to $4.2 billion",
    "symptoms of vitamin D deficiency",
    "Fatigue, bone pain and muscle weakness can point to low vitamin D.",
    "a",
    "ok",
    "Thanks!",
    "The cat sat on the mat.",
    "Photosynthesis turns light, water and carbon dioxide into glucose and oxygen.",
    "How far is the Moon from the Earth?",
    "The average distance between the Earth and the Moon is about 384,400 km.",
    "Le chat dort sur le canapé depuis ce matin.",
    "Der Zug nach Berlin hat heute zwanzig Minuten Verspätung.",
    "¿Dónde está la estación de tren más cercana?",
    "東京は日本の首都です。",
    "SELECT name, count(*) FROM orders GROUP BY name HAVING count(*) > 5;",
    "Error: connection refused (ECONNREFUSED) on port 5432",
    "restart the postgres service after editing pg_hba.conf",
    "The Treaty of Westphalia ended the Thirty Years' War in 1648.",
    "Who painted the Mona Lisa?",
    "Leonardo da Vinci painted the Mona Lisa in the early sixteenth century.",
    "Transformers use self-attention to relate every token to every other token.",
    "cheap flights from London to New York in December",
    "The guitarist tuned her instrument down a half step before the encore.",
    "My package has not arrived and the tracking page has not changed for a week.",
    "Water boils at 100 degrees Celsius at sea level.",
    "The quarterback threw three touchdowns in the second half.",
    "Mix two cups of flour with one teaspoon of baking soda and a pinch of salt.",
    "The defendant pleaded not guilty to all charges.",
    "Regular exercise lowers the risk of heart disease.",
    "Rain is expected tomorrow afternoon with winds up to 40 km/h.",
    "How do I reset my password?",
    "Click 'Forgot password' on the sign-in page and follow the link in the e-mail.",
    "The violin concerto was premiered in Leipzig in 1845.",
    "Electric cars have fewer moving parts than petrol cars.",
    "Adopt a dog from the local shelter",
    "Jupiter is the largest planet in the solar system.",
    "A tall glass of cold lemonade on a hot summer day.",
    "The committee postponed the vote until the next session.",
    "Mount Everest is 8,849 metres above sea level.",
    "The novel follows three generations of a family in a small fishing village, "
    "from the war years to the arrival of tourism, told by the youngest daughter.",
    "Unit tests should be fast, isolated and deterministic; integration tests exercise "
    "the real database, the network and the configuration together.",
)


def parity_probes(window: int) -> list[tuple[str, list[str]]]:
    """``(name, texts)`` batches: unpadded, padded (mixed lengths), truncated (one text
    of ``2 * window`` words next to a short one)."""
    return [
        ("unpadded", ["warm-up probe"]),
        ("padded", ["short", "a longer text that needs padding in the batch", "mid length text"]),
        ("truncated", ["word " * (window * 2), "tiny"]),
    ]


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of each row of ``a`` with the same row of ``b`` (``[n, d]`` or ``[d]``),
    in float64; two zero rows count as equal (1.0), one zero row as 0.0.

    Raises:
        ValueError: the shapes differ.
    """
    x = np.atleast_2d(np.asarray(a, dtype=np.float64))
    y = np.atleast_2d(np.asarray(b, dtype=np.float64))
    if x.shape != y.shape:
        raise ValueError(f"shapes differ: {x.shape} vs {y.shape}")
    nx, ny = np.linalg.norm(x, axis=-1), np.linalg.norm(y, axis=-1)
    dot = np.sum(x * y, axis=-1)
    both = (nx > 0) & (ny > 0)
    cos = np.where(both, dot / np.where(both, nx * ny, 1.0), 0.0)
    return np.where((nx == 0) & (ny == 0), 1.0, cos)


Outputs = Callable[[list[str]], Mapping[str, Sequence[Any]]]


def check_parity(
    sie_id: str,
    reference: Outputs,
    candidate: Outputs,
    probes: Sequence[tuple[str, list[str]]],
    bound: float = PARITY_MIN_COSINE,
) -> float:
    """The lowest row cosine of ``candidate``'s outputs to ``reference``'s over
    ``probes``; both map texts to ``{output: one array per text}`` (dense ``[d]``,
    token embeddings ``[tokens, d]``).

    Raises:
        ModelLoadFailed: (CONFIG, permanent) some row is below ``bound`` (or the shapes
            differ), naming the cosine, the output and the probe.
    """
    worst, where = 1.0, ""
    for name, texts in probes:
        want, got = reference(texts), candidate(texts)
        for key, rows in want.items():
            for i, row in enumerate(rows):
                detail = ""
                try:
                    cos = float(np.min(row_cosines(row, got[key][i])))
                except (ValueError, KeyError, IndexError) as exc:
                    cos, detail = 0.0, f" ({type(exc).__name__}: {exc})"
                if cos < worst:
                    worst, where = cos, f"{key} of the {name} probe (text {i}){detail}"
    if not worst >= bound:
        raise ModelLoadFailed(
            f"model {sie_id!r}: the ONNX graph does not reproduce the torch pipeline: "
            f"cosine {worst:.7f} < {bound} on {where}; this profile is refused "
            "(the model's torch profiles are unaffected)",
            error_class="CONFIG",
            permanent=True,
            cosine=worst,
        )
    return worst


def top_k_overlap(a: np.ndarray, b: np.ndarray, k: int = 10) -> float:
    """Mean share of each row's ``k`` nearest other rows (by dot product, so pass unit
    vectors for cosine) under ``a`` that ``b`` also ranks among its ``k`` nearest."""
    n = a.shape[0]
    k = min(k, n - 1)
    if k < 1:
        return 1.0
    shares = []
    for sims in ((a @ a.T), (b @ b.T)):
        np.fill_diagonal(sims, -np.inf)
        shares.append(np.argsort(-sims, axis=1, kind="stable")[:, :k])
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(*shares, strict=True)]))


@dataclass(frozen=True)
class Int8Quality:
    """int8 against float32 on the probe set (see the module docstring)."""

    min_cosine: float
    mean_cosine: float
    top10_overlap: float

    @classmethod
    def measure(cls, fp32: np.ndarray, int8: np.ndarray) -> Int8Quality:
        """From the two graphs' dense vectors ``[n, d]`` of the same texts."""
        cos = row_cosines(fp32, int8)

        def unit(x: np.ndarray) -> np.ndarray:
            norm = np.linalg.norm(x, axis=-1, keepdims=True)
            return np.asarray(x / np.where(norm > 0, norm, 1.0), dtype=np.float64)

        return cls(float(cos.min()), float(cos.mean()), top_k_overlap(unit(fp32), unit(int8)))


@dataclass(frozen=True)
class Int8Bounds:
    """The int8 quality bound; loadtime ``int8_min_cosine``, ``int8_mean_cosine``,
    ``int8_min_top10`` override the defaults."""

    min_cosine: float = 0.95
    mean_cosine: float = 0.99
    top10_overlap: float = 0.9

    @classmethod
    def from_loadtime(cls, loadtime: Mapping[str, Any], sie_id: str) -> Int8Bounds:
        """Raises ModelLoadFailed (CONFIG, permanent) for a value not in 0..1."""
        return cls(
            **fractions_from_loadtime(
                loadtime,
                sie_id,
                {
                    "int8_min_cosine": ("min_cosine", cls.min_cosine),
                    "int8_mean_cosine": ("mean_cosine", cls.mean_cosine),
                    "int8_min_top10": ("top10_overlap", cls.top10_overlap),
                },
            )
        )


def fractions_from_loadtime(
    loadtime: Mapping[str, Any], sie_id: str, keys: Mapping[str, tuple[str, float]]
) -> dict[str, float]:
    """``{field: value}`` for ``keys`` (loadtime option → (field, default)), each a
    number in 0..1 (the int8 bounds' options).

    Raises:
        ModelLoadFailed: (CONFIG, permanent) a value that is not a number in 0..1.
    """
    values = {}
    for key, (field, default) in keys.items():
        v = loadtime.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
            raise ModelLoadFailed(
                f"model {sie_id!r}: loadtime.{key} must be a number in 0..1, got {v!r}",
                error_class="CONFIG",
                permanent=True,
            )
        values[field] = float(v)
    return values


def check_int8(sie_id: str, fp32: np.ndarray, int8: np.ndarray, bounds: Int8Bounds) -> Int8Quality:
    """``Int8Quality`` of ``int8`` against ``fp32`` (dense ``[n, d]`` on ``INT8_PROBES``).

    Raises:
        ModelLoadFailed: (CONFIG, permanent) any measure is below its bound; the message
            lists all three measures with their bounds.
    """
    q = Int8Quality.measure(fp32, int8)
    pairs = [
        ("min cosine", q.min_cosine, bounds.min_cosine),
        ("mean cosine", q.mean_cosine, bounds.mean_cosine),
        ("top-10 agreement", q.top10_overlap, bounds.top10_overlap),
    ]
    if any(not got >= want for _, got, want in pairs):
        measured = ", ".join(f"{n} {got:.4f} (bound {want})" for n, got, want in pairs)
        raise ModelLoadFailed(
            f"model {sie_id!r}: int8 quantisation loses too much against float32 on "
            f"{len(fp32)} probe texts: {measured}; this profile is refused (serve a "
            "float32 profile of the model instead)",
            error_class="CONFIG",
            permanent=True,
        )
    return q
