"""OpenAI-compatible /v1/embeddings (architecture §2; reference §1.8)."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from tests.conftest import MINILM, Stack

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(stack: Stack) -> httpx.Client:
    with httpx.Client(base_url=stack.base_url, timeout=60) as c:
        yield c


def test_float_shape_and_usage(client: httpx.Client, st_model: object) -> None:
    texts = ["first sentence", "a second, longer sentence about embeddings"]
    r = client.post("/v1/embeddings", json={"model": MINILM, "input": texts})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == MINILM
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert all(d["object"] == "embedding" for d in body["data"])
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, st_model.encode(texts), atol=1e-5)  # type: ignore[attr-defined]
    tok = st_model.tokenizer(texts)["input_ids"]  # type: ignore[attr-defined]
    real = sum(len(t) for t in tok)
    assert body["usage"] == {"prompt_tokens": real, "total_tokens": real}


def test_single_string_input(client: httpx.Client) -> None:
    r = client.post("/v1/embeddings", json={"model": MINILM, "input": "just one"})
    assert r.status_code == 200 and len(r.json()["data"]) == 1


def test_timing_headers_as_on_the_native_routes(client: httpx.Client) -> None:
    r = client.post("/v1/embeddings", json={"model": MINILM, "input": ["one", "two"]})
    assert r.status_code == 200, r.text
    h = r.headers
    assert len(h["x-sie-request-id"]) == 36 and h["x-sie-worker"].startswith("worker-test-")
    names = ("queue-publish-time", "queue-time", "inference-time", "tokenization-time")
    for name in (*names, "total-time"):
        assert float(h[f"x-{name}"]) >= 0.0
    assert float(h["x-total-time"]) >= float(h["x-inference-time"])


def test_base64_is_the_same_numbers(client: httpx.Client) -> None:
    texts = ["parity check", "another one"]
    f = client.post("/v1/embeddings", json={"model": MINILM, "input": texts}).json()
    b = client.post(
        "/v1/embeddings", json={"model": MINILM, "input": texts, "encoding_format": "base64"}
    ).json()
    for df, db in zip(f["data"], b["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(db["embedding"]), dtype="<f4")
        assert decoded.shape == (384,)
        np.testing.assert_array_equal(decoded, np.asarray(df["embedding"], dtype=np.float32))


def test_dimensions(client: httpx.Client) -> None:
    same = client.post("/v1/embeddings", json={"model": MINILM, "input": "x", "dimensions": 384})
    assert same.status_code == 200
    other = client.post("/v1/embeddings", json={"model": MINILM, "input": "x", "dimensions": 128})
    assert other.status_code == 400
    err = other.json()["error"]
    assert (
        err["param"] == "dimensions"
        and err["type"] == "invalid_request_error"
        and "384" in err["message"]
    )


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"model": MINILM, "input": [1, 2, 3]}, "input"),
        ({"model": MINILM, "input": [[1, 2], [3]]}, "input[0]"),
        ({"model": MINILM, "input": []}, "input"),
        ({"model": MINILM, "input": ""}, "input"),
        ({"model": MINILM, "input": ["ok", ""]}, "input[1]"),
        ({"model": MINILM}, "input"),
        ({"input": "x"}, "model"),
        ({"model": MINILM, "input": "x", "encoding_format": "hex"}, "encoding_format"),
        ({"model": MINILM, "input": "x", "dimensions": 0}, "dimensions"),
    ],
)
def test_bad_requests_use_openai_envelope(client: httpx.Client, payload: dict, param: str) -> None:
    r = client.post("/v1/embeddings", json=payload)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ({"model": MINILM, "input": [True]}, "input[0]: expected a string"),
        ({"model": MINILM, "input": ["a", None]}, "input[1]: expected a string"),
        ({"model": MINILM, "input": 5}, "input: expected a string or a list of strings"),
        ({"model": MINILM, "input": {}}, "input: expected a string or a list of strings"),
        ({"model": MINILM, "input": ["x"] * 5000}, "input: at most 4096"),
        ({"model": MINILM, "input": "y" * 1_000_001}, "input: 1000001 characters"),
        ({"model": MINILM, "input": ["a", "y" * 1_000_001]}, "input[1]: 1000001 characters"),
    ],
)
def test_input_errors_name_the_element(client: httpx.Client, payload: dict, needle: str) -> None:
    """``param`` names the element (``input[1]``), or ``input`` when the whole is wrong."""
    r = client.post("/v1/embeddings", json=payload)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == needle.split(":")[0] and err["message"].startswith(needle), err


def test_lone_surrogate_is_a_400(client: httpx.Client) -> None:
    r = client.post(
        "/v1/embeddings", content=b'{"model": "%s", "input": "a\\udfff"}' % MINILM.encode()
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    assert "surrogate" in r.json()["error"]["message"]


def test_wrong_method_and_metrics(client: httpx.Client) -> None:
    r = client.get("/v1/embeddings")
    assert r.status_code == 405 and r.headers["x-sie-error-code"] == "METHOD_NOT_ALLOWED"
    assert r.json()["error"]["type"] == "invalid_request_error"
    client.post("/v1/embeddings", json={"model": MINILM, "input": "counted"})
    text = client.get("/metrics").text
    assert f'sie_requests_total{{endpoint="embeddings",model="{MINILM}",status="200"}}' in text


def test_token_ids_message(client: httpx.Client) -> None:
    """Token ids are refused with the fix LangChain's users need (docs/api.md §6)."""
    for inp, param in (([101, 102], "input"), ([[101, 102]], "input[0]")):
        r = client.post("/v1/embeddings", json={"model": MINILM, "input": inp})
        assert r.status_code == 400 and r.json()["error"]["param"] == param
        assert "token-id" in r.json()["error"]["message"]
        assert "check_embedding_ctx_length=False" in r.json()["error"]["message"]


def test_unknown_model_and_malformed_body(client: httpx.Client) -> None:
    r = client.post("/v1/embeddings", json={"model": "no/model", "input": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert r.json()["error"]["param"] == "model" and len(r.headers["x-sie-request-id"]) == 36
    r = client.post(
        "/v1/embeddings", content=b"{oops", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_payload"


def test_matryoshka_dimensions_truncate_and_renormalise() -> None:
    """A model marked matryoshka honours smaller ``dimensions`` (our schema extension)."""
    import shutil
    import tempfile
    from pathlib import Path

    from tests.conftest import CONFIGS, run_stack

    tmp = Path(tempfile.mkdtemp())
    try:
        text = (CONFIGS / "sentence-transformers__all-MiniLM-L6-v2.yaml").read_text()
        (tmp / "m.yaml").write_text(text.replace("dim: 384", "dim: 384\n      matryoshka: true", 1))
        with (
            run_stack(models_dir=str(tmp), preload=(MINILM,)) as s,
            httpx.Client(base_url=s.base_url, timeout=60) as c,
        ):
            full = c.post("/v1/embeddings", json={"model": MINILM, "input": "matryoshka"}).json()
            cut = c.post(
                "/v1/embeddings", json={"model": MINILM, "input": "matryoshka", "dimensions": 64}
            ).json()
            vec = np.asarray(cut["data"][0]["embedding"])
            assert vec.shape == (64,) and abs(np.linalg.norm(vec) - 1.0) < 1e-5
            head = np.asarray(full["data"][0]["embedding"][:64])
            np.testing.assert_allclose(vec, head / np.linalg.norm(head), atol=1e-6)
            too_big = c.post(
                "/v1/embeddings", json={"model": MINILM, "input": "x", "dimensions": 1000}
            )
            assert too_big.status_code == 400
    finally:
        shutil.rmtree(tmp)
