"""JSON response rendering (``sie.http.negotiation.FastJSONResponse``): the hot-path
renderer must give the same numbers as ``json.dumps`` and never invalid JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic_core import PydanticSerializationError

from sie.core.wire import packb, unpackb
from sie.http.negotiation import FastJSONResponse


def test_numpy_scalar_and_json_expansion() -> None:
    x = unpackb(packb({"s": np.float32(1.5), "a": np.ones(2, dtype=np.float32)}))
    assert x["s"] == np.float32(1.5)
    body = FastJSONResponse(x).body
    assert json.loads(body) == {"s": 1.5, "a": [1.0, 1.0]}


def test_json_response_matches_stdlib_numbers() -> None:
    """The fast renderer parses back to exactly the floats json.dumps would give."""
    rng = np.random.default_rng(0)
    vec = (rng.standard_normal(384) * 10.0 ** rng.integers(-8, 8, 384)).astype(np.float32)
    payload = {"items": [{"dense": {"dims": 384, "values": vec}}], "t": "\u00e9\u4e2d"}
    fast = json.loads(FastJSONResponse(payload).body)
    slow = json.loads(
        json.dumps({**payload, "items": [{"dense": {"dims": 384, "values": vec.tolist()}}]})
    )
    assert fast == slow
    assert (
        FastJSONResponse(payload).body.decode().endswith('"t":"\u00e9\u4e2d"}')
    )  # UTF-8, not \\u escapes


def test_json_response_non_finite_is_null_never_invalid_json() -> None:
    body = FastJSONResponse({"v": np.array([1.0, np.nan, np.inf], dtype=np.float32)}).body
    assert json.loads(body) == {"v": [1.0, None, None]}
    with pytest.raises(PydanticSerializationError):
        FastJSONResponse({"v": object()})
