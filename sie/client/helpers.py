"""Helpers over results (docs/sdk.md "Helpers"): vectors as plain lists for stores
that want them, sparse vectors as dicts, and MaxSim for client-side late interaction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "dense_embedding",
    "maxsim",
    "maxsim_batch",
    "multivector_embedding",
    "normalize_sparse_vector",
    "sparse_embedding",
    "sparse_embedding_dict",
]


def dense_embedding(result: Mapping[str, Any], strict: bool = True) -> list[float]:
    """The dense vector of an encode result as floats.

    Raises:
        KeyError: no ``dense`` in the result and ``strict`` (else ``[]``).
    """
    if "dense" not in result:
        if strict:
            raise KeyError("the result has no dense vector (ask for output_types=['dense'])")
        return []
    return [float(x) for x in np.asarray(result["dense"]).ravel()]


def sparse_embedding(result: Mapping[str, Any]) -> dict[str, list[Any]]:
    """``{"indices": [int], "values": [float]}`` (empty lists when absent)."""
    sparse = result.get("sparse")
    if not sparse:
        return {"indices": [], "values": []}
    return {
        "indices": [int(i) for i in np.asarray(sparse["indices"])],
        "values": [float(v) for v in np.asarray(sparse["values"])],
    }


def sparse_embedding_dict(result: Mapping[str, Any]) -> dict[int, float]:
    """The sparse vector as ``{index: weight}``."""
    s = sparse_embedding(result)
    return dict(zip(s["indices"], s["values"], strict=True))


def normalize_sparse_vector(sparse: Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
    """``{"indices", "values"}`` scaled to unit L2 norm (unchanged when all zero)."""
    values = [float(v) for v in sparse.get("values", [])]
    norm = math.sqrt(sum(v * v for v in values))
    scale = 1.0 / norm if norm > 0 else 1.0
    return {
        "indices": [int(i) for i in sparse.get("indices", [])],
        "values": [v * scale for v in values],
    }


def multivector_embedding(raw: Any) -> list[list[float]]:
    """A multivector (``ndarray[num_tokens, dims]``, or a result holding one) as lists."""
    if isinstance(raw, Mapping):
        raw = raw["multivector"]
    return [[float(x) for x in row] for row in np.asarray(raw)]


def maxsim(query: Any, docs: Sequence[Any]) -> list[float]:
    """Late-interaction score of ``query`` (``[nq, d]``) against each document
    (``[nd, d]``): the sum over query tokens of the best dot product with any
    document token. Assumes L2-normalised token vectors (as SIE returns them)."""
    q = np.asarray(query, dtype=np.float32)
    return [float((q @ np.asarray(d, dtype=np.float32).T).max(axis=1).sum()) for d in docs]


def maxsim_batch(queries: Sequence[Any], docs: Sequence[Any]) -> NDArray[np.float32]:
    """``maxsim`` for every query: ``float32[num_queries, num_docs]``."""
    out = np.zeros((len(queries), len(docs)), dtype=np.float32)
    for i, q in enumerate(queries):
        out[i] = maxsim(q, docs)
    return out
