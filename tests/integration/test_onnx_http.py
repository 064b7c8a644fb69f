"""The ONNX Runtime profiles of MiniLM (``:onnx``, ``:onnx-int8``) served over real
HTTP, against ``SentenceTransformer.encode`` (docs/performance.md "ONNX Runtime engines").

float32 must give the torch vectors (atol 1e-4, cosine > 0.99999); int8 stays within
cosine 0.98 of them on these sentences (8+ words; the load-time bound is looser because
its probe set has one-word texts).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from sie.engines.onnx.checks import row_cosines
from tests.conftest import MINILM, Stack, run_stack

pytestmark = pytest.mark.slow

TEXTS = [
    "The cat sat on the mat by the window all afternoon.",
    "A quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Embeddings map pieces of text to vectors that a search engine can compare.",
    "Knead the dough for ten minutes, then bake the loaf at 220 degrees.",
]


@pytest.fixture(scope="module")
def onnx_stack() -> Iterator[Stack]:
    """All roles, both ONNX profiles preloaded (exported once into the shared test cache)."""
    with run_stack(preload=(f"{MINILM}:onnx", f"{MINILM}:onnx-int8")) as s:
        yield s


def _encode(stack: Stack, profile: str, **params: Any) -> dict[str, Any]:
    items = [{"id": f"i{i}", "text": t} for i, t in enumerate(TEXTS)]
    body: dict[str, Any] = {"items": items, **({"params": params} if params else {})}
    resp = httpx.post(f"{stack.base_url}/v1/encode/{MINILM}:{profile}", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def _dense(body: dict[str, Any]) -> np.ndarray:
    return np.array([it["dense"]["values"] for it in body["items"]], dtype=np.float32)


def test_onnx_float32_serves_the_torch_vectors(onnx_stack: Stack, st_model: Any) -> None:
    body = _encode(onnx_stack, "onnx")
    assert body["model"] == f"{MINILM}:onnx"
    got, want = _dense(body), st_model.encode(TEXTS)
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert row_cosines(want, got).min() > 0.99999


def test_onnx_float32_multivector_is_the_token_embeddings(onnx_stack: Stack, st_model: Any) -> None:
    body = _encode(onnx_stack, "onnx", output_types=["multivector"])
    rows = st_model.encode(TEXTS, output_value="token_embeddings")
    for item, want in zip(body["items"], rows, strict=True):
        mv = item["multivector"]
        got = np.array(mv["values"], dtype=np.float32)
        want = want.float().numpy()
        want = want / np.linalg.norm(want, axis=1, keepdims=True)  # the profile normalises
        assert (mv["num_tokens"], mv["token_dims"]) == want.shape
        assert row_cosines(want, got).min() > 0.99999


def test_onnx_int8_stays_close_to_the_torch_vectors(onnx_stack: Stack, st_model: Any) -> None:
    got, want = _dense(_encode(onnx_stack, "onnx-int8")), st_model.encode(TEXTS)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert row_cosines(want, got).min() > 0.98
    # one text alone gives the same vector as in the batch (int8 runs text by text)
    alone = httpx.post(
        f"{onnx_stack.base_url}/v1/encode/{MINILM}:onnx-int8",
        json={"items": [{"text": TEXTS[2]}]},
        timeout=60,
    )
    np.testing.assert_allclose(_dense(alone.json())[0], got[2], atol=1e-6)


def test_openai_embeddings_route_to_the_int8_profile(onnx_stack: Stack, st_model: Any) -> None:
    resp = httpx.post(
        f"{onnx_stack.base_url}/v1/embeddings",
        json={"model": f"{MINILM}:onnx-int8", "input": TEXTS[:2]},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    got = np.array([d["embedding"] for d in resp.json()["data"]], dtype=np.float32)
    assert row_cosines(st_model.encode(TEXTS[:2]), got).min() > 0.98
