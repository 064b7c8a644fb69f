"""HTTP edge cases found by adversarial trials (content negotiation, disconnects,
label cardinality, ids, limits). Real hypercorn, real model."""

from __future__ import annotations

import socket

import httpx
import msgpack
import numpy as np
import pytest

from tests.conftest import MINILM, Stack

pytestmark = pytest.mark.slow

URL = f"/v1/encode/{MINILM}"
BODY = {"items": [{"text": "negotiate"}]}


@pytest.fixture(scope="module")
def client(stack: Stack) -> httpx.Client:
    with httpx.Client(base_url=stack.base_url, timeout=60) as c:
        yield c


@pytest.mark.parametrize(
    ("accept", "msgpack_out"),
    [
        ("application/msgpack", True),
        ("application/x-msgpack", True),
        ("application/msgpack;q=0.1, application/json", False),
        ("application/msgpack;q=0", False),
        ("application/json, text/x-not-msgpack", False),
        ("application/json;q=0.5, application/msgpack", True),
        ("*/*", False),
        ("", False),
    ],
)
def test_accept_weights(client: httpx.Client, accept: str, msgpack_out: bool) -> None:
    r = client.post(URL, json=BODY, headers={"Accept": accept})
    assert r.status_code == 200
    assert (r.headers["content-type"] == "application/msgpack") is msgpack_out


def test_content_types_and_charsets(client: httpx.Client) -> None:
    r = client.post(
        URL,
        content=b'{"items": [{"text": "x"}]}',
        headers={"Content-Type": "application/json; profile=msgpack-ish"},
    )
    assert r.status_code == 200
    # UTF-8 only (RFC 8259): another declared charset is a 415 before the body is decoded
    latin = '{"items": [{"text": "café"}]}'.encode("latin-1")
    r = client.post(
        URL, content=latin, headers={"Content-Type": "application/json; charset=ISO-8859-1"}
    )
    assert r.status_code == 415
    assert r.json()["detail"]["code"] == "UNSUPPORTED_MEDIA_TYPE"
    assert r.json()["detail"]["field"] == "content-type"
    r = client.post(
        URL,
        content='{"items": [{"text": "café"}]}'.encode(),
        headers={"Content-Type": 'application/json; charset="UTF-8"'},
    )
    assert r.status_code == 200
    utf8 = client.post(URL, json={"items": [{"text": "café"}]})
    np.testing.assert_allclose(
        r.json()["items"][0]["dense"]["values"],
        utf8.json()["items"][0]["dense"]["values"],
        atol=1e-6,
    )
    r = client.post(
        URL, content=msgpack.packb(BODY), headers={"Content-Type": "application/vnd.msgpack"}
    )
    assert r.status_code == 200
    r = client.post(URL, content=b'{"items": [{"text": "x"}], "params": {"options": {"w": NaN}}}')
    assert r.status_code == 400 and "NaN" in r.json()["detail"]["message"]
    r = client.post(URL, content=b'{"items": [{"text": "x"}], "params": {"options": {"w": 1e999}}}')
    assert r.status_code == 400 and "out of range" in r.json()["detail"]["message"]
    r = client.post(URL, content=b"\xc1", headers={"Content-Type": "application/msgpack"})
    assert r.json()["detail"]["field"] == "body"


def test_client_disconnect_mid_body_is_a_400_not_a_500(stack: Stack, client: httpx.Client) -> None:
    host, port = "127.0.0.1", int(stack.base_url.rsplit(":", 1)[1])
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(
            f"POST {URL} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n".encode()
            + b'{"items": ['
        )
        s.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    # Two honest outcomes, depending on whether the EOF reaches hypercorn before or after
    # the app starts reading the body: hypercorn's own bodiless 400, or ours with a code.
    # Never a 500, and the server stays healthy.
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    _head, _, body = reply.partition(b"\r\n\r\n")
    if body:
        assert b"INVALID_PAYLOAD" in body, reply[:400]
    assert client.get("/healthz").text == "ok"


def test_metrics_labels_stay_bounded(client: httpx.Client) -> None:
    for i in range(3):
        client.post(f"/v1/encode/nope-{i}", json=BODY)
    client.post("/v1/embeddings", content=b'{"model": "\\ud800", "input": "x"}')
    client.post("/v1/embeddings", json={"model": "z" * 10_000, "input": "x"})
    r = client.get("/metrics")
    assert r.status_code == 200
    assert "nope-1" not in r.text and "zzzz" not in r.text and 'model="_unknown"' in r.text


def test_default_profile_suffix(client: httpx.Client) -> None:
    assert client.post(f"{URL}:default", json=BODY).status_code == 200
    assert client.get(f"/v1/models/{MINILM}:default").json()["name"] == MINILM
    assert (
        client.post("/v1/embeddings", json={"model": f"{MINILM}:default", "input": "x"}).status_code
        == 200
    )


def test_limits_and_messages(client: httpx.Client) -> None:
    r = client.post(
        URL, json={"items": [{"text": "a"}], "params": {"instruction": "." * 1_000_001}}
    )
    assert r.status_code == 400 and r.json()["detail"]["field"] == "params.instruction"
    r = client.post(
        URL,
        json={
            "items": [{"text": "a"}],
            "params": {"options": {"doc_template": "{text:.>3000000}"}},
        },
    )
    assert r.status_code == 400 and r.json()["detail"]["field"] == "params.options.doc_template"
    r = client.post(
        "/v1/embeddings",
        content=b'{"model": "' + MINILM.encode() + b'", "input": ["ok", "\\ud800"]}',
    )
    assert (
        r.status_code == 400
        and r.json()["error"]["message"] == "input[1]: contains an unpaired surrogate"
    )
    r = client.post(URL, json={"items": [{"text": "a"}], "params": {"output_types": []}})
    assert r.json()["detail"]["message"] == "params.output_types: must not be empty"


def test_config_port_bundle_not_found(stack: Stack) -> None:
    r = httpx.get(f"http://127.0.0.1:{stack.running.config_port}/v1/configs/bundles/nope")
    assert r.status_code == 404 and r.json()["detail"]["code"] == "BUNDLE_NOT_FOUND"
    r = httpx.get(f"http://127.0.0.1:{stack.running.config_port}/v1/configs/bundles/default")
    assert r.status_code == 200 and "sie.engines.encoders.sentence_transformers" in r.text
