"""Config role and gateway config surface over real HTTP (architecture §3, §5, §11, §13, §14).

Stacks here run the gateway and config roles without a worker (no model weights).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sie.core.config import load_yaml
from tests.configdata import model_yaml
from tests.conftest import MINILM, Stack, run_stack, wait_for

ADMIN, USER = "admin-secret", "user-secret"
ST_MODEL = b"""sie_id: acme/mini
hf_id: sentence-transformers/all-MiniLM-L6-v2
tasks: {encode: {dense: {dim: 384}}}
profiles:
  default:
    adapter_path: sie.engines.encoders.sentence_transformers:DenseEncoder
    max_batch_tokens: 4096
"""


def cfg_url(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.running.config_port}"


@pytest.fixture(scope="module")
def plain() -> Iterator[Stack]:
    with run_stack(roles=("gateway", "config"), config_poll_interval_s=0.2) as s:
        yield s


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with run_stack(
        roles=("gateway", "config"),
        auth_mode="token",
        auth_token=USER,
        admin_token=ADMIN,
        config_store_dir=str(tmp_path_factory.mktemp("store")),
        request_timeout_s=1.0,
    ) as s:
        yield s


def test_write_then_read_everywhere(plain: Stack) -> None:
    c = cfg_url(plain)
    r = httpx.post(
        f"{c}/v1/configs/models", content=ST_MODEL, headers={"Content-Type": "application/yaml"}
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["model_id"] == "acme/mini" and body["created_profiles"] == ["default"]
    assert set(body) == {
        "model_id",
        "created_profiles",
        "existing_profiles_skipped",
        "warnings",
        "routable_bundles_by_profile",
        "router_id",
        "epoch",
    }
    assert httpx.post(f"{c}/v1/configs/models", content=ST_MODEL).status_code == 200
    listed = httpx.get(f"{c}/v1/configs/models").json()["models"]
    assert {"model_id": "acme/mini", "profiles": ["default"], "source": "api"} in listed
    minilm = {"model_id": MINILM, "source": "filesystem"}
    assert {**minilm, "profiles": ["default", "fastest", "onnx", "onnx-int8"]} in listed
    doc = httpx.get(f"{c}/v1/configs/models/acme/mini")
    assert doc.headers["content-type"].startswith("application/yaml")
    assert load_yaml(doc.content)["sie_id"] == "acme/mini"
    # the gateway converges (delta on the bus) and serves the same read surface
    gw = plain.base_url
    wait_for(lambda: httpx.get(f"{gw}/v1/configs/models/acme/mini").status_code == 200)
    assert httpx.get(f"{gw}/v1/configs/models/acme/mini").text == doc.text
    assert httpx.get(f"{gw}/v1/configs/models").json() == httpx.get(f"{c}/v1/configs/models").json()
    assert plain.running.gateway is not None and plain.running.gateway.epoch.get() >= body["epoch"]


def test_bundles_and_resolve(plain: Stack) -> None:
    c, gw = cfg_url(plain), plain.base_url
    bundles = httpx.get(f"{c}/v1/configs/bundles").json()["bundles"]
    assert bundles[0]["bundle_id"] == "default" and bundles[0]["adapter_count"] >= 1
    gb = httpx.get(f"{gw}/v1/configs/bundles").json()["bundles"]
    assert gb[0]["bundle_id"] == "default" and "connected_workers" in gb[0]
    assert load_yaml(httpx.get(f"{c}/v1/configs/bundles/default").content)["name"] == "default"
    assert httpx.get(f"{c}/v1/configs/bundles/DEFAULT").status_code == 200
    nf = httpx.get(f"{c}/v1/configs/bundles/nope")
    assert nf.status_code == 404 and nf.json()["detail"]["code"] == "BUNDLE_NOT_FOUND"
    for base in (c, gw):
        r = httpx.post(f"{base}/v1/configs/resolve", json={"model": f"default:/{MINILM}"})
        assert r.status_code == 200, r.text
        assert r.json() == {
            "model": MINILM,
            "resolved_bundle": "default",
            "compatible_bundles": ["default"],
            "profiles": ["default", "fastest", "onnx", "onnx-int8"],
        }
        assert (
            httpx.post(f"{base}/v1/configs/resolve", json={"model": "no/such"}).status_code == 404
        )
        conflict = httpx.post(
            f"{base}/v1/configs/resolve", json={"model": MINILM, "bundle": "nope"}
        )
        assert conflict.status_code == 409 and conflict.json()["detail"]["compatible_bundles"] == [
            "default"
        ]
        assert httpx.post(f"{base}/v1/configs/resolve", json={}).status_code == 400
        assert httpx.post(f"{base}/v1/configs/resolve", content=b"{").status_code == 400


def test_epoch_and_export(plain: Stack) -> None:
    c = cfg_url(plain)
    e = httpx.get(f"{c}/v1/configs/epoch").json()
    assert set(e) == {"epoch", "bundles_hash", "bundle_config_hashes_hash"}
    assert len(e["bundles_hash"]) == 64 and len(e["bundle_config_hashes_hash"]) == 64
    x = httpx.get(f"{c}/v1/configs/export").json()
    assert x["epoch"] == e["epoch"] and x["snapshot_version"] == 1
    assert MINILM in {m["model_id"] for m in x["models"]}


def test_gateway_is_read_only(plain: Stack) -> None:
    gw = plain.base_url
    r = httpx.post(f"{gw}/v1/configs/models", content=ST_MODEL)
    assert r.status_code == 405  # architecture §3, §11 caveat 5
    assert httpx.get(f"{gw}/v1/configs/export").status_code == 404
    assert httpx.get(f"{gw}/v1/configs/epoch").status_code == 404


def test_status_suffix_dispatch(plain: Stack) -> None:
    gw = plain.base_url
    st = httpx.get(f"{gw}/v1/configs/models/{MINILM}/status").json()
    assert st["model_id"] == MINILM and st["all_bundles_acked"] is False  # no worker here
    assert st["bundles"][0]["total_eligible_workers"] == 0
    # an unknown "{id}/status" falls back to reading the whole path as an id: 404
    r = httpx.get(f"{gw}/v1/configs/models/no/such/status")
    assert r.status_code == 404 and r.json()["detail"]["code"] == "MODEL_NOT_FOUND"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"", 400, "PARSE_ERROR"),
        (b"sie_id: [", 400, "PARSE_ERROR"),
        (model_yaml("../x"), 400, "INVALID_MODEL_ID"),
        (model_yaml("x/status"), 400, "INVALID_MODEL_ID"),
        (model_yaml(unknown_key=1), 422, "VALIDATION_ERROR"),
        (
            model_yaml(profiles={"default": {"adapter_path": "nope.mod:X", "max_batch_tokens": 1}}),
            422,
            "UNROUTABLE_MODEL",
        ),
        (b"a: " + b"x" * (1024 * 1024), 413, "PAYLOAD_TOO_LARGE"),
    ],
)
def test_bad_writes_are_4xx_and_change_nothing(
    plain: Stack, body: bytes, status: int, code: str
) -> None:
    c = cfg_url(plain)
    before = (
        httpx.get(f"{c}/v1/configs/export").json()["models"],
        httpx.get(f"{c}/v1/configs/epoch").json(),
    )
    r = httpx.post(f"{c}/v1/configs/models", content=body)
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    assert detail["code"] == code and detail["error"] == code.lower() and detail["message"]
    after = (
        httpx.get(f"{c}/v1/configs/export").json()["models"],
        httpx.get(f"{c}/v1/configs/epoch").json(),
    )
    assert after == before


def test_conflict_over_http_is_409(plain: Stack) -> None:
    c = cfg_url(plain)
    changed = ST_MODEL.replace(b"4096", b"2048")
    httpx.post(f"{c}/v1/configs/models", content=ST_MODEL)
    r = httpx.post(f"{c}/v1/configs/models", content=changed)
    assert r.status_code == 409 and r.json()["detail"]["conflicting_profiles"] == ["default"]


def test_idempotency_key_over_http(plain: Stack) -> None:
    c = cfg_url(plain)
    body = model_yaml("acme/idem").replace(b"org/m", b"acme/idem")
    h = {"Idempotency-Key": "abc-1"}
    first = httpx.post(f"{c}/v1/configs/models", content=body, headers=h)
    again = httpx.post(f"{c}/v1/configs/models", content=body, headers=h)
    assert first.status_code == again.status_code == 201 and first.json() == again.json()
    other = httpx.post(f"{c}/v1/configs/models", content=model_yaml("acme/idem2"), headers=h)
    assert other.status_code == 422 and other.json()["detail"]["code"] == "IDEMPOTENCY_MISMATCH"


def test_registry_unavailable(tmp_path: Path) -> None:
    bad = tmp_path / "bundles"
    bad.mkdir()
    (bad / "broken.yaml").write_text("adapters: {not: a list}\n")
    with run_stack(roles=("config",), bundles_dir=str(bad)) as s:
        c = cfg_url(s)
        assert httpx.get(f"{c}/healthz").status_code == 200
        r = httpx.get(f"{c}/readyz")
        assert r.status_code == 503 and r.json()["detail"]["error"] == "registry_unavailable"
        for method, path in [
            ("GET", "/v1/configs/models"),
            ("GET", "/v1/configs/models/x"),
            ("GET", "/v1/configs/bundles"),
            ("GET", "/v1/configs/bundles/default"),
            ("POST", "/v1/configs/resolve"),
            ("POST", "/v1/configs/models"),
            ("GET", "/v1/configs/export"),
        ]:
            r = httpx.request(method, f"{c}{path}", content=b'{"model": "x"}')
            assert r.status_code == 503, (path, r.text)
            assert r.json()["detail"]["code"] == "REGISTRY_UNAVAILABLE"
        e = httpx.get(f"{c}/v1/configs/epoch")  # intentionally independent of the registry
        assert e.status_code == 200 and e.json() == {
            "epoch": 0,
            "bundles_hash": "",
            "bundle_config_hashes_hash": "",
        }


# -- the auth matrix (architecture §3, §13): every route x no/inference/admin/wrong token ----

TOKENS = {"none": None, "user": USER, "admin": ADMIN, "wrong": "nope"}
OK, DENY401, DENY403 = "ok", 401, 403

GATEWAY_ROUTES: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", f"/v1/encode/{MINILM}", {"none": 401, "user": OK, "admin": OK, "wrong": 401}),
    ("POST", "/v1/embeddings", {"none": 401, "user": OK, "admin": OK, "wrong": 401}),
    ("GET", "/v1/models", {"none": 401, "user": OK, "admin": OK, "wrong": 401}),
    ("GET", f"/v1/models/{MINILM}", {"none": 401, "user": OK, "admin": OK, "wrong": 401}),
    ("GET", "/v1/configs/models", {"none": 401, "user": OK, "admin": OK, "wrong": 401}),
    ("GET", f"/v1/configs/models/{MINILM}", {"none": 401, "user": OK, "admin": OK, "wrong": 401}),
    (
        "GET",
        f"/v1/configs/models/{MINILM}/status",
        {"none": 401, "user": OK, "admin": OK, "wrong": 401},
    ),
    ("GET", "/v1/configs/bundles", {"none": 401, "user": OK, "admin": OK, "wrong": 401}),
    ("GET", "/v1/configs/bundles/default", {"none": 401, "user": OK, "admin": OK, "wrong": 401}),
    ("POST", "/v1/configs/resolve", {"none": 401, "user": OK, "admin": OK, "wrong": 401}),
    ("POST", "/v1/configs/models", {"none": 401, "user": 403, "admin": 405, "wrong": 403}),
    ("GET", "/health", {"none": 401, "user": OK, "admin": OK, "wrong": 401}),
    ("GET", "/metrics", {"none": 401, "user": OK, "admin": OK, "wrong": 401}),
    ("GET", "/healthz", {"none": OK, "user": OK, "admin": OK, "wrong": OK}),
    ("GET", "/readyz", {"none": OK, "user": OK, "admin": OK, "wrong": OK}),
]
CONFIG_ROUTES: list[tuple[str, str, dict[str, Any]]] = [
    ("GET", "/v1/configs/models", {"none": 401, "user": OK, "admin": OK, "wrong": 403}),
    ("GET", f"/v1/configs/models/{MINILM}", {"none": 401, "user": OK, "admin": OK, "wrong": 403}),
    ("GET", "/v1/configs/bundles", {"none": 401, "user": OK, "admin": OK, "wrong": 403}),
    ("GET", "/v1/configs/bundles/default", {"none": 401, "user": OK, "admin": OK, "wrong": 403}),
    ("POST", "/v1/configs/resolve", {"none": 401, "user": OK, "admin": OK, "wrong": 403}),
    ("GET", "/v1/configs/epoch", {"none": 401, "user": OK, "admin": OK, "wrong": 403}),
    ("POST", "/v1/configs/models", {"none": 401, "user": 403, "admin": OK, "wrong": 403}),
    ("GET", "/v1/configs/export", {"none": 401, "user": 403, "admin": OK, "wrong": 403}),
    ("GET", "/healthz", {"none": OK, "user": OK, "admin": OK, "wrong": OK}),
    ("GET", "/readyz", {"none": OK, "user": OK, "admin": OK, "wrong": OK}),
    ("GET", "/metrics", {"none": 401, "user": OK, "admin": OK, "wrong": 403}),
]


def _body(path: str) -> bytes:
    if path.endswith("/resolve"):
        return f'{{"model": "{MINILM}"}}'.encode()
    if path == "/v1/embeddings":
        return f'{{"model": "{MINILM}", "input": "x"}}'.encode()
    if path.startswith("/v1/encode"):
        return b'{"items": [{"text": "x"}]}'
    return model_yaml("acme/auth")


def _check(base: str, method: str, path: str, expect: dict[str, Any]) -> None:
    for who, token in TOKENS.items():
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        r = httpx.request(method, base + path, content=_body(path), headers=headers, timeout=30)
        want = expect[who]
        if want == OK:
            assert r.status_code not in (401, 403, 500), (method, path, who, r.status_code, r.text)
        else:
            assert r.status_code == want, (method, path, who, r.status_code, r.text)
        if r.status_code == 401:
            assert r.headers.get("www-authenticate") == "Bearer"


@pytest.mark.parametrize(("method", "path", "expect"), GATEWAY_ROUTES)
def test_gateway_auth_matrix(
    secured: Stack, method: str, path: str, expect: dict[str, Any]
) -> None:
    _check(secured.base_url, method, path, expect)


@pytest.mark.parametrize(("method", "path", "expect"), CONFIG_ROUTES)
def test_config_auth_matrix(secured: Stack, method: str, path: str, expect: dict[str, Any]) -> None:
    _check(cfg_url(secured), method, path, expect)


def test_secured_gateway_still_bootstraps_with_the_admin_token(secured: Stack) -> None:
    gw = secured.running.gateway
    assert gw is not None
    wait_for(lambda: gw.sync.bootstrapped)
    assert not gw.sync.degraded


def test_embeddings_auth_error_uses_the_openai_envelope(secured: Stack) -> None:
    r = httpx.post(f"{secured.base_url}/v1/embeddings", json={"model": MINILM, "input": "x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"


def test_only_inference_token_refuses_all_config_writes() -> None:
    with run_stack(roles=("config",), auth_token=USER) as s:
        c = cfg_url(s)
        for token in (None, USER, ADMIN):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            r = httpx.post(f"{c}/v1/configs/models", content=ST_MODEL, headers=headers)
            assert r.status_code == 403, r.text
        assert (
            httpx.get(
                f"{c}/v1/configs/models", headers={"Authorization": f"Bearer {USER}"}
            ).status_code
            == 200
        )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (model_yaml(unknown_key=1), "unknown_key"),
        (
            model_yaml(profiles={"default": {"adapter_path": "a.b:C", "max_batch_tokens": True}}),
            "profiles.default.max_batch_tokens",
        ),
        (
            model_yaml(
                profiles={
                    "default": {"adapter_path": "a.b:C", "max_batch_tokens": 1},
                    "x": {"extends": "nope"},
                }
            ),
            "profiles.x.extends",
        ),
        (
            model_yaml(
                profiles={
                    "default": {"adapter_path": "a.b:C", "max_batch_tokens": 1},
                    "a b": {"extends": "default"},
                }
            ),
            "profiles.a b",
        ),
        (b"1: x\n", "body"),
        (model_yaml("acme/" + "a" * 300), "sie_id"),
        (model_yaml("acme//x"), "sie_id"),
    ],
)
def test_validation_errors_name_the_field(plain: Stack, body: bytes, field: str) -> None:
    r = httpx.post(f"{cfg_url(plain)}/v1/configs/models", content=body)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["detail"]["field"] == field, r.text
