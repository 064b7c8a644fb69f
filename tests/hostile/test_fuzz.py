"""Property-based hostile-input fuzzing of every HTTP route, over real HTTP (hypothesis).

One in-process SIE with every role (real hypercorn on loopback, the memory bus, MiniLM
preloaded) is driven through one persistent httpx client: every route of the gateway
app (``sie.http.gateway.build_gateway_app``) and of the config app
(``sie.http.config.build_config_app``), with JSON and msgpack bodies built from each
route's schema and then mutated (wrong types, huge / negative / non-finite numbers,
nesting up to 200 levels, unicode edge cases, nulls, empty and extra keys), raw random
bytes, and hostile headers (``Content-Type`` charsets and parameters, ``Accept``
weights, ``X-SIE-Pool`` / ``X-SIE-Machine-Profile``, ``Idempotency-Key``,
``Authorization``, ``traceparent``). A second stack with ``SIE_AUTH_MODE=token``
covers the auth paths. The status stream (``/ws/cluster-status``) gets raw websocket
handshakes, hostile ones included, and hostile frames once open. The drop-in routes'
default models are set (``DEFAULT_MODELS``), so a body without ``model`` runs too.

Generation is served by ``sie.engines.generators.openai_upstream`` over the fake vLLM server
(``tests/fakes/fake_vllm.py``), so valid chat / completion / generate requests run end
to end in milliseconds and the worker's body parsing is fuzzed too.

Every case must answer (a dropped or reset connection, or a timeout, fails it):

- a status below 500, except a retryable 503 (``X-SIE-Error-Code`` naming a documented
  503 error that carries ``Retry-After``, and a ``Retry-After`` header) or a 502
  ``MODEL_LOAD_FAILED``;
- every error with its envelope and a stable code equal to ``X-SIE-Error-Code``: SIE
  ``{"detail": {"code"}}`` (``{"error": {"code"}}`` for 5xx), OpenAI ``{"error":
  {"code"}}`` on the OpenAI routes, ``{"detail": {"code", "error"}}`` on the config app;
  on the drop-in routes (docs/api.md §15) TEI's ``{"error", "error_type", "code"}`` and
  SIE's envelope plus Cohere's ``message`` (a wrong method: SIE's 405);
- a 2xx body that decodes as its ``Content-Type`` says; an event stream carries no
  server-side ``error`` event (other than a retryable one); a drop-in rerank ranks best
  first, a TEI vector is finite, sparse indices ascend.

Afterwards ``/healthz`` answers at once, MiniLM still encodes exactly as
sentence-transformers does, and every route of both apps got cases.

Cases are fixed (``derandomize``); ``pytest -s`` prints, per test, the requests by
status and the slowest cases. Exploring: ``FUZZ_SCALE=10`` (ten times the cases),
``FUZZ_RANDOM=1`` (new cases each run), ``FUZZ_VERBOSE=1`` (every error body).
"""

from __future__ import annotations

import codecs
import copy
import json
import math
import os
import re
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args
from urllib.parse import parse_qs, quote, urlsplit

import httpx
import msgpack
import msgpack_numpy
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.routing import Route, WebSocketRoute

from sie.core import errors as sie_errors
from sie.core.config import dump_yaml
from sie.http.compat import TeiErrorType
from sie.http.dropin import COHERE_PATHS, TEI_PATHS
from sie.http.pages import BROWSER_PATHS
from tests.conftest import CONFIGS, MINILM, Stack, run_stack
from tests.fakes.fake_vllm import FakeAsyncLLM, FakeVllmServer, serve

pytestmark = pytest.mark.slow

SPLADE = "rasyosef/splade-tiny"
RAMPART = "nationaldesignstudio/rampart"
LLM = "fuzz/upstream-llm"  # openai_upstream over the fake vLLM server
UPSTREAM_MODEL = "fake/model"
USER, ADMIN = "fuzz-user-token", "fuzz-admin-token"

#: Documented retryable 503s: an error class with status 503 and a Retry-After.
RETRYABLE_503 = frozenset(
    cls.code
    for cls in vars(sie_errors).values()
    if isinstance(cls, type)
    and issubclass(cls, sie_errors.SieError)
    and cls.status == 503
    and cls.retry_after_s is not None
)
OPENAI_ROUTES = ("/v1/embeddings", "/v1/chat/completions", "/v1/completions", "/v1/generate/")
SIE_CODE = re.compile(r"^[A-Z][A-Z0-9_]*$")
TEI_ERROR_TYPES = frozenset(get_args(TeiErrorType))
#: the drop-in routes' default models (a body without ``model`` runs on them)
DEFAULT_MODELS = {
    "default_embed_model": MINILM,
    "default_sparse_model": SPLADE,
    "default_rerank_model": MINILM,
}


def fuzz_settings(n: int) -> Any:
    """Fixed cases in CI. Exploring: ``FUZZ_SCALE=10`` runs ten times as many cases,
    ``FUZZ_RANDOM=1`` new random ones on each run."""
    return settings(
        max_examples=int(n * float(os.environ.get("FUZZ_SCALE", "1"))),
        deadline=None,
        derandomize=not os.environ.get("FUZZ_RANDOM"),
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )


# ---------------------------------------------------------------------------- stacks


@dataclass
class Target:
    gateway: str
    config: str


@dataclass
class Models:
    dir: Path
    upstream_url: str

    def overrides(self) -> dict[str, Any]:
        return {"models_dir": str(self.dir), "upstream_base_urls": (self.upstream_url,)}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Models]:
    """The shipped configs minus SmolLM2 (too slow to load here), plus an LLM served by
    the fake vLLM server through ``openai_upstream``."""
    engine = FakeAsyncLLM(model=UPSTREAM_MODEL, step_s=0.0002, max_num_seqs=8)
    with serve(FakeVllmServer(engine)) as server:
        d = tmp_path_factory.mktemp("fuzz-models")
        for src in CONFIGS.glob("*.yaml"):
            if "SmolLM2" not in src.name:
                (d / src.name).write_bytes(src.read_bytes())
        (d / "fuzz__upstream-llm.yaml").write_text(
            f"""sie_id: {LLM}
hf_id: {UPSTREAM_MODEL}
inputs: {{text: true}}
tasks: {{generate: {{}}}}
max_sequence_length: 2048
profiles:
  default:
    adapter_path: sie.engines.generators.openai_upstream:OpenAIUpstreamGenerator
    max_batch_tokens: 8192
    adapter_options:
      loadtime:
        base_url: {server.base_url}
        max_num_seqs: 8
        timeout_s: 20
"""
        )
        yield Models(d, server.base_url)
    engine.shutdown()


@pytest.fixture(scope="module")
def open_stack(models: Models) -> Iterator[Stack]:
    with run_stack(preload=(MINILM, LLM), **DEFAULT_MODELS, **models.overrides()) as s:
        yield s


@pytest.fixture(scope="module")
def secured_stack(models: Models) -> Iterator[Stack]:
    with run_stack(
        auth_mode="token",
        auth_token=USER,
        admin_token=ADMIN,
        **DEFAULT_MODELS,
        **models.overrides(),
    ) as s:
        yield s


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    """The one persistent client of every fuzz case (keep-alive connections)."""
    with httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0)) as c:
        yield c


def target(stack: Stack) -> Target:
    return Target(stack.base_url, f"http://127.0.0.1:{stack.running.config_port}")


# ------------------------------------------------------------------------ assertions


def _where(resp: httpx.Response, body: bytes | None) -> str:
    sent = body[:300] if body is not None else b""
    return (
        f"{resp.request.method} {resp.request.url.raw_path!r} "
        f"headers={dict(resp.request.headers)!r} body={sent!r} "
        f"-> {resp.status_code} {dict(resp.headers)!r} {resp.content[:600]!r}"
    )


def _error_code(resp: httpx.Response, envelope: str, where: str) -> str:
    try:
        body = resp.json()
    except ValueError:
        pytest.fail(f"error body is not JSON: {where}")
    assert isinstance(body, dict), where
    if envelope == "tei" and "error_type" in body:  # TEI's, with SIE's code beside it
        assert isinstance(body.get("error"), str), where
        assert body["error_type"] in TEI_ERROR_TYPES, where
        assert (body["error_type"] == "Validation") == (resp.status_code < 500), where
        code = body.get("code")
        assert isinstance(code, str) and SIE_CODE.match(code), where
        return code
    if envelope == "cohere" and "message" in body:  # SIE's, plus Cohere's message
        assert isinstance(body["message"], str), where
    elif envelope in ("tei", "cohere"):  # a wrong method, refused before the route runs
        assert resp.status_code == 405, where
    if envelope == "openai":
        err = body.get("error")
        assert isinstance(err, dict) and set(err) >= {"message", "type", "code"}, where
        code = err["code"]
        assert isinstance(code, str) and SIE_CODE.match(code.upper()), where
        return code.upper()
    key = "error" if envelope in ("sie", "cohere") and resp.status_code >= 500 else "detail"
    detail = body.get(key)
    assert isinstance(detail, dict), where
    code = detail.get("code")
    assert isinstance(code, str) and SIE_CODE.match(code), where
    assert isinstance(detail.get("message"), str), where
    if envelope == "cohere" and "message" in body:
        assert body["message"] == detail["message"], where
    if envelope == "config":
        assert detail.get("error") == code.lower(), where
    return code


def _check_event_stream(resp: httpx.Response, where: str) -> None:
    """Every ``data:`` is JSON or ``[DONE]``; the stream ends with ``[DONE]`` or an
    ``error`` event (never a silent stop), and an error event is not a server error
    (unless a retryable one)."""
    event, ended = None, False
    for line in resp.text.split("\n"):
        if line.startswith("event:"):
            event = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                ended = True
                continue
            payload = json.loads(data)
            if event == "error":
                err = payload["error"]
                if err.get("type") == "server_error":
                    assert str(err.get("code", "")).upper() in RETRYABLE_503, where
                ended = True
            event = None
        elif not line:
            event = None
    assert ended, f"event stream stopped without [DONE] or an error event: {where}"


def check(resp: httpx.Response, envelope: str, body: bytes | None = None) -> None:
    """The per-case invariants (module docstring)."""
    status = resp.status_code
    where = _where(resp, body)
    code_header = resp.headers.get("x-sie-error-code")
    if status >= 500:
        if status == 503:
            assert code_header in RETRYABLE_503, f"non-retryable 503: {where}"
            assert (resp.headers.get("retry-after") or "").isdigit(), (
                f"503 without Retry-After: {where}"
            )
        elif status == 502:
            assert code_header == "MODEL_LOAD_FAILED", f"unexpected 502: {where}"
        else:
            pytest.fail(f"server error: {where}")
    if resp.request.method == "HEAD":
        return
    if status >= 400:
        code = _error_code(resp, envelope, where)
        assert code_header == code, f"X-SIE-Error-Code differs from the body's code: {where}"
    elif 200 <= status < 300:
        ctype = resp.headers.get("content-type", "")
        if ctype.startswith("application/json"):
            try:
                json.loads(resp.content)
            except ValueError:
                pytest.fail(f"2xx body is not JSON: {where}")
        elif "msgpack" in ctype:
            msgpack.unpackb(resp.content, object_hook=msgpack_numpy.decode)
        elif ctype.startswith("text/event-stream"):
            _check_event_stream(resp, where)
    if resp.request.url.path.startswith("/v1/") and envelope != "config":
        assert resp.headers.get("x-sie-request-id"), f"no X-SIE-Request-Id: {where}"


#: (test, status) -> responses, printed by the last test (``pytest -s``)
STATS: dict[tuple[str, int], int] = {}
#: (seconds, request) of the slow cases, printed likewise
SLOW: list[tuple[float, str]] = []
#: test -> seconds spent waiting for responses; test -> (wall, process CPU) seconds
REQUEST_S: dict[str, float] = {}
COST: dict[str, tuple[float, float]] = {}
#: (app, method, decoded path) of every case, to check that every route was fuzzed
HIT: set[tuple[str, str, str]] = set()


@pytest.fixture(autouse=True)
def _cost(request: pytest.FixtureRequest) -> Iterator[None]:
    wall, cpu = time.monotonic(), time.process_time()
    yield
    COST[request.node.name] = (time.monotonic() - wall, time.process_time() - cpu)


def _caller() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "?").split("::")[-1].split(" ")[0]


def envelope_of(path: str, app: str) -> str:
    if app == "config":
        return "config"
    bare = path.partition("?")[0]
    if bare in TEI_PATHS:
        return "tei"
    if bare in COHERE_PATHS:
        return "cohere"
    return "openai" if path.startswith(OPENAI_ROUTES) else "sie"


def send(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    headers: dict[str, bytes] | None = None,
    content: bytes | None = None,
    chunked: bool = False,
) -> httpx.Response:
    """One request (``chunked``: the body in two chunks, no Content-Length); a
    dropped/reset connection or a timeout fails the case."""
    # h11 refuses to send whitespace at either end of a value: it is not ours to test
    headers = {k: v.strip(b" \t") for k, v in (headers or {}).items()}
    body: Any = content
    if chunked and content:
        body = iter([content[: len(content) // 2], content[len(content) // 2 :]])
    try:
        started = time.monotonic()
        resp = client.request(method, url, headers=headers, content=body)
        took = time.monotonic() - started
        key = (_caller(), resp.status_code)
        STATS[key] = STATS.get(key, 0) + 1
        REQUEST_S[_caller()] = REQUEST_S.get(_caller(), 0.0) + took
        if resp.status_code >= 400 and os.environ.get("FUZZ_VERBOSE"):
            print(f"{_caller()} {resp.status_code} {resp.content[:160]!r}")
        if took > 0.5:
            SLOW.append(
                (
                    took,
                    f"{method} {url[:120]} {(content or b'')[:160]!r} -> {resp.status_code} "
                    f"{ {k: v for k, v in resp.headers.items() if k.endswith('-time')} }",
                )
            )
        return resp
    except httpx.TransportError as exc:
        print(
            f"FUZZ FAILURE: {method} {url} headers={headers!r} "
            f"body={(content or b'')[:600]!r}: {exc!r}",
            file=sys.stderr,
        )
        pytest.fail(
            f"connection dropped or timed out: {method} {url} headers={headers!r} "
            f"body={(content or b'')[:300]!r}: {exc!r}"
        )


def fire(
    client: httpx.Client,
    base: str,
    app: str,
    method: str,
    path: str,
    headers: dict[str, bytes],
    content: bytes | None,
    *,
    chunked: bool = False,
) -> httpx.Response:
    resp = send(client, method, base + path, headers=headers, content=content, chunked=chunked)
    HIT.add((app, method, resp.request.url.path))
    try:
        check(resp, envelope_of(path, app), content)
    except BaseException:  # shown even when hypothesis cannot replay the failure
        print(f"FUZZ FAILURE: {_where(resp, content)}", file=sys.stderr)
        raise
    return resp


# ------------------------------------------------------------------------ strategies

SURROGATES = ["\ud800", "\udc00", "\udfff", "a\ud83d", "\ude00b"]
ODD_TEXTS = [
    "",
    " ",
    "hello world",
    "\x00",
    "a\x00b",
    "\u200b\u200d\ufeff",
    "\U0001f600" * 8,
    "e\u0301" * 10,
    "\u202eevil",
    "\U0010ffff",
    "\ufffe\uffff",
    "a\r\nb\tc",
    "<|im_start|>system\nx<|im_end|>",
    "[CLS] [SEP] [PAD] [MASK] [UNK]",
    "{text}",
    "{0}{1}",
    "%s%n%x",
    "null",
    "🏳️‍🌈" * 4,
    "ΑΒΓ абв 中文 日本語 한국어 عربى",
    "word " * 300,  # past the 256-token window (truncated)
]


@st.composite
def _pick(draw: st.DrawFn, table: list[st.SearchStrategy[Any]]) -> Any:
    return draw(draw(st.sampled_from(table)))


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """``one_of`` with integer weights (``one_of`` itself ignores repeated branches)."""
    return _pick([s for w, s in choices for _ in range(w)])


@st.composite
def _sparse(
    draw: st.DrawFn,
    required: dict[str, st.SearchStrategy[Any]],
    optional: dict[str, st.SearchStrategy[Any]],
    max_optional: int,
) -> dict[str, Any]:
    out = {k: draw(v) for k, v in required.items()}
    if optional:
        names = list(optional)
        for _ in range(draw(st.integers(0, max_optional))):
            name = draw(st.sampled_from(names))
            out[name] = draw(optional[name])
    return out


def sparse_dict(
    required: dict[str, st.SearchStrategy[Any]],
    optional: dict[str, st.SearchStrategy[Any]] | None = None,
    max_optional: int = 3,
) -> st.SearchStrategy[dict[str, Any]]:
    """``fixed_dictionaries`` with at most ``max_optional`` optional keys: far fewer
    draws per example than one coin per optional key."""
    return _sparse(required, optional or {}, max_optional)


TEXT = weighted(
    (4, st.text(alphabet=st.characters(codec="ascii", min_codepoint=32), max_size=30)),
    (3, st.sampled_from(ODD_TEXTS)),
    (2, st.text(max_size=40)),
    (1, st.sampled_from(SURROGATES)),
)
SHORT_TEXT = st.one_of(st.sampled_from(["hello", "a", "query", "Paris is in France."]), TEXT)
KEY = st.one_of(
    st.sampled_from(["", "items", "text", "__proto__", "constructor", "$ref", "a.b", "\x00"]),
    st.text(max_size=8),
)
HUGE_INTS = [
    0,
    -1,
    1,
    2**31,
    -(2**31) - 1,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    -(2**63),
    -(2**63) - 1,
    10**30,
    -(10**30),
]
ODD_FLOATS = [0.0, -0.0, 5e-324, 1e308, -1e308, math.nan, math.inf, -math.inf, 0.5, 2.0000001]
SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(HUGE_INTS),
    st.integers(min_value=-(2**66), max_value=2**66),
    st.sampled_from(ODD_FLOATS),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
)


def nest(depth: int, leaf: Any, kind: str) -> Any:
    out = leaf
    for _ in range(depth):
        out = [out] if kind == "list" else {"a": out}
    return out


DEEP = st.builds(
    nest,
    st.integers(min_value=1, max_value=200),
    st.one_of(st.none(), st.just("x"), st.just({}), st.just([])),
    st.sampled_from(["list", "dict"]),
)
HOSTILE = st.one_of(
    SCALAR,
    st.lists(SCALAR, max_size=5),
    st.dictionaries(KEY, SCALAR, max_size=4),
    st.just([]),
    st.just({}),
    DEEP,
)


class _Ext:
    """Marks a value only msgpack can carry (applied at encoding time)."""

    def __init__(self, value: Any) -> None:
        self.value = value


MSGPACK_ONLY = st.one_of(
    st.binary(max_size=16).map(_Ext),
    st.sampled_from(
        [
            _Ext(msgpack.ExtType(1, b"x")),
            _Ext(msgpack.Timestamp(1, 2)),
            _Ext({1: "int key"}),
            _Ext({b"bin-key": 1}),
            _Ext({(1, 2): "tuple key"}),
            _Ext({"nd": True, "type": "<f4", "kind": b"", "shape": [2], "data": b"\x00" * 8}),
            _Ext({b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [4], b"data": b"12"}),
            _Ext({"nd": True, "type": "<M8[D]", "kind": b"", "shape": [1], "data": b"\x00" * 8}),
            _Ext({"nd": False, "type": "<i8", "kind": b"", "data": b"\x01" + b"\x00" * 7}),
            _Ext({"nd": True, "type": "|b1", "kind": b"", "shape": [1], "data": b"\x01"}),
            _Ext({"nd": True, "type": "<U3", "kind": b"", "shape": [1], "data": b"a\0\0\0" * 3}),
        ]
    ),
)


class Repeat:
    """``value * n`` (a list or a string), built at encoding time (a short repr)."""

    def __init__(self, value: Any, n: int) -> None:
        self.value, self.n = value, n

    def __repr__(self) -> str:
        return f"Repeat({self.value!r}, {self.n})"


class Blob(bytes):
    """Request bytes whose repr stays short in hypothesis' reports."""

    def __repr__(self) -> str:
        head = bytes(self[:200])
        return f"{head!r}..({len(self)} bytes)" if len(self) > 200 else repr(head)


def _plain(doc: Any, msgpack_ok: bool) -> Any:
    """``doc`` with ``_Ext`` markers resolved (msgpack) or replaced by a string (JSON),
    and ``Repeat`` expanded."""
    if isinstance(doc, Repeat):
        return _plain(copy.deepcopy(doc.value) * doc.n, msgpack_ok)
    if isinstance(doc, _Ext):
        return doc.value if msgpack_ok else "ext"
    if isinstance(doc, dict):
        return {k: _plain(v, msgpack_ok) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_plain(v, msgpack_ok) for v in doc]
    big = isinstance(doc, int) and not isinstance(doc, bool) and not -(2**63) <= doc < 2**64
    if msgpack_ok and big:
        return float(doc)  # msgpack has no bigger integers
    return doc


def _paths(node: Any, prefix: tuple[Any, ...] = (), depth: int = 0) -> list[tuple[Any, ...]]:
    """Every place in ``node`` (the first 8 entries of a list, 6 levels deep)."""
    out = [prefix]
    if depth <= 6 and isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k), depth + 1)
    elif depth <= 6 and isinstance(node, list):
        for i, v in enumerate(node[:8]):
            out += _paths(v, (*prefix, i), depth + 1)
    return out


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[Any], msgpack_ok: bool = True) -> Any:
    """A document from ``base`` with 0-3 hostile mutations at random places."""
    doc = copy.deepcopy(draw(base))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2, 3]))):
        path = draw(st.sampled_from(_paths(doc)))
        op = draw(st.sampled_from(["replace", "replace", "replace", "delete", "extra", "wrap"]))
        values = st.one_of(HOSTILE, MSGPACK_ONLY) if msgpack_ok else HOSTILE

        def fresh(strategy: st.SearchStrategy[Any]) -> Any:
            # a copy: later mutations must not edit a shared ``st.just({})`` value
            return copy.deepcopy(draw(strategy))

        if not path:
            if op == "replace":
                doc = fresh(values)
            elif op == "wrap":
                doc = draw(st.sampled_from([[doc], {"body": doc}, [doc, doc]]))
            elif isinstance(doc, dict):
                doc[draw(KEY)] = fresh(values)
            continue
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        last = path[-1]
        if op == "delete":
            del parent[last]
        elif op == "extra" and isinstance(parent, dict):
            parent[draw(KEY)] = fresh(values)
        elif op == "extra" and isinstance(parent, list):
            parent.append(fresh(values))
        elif op == "wrap":
            parent[last] = draw(st.sampled_from([[parent[last]], {"v": parent[last]}]))
        else:
            parent[last] = fresh(values)
    return doc


def _valid_charset_bytes(text: str, charset: str) -> bytes | None:
    try:
        codecs.lookup(charset)
        return text.encode(charset)
    except (LookupError, UnicodeError, TypeError):
        return None


JSON_CONTENT_TYPES = [
    None,
    "application/json",
    "application/json; charset=utf-8",
    "application/json;charset=UTF-8",
    'application/json; charset="utf-8"',
    "application/json; charset=utf-16",
    "application/json; charset=utf-16-be",
    "application/json; charset=utf-32",
    "application/json; charset=latin-1",
    "application/json; charset=cp500",
    "application/json; charset=utf-7",
    "application/json; charset=unicode_escape",
    "application/json; charset=punycode",
    "application/json; charset=idna",
    "application/json; charset=rot13",
    "application/json; charset=base64",
    "application/json; charset=bogus-charset",
    "application/json; charset=",
    "application/json; charset",
    "application/json; =; ;;",
    "APPLICATION/JSON",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=xyz",
    "application/yaml",
    "*/*",
    "",
    ";",
]
MSGPACK_CONTENT_TYPES = [
    "application/msgpack",
    "application/x-msgpack",
    "application/vnd.msgpack",
    "Application/MsgPack",
    "application/msgpack; charset=utf-8",
    "application/msgpack; q=0",
    " application/msgpack ; x=y",
]
ACCEPTS = [
    "application/json",
    "application/msgpack",
    "application/x-msgpack;q=0.9, application/json;q=0.1",
    "application/msgpack;q=0",
    "application/msgpack;q=nan",
    "application/msgpack;q=inf",
    "application/msgpack;q=-1",
    "application/msgpack;q=1e999",
    "application/msgpack;q=abc",
    "application/msgpack;;;q",
    "*/*",
    "text/event-stream",
    "text/html",
    "",
    ",,,;;;",
    "application/json;q=0, application/msgpack;q=0",
]
POOLS = [
    "default",
    "DEFAULT",
    "Default",
    "other-pool",
    "gpu_a100",
    "",
    "a b",
    "../../etc",
    "pool.with.dots",
    "*",
    ">",
    "x" * 300,
    "caf\xe9",
]
AUTHS = [
    f"Bearer {USER}",
    f"Bearer {ADMIN}",
    f"bearer   {USER}  ",
    f"BEARER {ADMIN}",
    "Bearer",
    "Bearer ",
    "Bearer wrong-token",
    f"Bearer {USER}x",
    f"Basic {USER}",
    f"{USER}",
    "",
    "Bearer caf\xe9",
    "Bearer " + "A" * 4000,
]
TRACEPARENTS = [
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-00000000000000000000000000000000-0000000000000000-00",
    "ff-zz-yy-xx",
    "",
    "00-" + "f" * 200,
]
#: header bytes h11 can send: no NUL, no whitespace at the ends, inner spaces/tabs only
HEADER_BYTES = st.binary(max_size=40).map(
    lambda b: bytes(c for c in b if c not in b"\x00\r\n\x0b\x0c").strip(b" \t")
)


def _hv(values: list[str]) -> st.SearchStrategy[bytes]:
    sampled = st.sampled_from(values).map(lambda v: v.strip(" \t").encode("latin-1"))
    return st.one_of(sampled, HEADER_BYTES)


OPTIONAL_HEADERS = {
    "Accept": _hv(ACCEPTS),
    "X-SIE-Pool": _hv(POOLS),
    "X-SIE-Machine-Profile": _hv(POOLS),
    "Idempotency-Key": _hv(["k1", "k1", "", "x" * 1000]),
    "traceparent": _hv(TRACEPARENTS),
    "tracestate": _hv(["a=b", ",,,", "=" * 50]),
    "Content-Encoding": _hv(["gzip", "br", "identity", "bogus"]),
    "X-Forwarded-For": HEADER_BYTES,
}
#: routing headers less often: most valid values answer 503 PROVISIONING (no worker)
HEADER_NAMES = [n for n in OPTIONAL_HEADERS for _ in range(1 if n.startswith("X-SIE") else 3)]


@st.composite
def hostile_headers(draw: st.DrawFn, *, auth: bool = False) -> dict[str, bytes]:
    """Optional hostile headers (``Content-Type`` is set by the body strategy)."""
    out: dict[str, bytes] = {}
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        name = draw(st.sampled_from(HEADER_NAMES))
        out[name] = draw(OPTIONAL_HEADERS[name])
    # with auth on, 9 in 10 cases send an Authorization header; otherwise 1 in 10
    if draw(st.sampled_from([auth] * 9 + [not auth])):
        out["Authorization"] = draw(_hv(AUTHS))
    return out


@st.composite
def encoded(
    draw: st.DrawFn, base: st.SearchStrategy[Any], *, allow_msgpack: bool = True
) -> tuple[bytes, dict[str, bytes]]:
    """``(body, {"Content-Type": ...})``: a mutated document as JSON or msgpack."""
    fmt = draw(st.sampled_from(["json", "json", "msgpack"])) if allow_msgpack else "json"
    doc = draw(mutated(base, msgpack_ok=fmt == "msgpack"))
    headers: dict[str, bytes] = {}
    if fmt == "msgpack":
        ctype = draw(st.sampled_from(MSGPACK_CONTENT_TYPES))
        errors = draw(st.sampled_from(["surrogatepass", "replace"]))
        body = msgpack.packb(_plain(doc, True), use_bin_type=True, unicode_errors=errors)
        headers["Content-Type"] = ctype.encode()
        return Blob(body), headers
    doc = _plain(doc, False)
    ctype_s = draw(
        weighted(
            (3, st.just("application/json")),
            (1, st.none()),
            (2, st.sampled_from(JSON_CONTENT_TYPES)),
        )
    )
    text = json.dumps(doc, allow_nan=True, ensure_ascii=draw(st.booleans()))
    body = text.encode("utf-8", "surrogatepass")
    if ctype_s is not None:
        headers["Content-Type"] = ctype_s.encode()
        charset = ctype_s.partition("charset=")[2].strip('"')
        if charset and draw(st.booleans()):  # really encode it in the declared charset
            body = _valid_charset_bytes(text, charset) or body
    return Blob(body), headers


# ----------------------------------------------------------------- route documents

#: 1 in 10 bodies goes out chunked (Transfer-Encoding, no Content-Length)
CHUNKED = st.sampled_from([False] * 9 + [True])

MODEL_PATHS = weighted(
    (8, st.just(MINILM)),
    (2, st.just(SPLADE)),
    (
        3,
        st.sampled_from(
            [
                f"{MINILM}:default",
                f"{MINILM}:nope",
                MINILM.upper(),
                SPLADE,
                RAMPART,
                LLM,
                "nope/none",
                "",
                "%ff%fe",
                "%00",
                "..%2F..%2Fetc%2Fpasswd",
                "../../etc/passwd",
                "a" * 3000,
                f"{MINILM}/",
                f"{MINILM}:default:default",
                "default:" + MINILM,
                f"{MINILM}/status",
            ]
        ),
    ),
    (1, st.text(max_size=30).map(lambda s: quote(s, safe="/:"))),
)
DTYPES = ["float32", "float16", "int8", "uint8", "binary", "ubinary", "float64", "", "INT8"]
OUTPUT_TYPES = st.lists(
    st.sampled_from(["dense", "sparse", "multivector", "colbert", "", "DENSE"]),
    min_size=0,
    max_size=4,
)
TEMPLATES = st.sampled_from(
    [
        "{text}",
        "query: {text}",
        "{instruction} {text}",
        "{text:>10}",
        "{text!r}",
        "{0}",
        "{text.__class__}",
        "{text[0]}",
        "{",
        "}",
        "{{text}}",
        "{unknown}",
        "",
        "no field",
        "{text}" * 50,
    ]
)
OPTIONS = sparse_dict(
    {},
    optional={
        "profile": st.sampled_from(["default", "nope", "", "DEFAULT"]),
        "is_query": st.booleans(),
        "instruction": SHORT_TEXT,
        "normalize": st.booleans(),
        "query_template": TEMPLATES,
        "doc_template": TEMPLATES,
        "output_types": OUTPUT_TYPES,
        "output_dtype": st.sampled_from(DTYPES),
        "max_active_dims": st.one_of(st.integers(-3, 40000), st.sampled_from(HUGE_INTS)),
        "activation": st.sampled_from(["none", "sigmoid", "softmax", ""]),
        "threshold": st.one_of(st.sampled_from([*ODD_FLOATS, 0, 1, 2, -1, True]), st.floats()),
        "max_length": st.sampled_from([0, 1, 8, 100000, -1]),
        "batch_size": st.sampled_from([0, 1, -1, 2**40]),
    },
)
ITEM = sparse_dict(
    {"text": SHORT_TEXT},
    optional={
        "id": st.one_of(st.sampled_from(["a", "", "x" * 200]), TEXT),
        "metadata": st.dictionaries(KEY, SCALAR, max_size=3),
        "images": st.lists(st.sampled_from(["data:image/png;base64,AAAA", "", "http://x"])),
    },
)
ITEMS = weighted(
    (14, st.lists(ITEM, min_size=1, max_size=3)),
    (4, st.lists(ITEM, min_size=0, max_size=12)),
    (1, st.just(Repeat([{"text": "x"}], 4097))),  # over max_items_per_request
    (1, st.just([{"text": Repeat("y", 1_000_001)}])),  # over max_text_chars
)
ENCODE_DOC = sparse_dict(
    {"items": ITEMS},
    optional={
        "params": sparse_dict(
            {},
            optional={
                "output_types": OUTPUT_TYPES,
                "output_dtype": st.sampled_from(DTYPES),
                "instruction": SHORT_TEXT,
                "is_query": st.booleans(),
                "options": OPTIONS,
            },
        )
    },
)
SCORE_DOC = sparse_dict(
    {"query": ITEM, "items": ITEMS},
    optional={
        "instruction": SHORT_TEXT,
        "options": OPTIONS,
        "top_k": st.one_of(st.integers(-2, 20), st.sampled_from(HUGE_INTS)),
    },
)
LABELS = st.lists(
    st.one_of(st.sampled_from(["GIVEN_NAME", "EMAIL", "CITY", "person", "", "given_name"]), TEXT),
    max_size=5,
)
EXTRACT_DOC = sparse_dict(
    {"items": ITEMS},
    optional={
        "params": sparse_dict(
            {},
            optional={
                "labels": LABELS,
                "output_schema": st.dictionaries(KEY, SCALAR, max_size=3),
                "instruction": SHORT_TEXT,
                "options": OPTIONS,
            },
        )
    },
)
BODY_MODELS = st.one_of(
    st.sampled_from([MINILM, MINILM, f"{MINILM}:default", SPLADE, RAMPART, LLM, "nope", ""]),
    st.text(max_size=20),
)
EMBEDDINGS_DOC = sparse_dict(
    {
        "model": BODY_MODELS,
        "input": st.one_of(SHORT_TEXT, st.lists(SHORT_TEXT, min_size=0, max_size=4)),
    },
    optional={
        "encoding_format": st.sampled_from(["float", "base64", "", "binary"]),
        "dimensions": st.one_of(st.sampled_from([384, 128, 1, 0, -1, 385]), st.integers()),
        "user": TEXT,
    },
)
GEN_MODELS = weighted(
    (6, st.just(LLM)),
    (3, st.sampled_from([f"{LLM}:default", f"{LLM}:nope", MINILM, SPLADE, "nope", ""])),
    (1, st.text(max_size=20)),
)
ROLES = weighted(
    (4, st.sampled_from(["system", "user", "assistant", "developer", "tool"])),
    (1, st.sampled_from(["function", "", "USER", "root"])),
)
CONTENT = weighted(
    (3, SHORT_TEXT),
    (
        1,
        st.lists(
            sparse_dict(
                {"type": st.sampled_from(["text", "text", "image_url", ""]), "text": SHORT_TEXT}
            ),
            max_size=3,
        ),
    ),
)
MESSAGES = weighted(
    (4, st.lists(sparse_dict({"role": ROLES, "content": CONTENT}), min_size=1, max_size=3)),
    (
        1,
        st.lists(
            sparse_dict({"role": ROLES, "content": CONTENT}, optional={"name": TEXT}),
            min_size=0,
            max_size=4,
        ),
    ),
)
SAMPLING = {
    "max_tokens": st.one_of(st.integers(-2, 64), st.sampled_from(HUGE_INTS)),
    "max_completion_tokens": st.integers(-2, 64),
    "temperature": st.one_of(st.sampled_from([0, 0.0, 1, 2, 2.5, -1]), st.floats()),
    "top_p": st.one_of(st.sampled_from([0, 1, 0.5, 1.5, -0.1]), st.floats()),
    "seed": st.one_of(st.integers(-10, 10), st.sampled_from(HUGE_INTS)),
    "stop": st.one_of(SHORT_TEXT, st.lists(SHORT_TEXT, max_size=6), st.just([""]), st.just("")),
    "n": st.sampled_from([1, 1, 1, 2, 0, -1]),
    "stream": st.booleans(),
    "stream_options": sparse_dict({}, optional={"include_usage": st.booleans()}),
    "logprobs": st.booleans(),
    "tools": st.just([{"type": "function", "function": {"name": "f"}}]),
    "response_format": st.just({"type": "json_object"}),
    "user": TEXT,
}
CHAT_DOC = sparse_dict({"model": GEN_MODELS, "messages": MESSAGES}, optional=dict(SAMPLING))
COMPLETION_DOC = sparse_dict(
    {"model": GEN_MODELS, "prompt": st.one_of(SHORT_TEXT, st.lists(SHORT_TEXT, max_size=3))},
    optional=dict(SAMPLING),
)
NATIVE_DOC = weighted(
    (2, sparse_dict({"prompt": SHORT_TEXT}, optional=dict(SAMPLING))),
    (2, sparse_dict({"messages": MESSAGES}, optional=dict(SAMPLING))),
    (
        1,
        sparse_dict(
            {},
            optional={"prompt": SHORT_TEXT, "messages": MESSAGES, "model": GEN_MODELS, **SAMPLING},
        ),
    ),
)
RESOLVE_DOC = sparse_dict(
    {"model": BODY_MODELS},
    optional={"bundle": st.one_of(st.sampled_from(["default", "nope", ""]), TEXT)},
)


# ------------------------------------------------------------------- inference routes


@given(data=st.data())
@fuzz_settings(400)
def test_fuzz_encode(open_stack: Stack, client: httpx.Client, data: st.DataObject) -> None:
    t = target(open_stack)
    model = data.draw(MODEL_PATHS)
    body, ctype = data.draw(encoded(ENCODE_DOC))
    headers = {**data.draw(hostile_headers()), **ctype}
    chunked = data.draw(CHUNKED)
    fire(
        client, t.gateway, "gateway", "POST", f"/v1/encode/{model}", headers, body, chunked=chunked
    )


@given(data=st.data())
@fuzz_settings(200)
def test_fuzz_score(open_stack: Stack, client: httpx.Client, data: st.DataObject) -> None:
    t = target(open_stack)
    model = data.draw(MODEL_PATHS)
    body, ctype = data.draw(encoded(SCORE_DOC))
    headers = {**data.draw(hostile_headers()), **ctype}
    fire(client, t.gateway, "gateway", "POST", f"/v1/score/{model}", headers, body)


@given(data=st.data())
@fuzz_settings(250)
def test_fuzz_extract(open_stack: Stack, client: httpx.Client, data: st.DataObject) -> None:
    t = target(open_stack)
    model = data.draw(
        st.one_of(st.sampled_from([RAMPART, RAMPART, RAMPART, f"{RAMPART}:default"]), MODEL_PATHS)
    )
    body, ctype = data.draw(encoded(EXTRACT_DOC))
    headers = {**data.draw(hostile_headers()), **ctype}
    fire(client, t.gateway, "gateway", "POST", f"/v1/extract/{model}", headers, body)


@given(data=st.data())
@fuzz_settings(250)
def test_fuzz_embeddings(open_stack: Stack, client: httpx.Client, data: st.DataObject) -> None:
    t = target(open_stack)
    body, ctype = data.draw(encoded(EMBEDDINGS_DOC))
    headers = {**data.draw(hostile_headers()), **ctype}
    fire(client, t.gateway, "gateway", "POST", "/v1/embeddings", headers, body)


@given(data=st.data())
@fuzz_settings(350)
def test_fuzz_generation(open_stack: Stack, client: httpx.Client, data: st.DataObject) -> None:
    """Chat, completions and native generate; JSON mostly (the routes read JSON only)."""
    t = target(open_stack)
    route = data.draw(st.sampled_from(["chat", "completions", "native"]))
    if route == "chat":
        path, doc = "/v1/chat/completions", CHAT_DOC
    elif route == "completions":
        path, doc = "/v1/completions", COMPLETION_DOC
    else:
        path, doc = (
            f"/v1/generate/{data.draw(GEN_MODELS.map(lambda s: quote(s, safe='/:')))}",
            NATIVE_DOC,
        )
    body, ctype = data.draw(encoded(doc, allow_msgpack=data.draw(st.floats(0, 1)) < 0.1))
    headers = {**data.draw(hostile_headers()), **ctype}
    fire(client, t.gateway, "gateway", "POST", path, headers, body, chunked=data.draw(CHUNKED))


# ------------------------------------------------------------------- drop-in routes

#: a drop-in body's ``model`` (absent: the gateway's default, ``DEFAULT_MODELS``)
DROPIN_MODELS = weighted(
    (4, st.just(MINILM)),
    (
        2,
        st.sampled_from(
            [SPLADE, RAMPART, LLM, f"{MINILM}:default", f"{MINILM}:nope", "nope/none", ""]
        ),
    ),
    (1, st.one_of(st.text(max_size=20), st.sampled_from(SURROGATES), st.none())),
)


def _with_model(doc: Any, model: Any) -> Any:
    return {"model": model, **doc} if isinstance(doc, dict) and model is not None else doc


def body_model(doc: st.SearchStrategy[Any], usual: str | None = None) -> st.SearchStrategy[Any]:
    """``doc`` with a ``model`` key: ``usual`` mostly (None: no key, the gateway's
    default), one of ``DROPIN_MODELS`` now and then."""
    models = weighted((6, st.just(usual)), (3, DROPIN_MODELS), (1, st.none()))
    return st.builds(_with_model, doc, models)


#: a document object comes back whole with ``return_documents``: values JSON cannot
#: carry (msgpack bytes and timestamps, JSON's escaped lone surrogates) included
DOCUMENT = weighted(
    (4, SHORT_TEXT),
    (
        1,
        sparse_dict(
            {"text": SHORT_TEXT},
            optional={
                "title": TEXT,
                "id": SCALAR,
                "meta": st.dictionaries(KEY, SCALAR, max_size=2),
            },
        ),
    ),
    (
        1,
        sparse_dict(
            {"text": SHORT_TEXT},
            optional={
                "raw": st.one_of(MSGPACK_ONLY, st.sampled_from(SURROGATES)),
                "\udc00": st.just(1),
            },
            max_optional=2,
        ),
    ),
)
RERANK_DOC = body_model(
    sparse_dict(
        {
            "query": weighted((12, SHORT_TEXT), (1, st.just(Repeat("y", 1_000_001)))),
            "documents": weighted(
                (12, st.lists(DOCUMENT, min_size=1, max_size=4)),
                (1, st.just([])),
                (1, st.just(Repeat(["x"], 4097))),  # over max_items_per_request
            ),
            "return_documents": st.sampled_from([True, True, False, None]),
        },
        optional={
            "top_n": st.one_of(st.integers(-2, 6), st.sampled_from(HUGE_INTS)),
            "rank_fields": st.sampled_from([["text"], ["title"], [], ["text", "title"], "text"]),
            "max_chunks_per_doc": st.sampled_from([1, 2, 0, -1, 2**64]),
            "max_tokens_per_doc": st.sampled_from([256, 512, 4096, 1, 0, -1]),
            "priority": st.one_of(st.integers(-5, 5), st.sampled_from(HUGE_INTS)),
        },
    )
)
TEI_INPUTS = weighted(
    (3, SHORT_TEXT),
    (4, st.lists(SHORT_TEXT, min_size=1, max_size=4)),
    (1, st.sampled_from([[], [[101, 102]], [101, 102], ["a", 7], Repeat(["x"], 4097)])),
    (1, st.just(Repeat("y", 1_000_001))),  # over max_text_chars
)
TEI_OPTIONS = {
    "truncate": st.one_of(st.booleans(), st.none()),
    "truncation_direction": st.sampled_from(["Right", "Left", "left", "right", "", "UP", None]),
    "prompt_name": st.sampled_from(["query", "document", "passage", "Query", "", "nope", None]),
}
TEI_EMBED_OPTIONS = {
    **TEI_OPTIONS,
    "normalize": st.booleans(),
    "dimensions": st.one_of(st.sampled_from([384, 128, 1, 0, -1, 385]), st.integers()),
}
#: the Inference API's wrapper: options inside ``parameters`` (given twice: 400)
PARAMETERS = {
    "parameters": sparse_dict(
        {}, optional={"model": DROPIN_MODELS, **TEI_EMBED_OPTIONS}, max_optional=2
    )
}
TEI_EMBED_DOC = body_model(
    sparse_dict({"inputs": TEI_INPUTS}, optional={**TEI_EMBED_OPTIONS, **PARAMETERS})
)
TEI_SPARSE_DOC = body_model(
    sparse_dict({"inputs": TEI_INPUTS}, optional={**TEI_OPTIONS, **PARAMETERS})
)
TEI_RERANK_DOC = body_model(
    sparse_dict(
        {
            "query": SHORT_TEXT,
            "texts": weighted((8, st.lists(SHORT_TEXT, min_size=1, max_size=4)), (1, st.just([]))),
        },
        optional={
            **TEI_OPTIONS,
            "raw_scores": st.booleans(),
            "return_text": st.booleans(),
            **PARAMETERS,
        },
    )
)
TEI_DOCS = {"/embed": TEI_EMBED_DOC, "/embed_sparse": TEI_SPARSE_DOC, "/rerank": TEI_RERANK_DOC}

BODY_MODEL_DOCS = {
    "/v1/encode": body_model(ENCODE_DOC, MINILM),
    "/v1/score": body_model(SCORE_DOC, MINILM),
    "/v1/extract": body_model(EXTRACT_DOC, RAMPART),
}


def _ranked(scores: list[float], where: str) -> None:
    """Best first (docs/api.md §3)."""
    assert all(math.isfinite(x) for x in scores), where
    assert scores == sorted(scores, reverse=True), where


def check_dropin_reply(resp: httpx.Response, path: str) -> None:
    """The shape of a drop-in route's 200 (docs/api.md §15), whatever was asked."""
    if resp.status_code != 200:
        return
    where = _where(resp, None)
    got = resp.json()
    if path in COHERE_PATHS:
        indices = [r["index"] for r in got["results"]]
        assert len(set(indices)) == len(indices), where
        _ranked([r["relevance_score"] for r in got["results"]], where)
    elif path == "/rerank":
        assert len({r["index"] for r in got}) == len(got) >= 1, where
        _ranked([r["score"] for r in got], where)
    elif path == "/embed":
        assert got and all(v and all(math.isfinite(x) for x in v) for v in got), where
    elif path == "/embed_sparse":
        for weights in got:
            index = [w["index"] for w in weights]
            assert index == sorted(set(index)), where


@given(data=st.data())
@fuzz_settings(120)
def test_fuzz_dropin_rerank(open_stack: Stack, client: httpx.Client, data: st.DataObject) -> None:
    """Cohere / Jina ``/v1/rerank`` and Cohere v2 ``/v2/rerank``."""
    t = target(open_stack)
    path = data.draw(st.sampled_from(sorted(COHERE_PATHS)))
    body, ctype = data.draw(encoded(RERANK_DOC))
    headers = {**data.draw(hostile_headers()), **ctype}
    resp = fire(client, t.gateway, "gateway", "POST", path, headers, body)
    check_dropin_reply(resp, path)


@given(data=st.data())
@fuzz_settings(200)
def test_fuzz_dropin_tei(open_stack: Stack, client: httpx.Client, data: st.DataObject) -> None:
    """TEI's ``/embed``, ``/embed_sparse`` and ``/rerank``."""
    t = target(open_stack)
    path = data.draw(st.sampled_from(sorted(TEI_DOCS)))
    body, ctype = data.draw(encoded(TEI_DOCS[path]))
    headers = {**data.draw(hostile_headers()), **ctype}
    chunked = data.draw(CHUNKED)
    resp = fire(client, t.gateway, "gateway", "POST", path, headers, body, chunked=chunked)
    check_dropin_reply(resp, path)


@given(data=st.data())
@fuzz_settings(120)
def test_fuzz_dropin_body_model(
    open_stack: Stack, client: httpx.Client, data: st.DataObject
) -> None:
    """``/v1/encode``, ``/v1/score`` and ``/v1/extract`` with the model in the body."""
    t = target(open_stack)
    path = data.draw(st.sampled_from(sorted(BODY_MODEL_DOCS)))
    body, ctype = data.draw(encoded(BODY_MODEL_DOCS[path]))
    headers = {**data.draw(hostile_headers()), **ctype}
    fire(client, t.gateway, "gateway", "POST", path, headers, body, chunked=data.draw(CHUNKED))


# ------------------------------------------------------------ read and config routes

GATEWAY_READS = [
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{m}"),
    ("GET", "/v1/configs/models"),
    ("GET", "/v1/configs/models/{m}"),
    ("GET", "/v1/configs/models/{m}/status"),
    ("GET", "/v1/configs/bundles"),
    ("GET", "/v1/configs/bundles/{b}"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/health"),
    ("GET", "/metrics"),
    # served elsewhere, or not at all, on the gateway
    ("GET", "/v1/configs/export"),
    ("GET", "/v1/configs/epoch"),
    ("POST", "/v1/configs/models"),
    ("GET", "/"),
    ("GET", "/v1/nope"),
    ("GET", "/v1/encode/{m}"),
    ("GET", "/v1/chat/completions"),
    ("PUT", "/v1/embeddings"),
    ("DELETE", "/v1/models/{m}"),
    ("PATCH", "/v1/generate/{m}"),
    ("OPTIONS", "/v1/score/{m}"),
    ("HEAD", "/v1/models"),
    ("HEAD", "/healthz"),
    ("POST", "/healthz"),
    ("GET", "/v1/pools"),
    ("POST", "/v1/pools"),
    ("DELETE", "/v1/admin/anything"),
    ("GET", "/v1/cluster/status"),
    ("POST", "/v1/cluster/status"),
    ("GET", "/ws/cluster-status"),  # no websocket upgrade: 404
    ("GET", "/?token=x"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/docs?token=x"),
    ("POST", "/openapi.json"),
    # drop-in reads (docs/api.md §15), and methods the drop-in routes refuse
    ("GET", "/version"),
    ("GET", "/info"),
    ("GET", "/info?model={m}"),
    ("POST", "/version"),
    ("GET", "/embed"),
    ("PUT", "/v1/rerank"),
    ("GET", "/v1/encode"),
]
CONFIG_READS = [
    ("GET", "/v1/configs/models"),
    ("GET", "/v1/configs/models/{m}"),
    ("GET", "/v1/configs/bundles"),
    ("GET", "/v1/configs/bundles/{b}"),
    ("GET", "/v1/configs/export"),
    ("GET", "/v1/configs/epoch"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/"),
    ("GET", "/v1/encode/{m}"),
    ("PUT", "/v1/configs/models"),
    ("DELETE", "/v1/configs/models/{m}"),
    ("HEAD", "/v1/configs/epoch"),
    ("OPTIONS", "/v1/configs/resolve"),
    ("GET", "/v1/configs/resolve"),
    ("GET", "/openapi.json"),
    ("GET", "/docs?token=x"),
]
BUNDLE_NAMES = st.one_of(
    st.sampled_from(["default", "DEFAULT", "nope", "", "%ff", "a" * 500]),
    st.text(max_size=12).map(lambda s: quote(s, safe="")),
)
QUERY = st.one_of(
    st.just(""),
    st.sampled_from(["?", "?x=1", "?model=a&model=b", "?%ff=%00", "?" + "a=b&" * 200]),
)


def _fill(path: str, model: str, bundle: str) -> str:
    return path.replace("{m}", model).replace("{b}", bundle)


@st.composite
def read_case(draw: st.DrawFn, routes: list[tuple[str, str]]) -> tuple[str, str, bytes | None]:
    method, path = draw(st.sampled_from(routes))
    path = _fill(path, draw(MODEL_PATHS), draw(BUNDLE_NAMES)) + draw(QUERY)
    body = draw(st.one_of(st.none(), st.none(), st.binary(max_size=64), st.just(b"{}")))
    return method, path, body


@given(data=st.data())
@fuzz_settings(200)
def test_fuzz_gateway_reads(open_stack: Stack, client: httpx.Client, data: st.DataObject) -> None:
    t = target(open_stack)
    method, path, body = data.draw(read_case(GATEWAY_READS))
    headers = data.draw(hostile_headers())
    fire(client, t.gateway, "gateway", method, path, headers, body)


@given(data=st.data())
@fuzz_settings(150)
def test_fuzz_resolve(open_stack: Stack, client: httpx.Client, data: st.DataObject) -> None:
    """``POST /v1/configs/resolve`` on both apps."""
    t = target(open_stack)
    app = data.draw(st.sampled_from(["gateway", "config"]))
    body, ctype = data.draw(encoded(RESOLVE_DOC))
    headers = {**data.draw(hostile_headers()), **ctype}
    base = t.gateway if app == "gateway" else t.config
    fire(client, base, app, "POST", "/v1/configs/resolve", headers, body)


POOL_NAMES = st.one_of(
    st.sampled_from(["fuzz-pool", "FUZZ-POOL", "default", "nope", "a.b", "", "x" * 70, "%ff"]),
    st.text(max_size=12).map(lambda s: quote(s, safe="")),
)
PROFILE_COUNTS = st.dictionaries(
    st.one_of(st.sampled_from(["default", "l4", "L4", "a b", ""]), TEXT),
    st.one_of(st.integers(-5, 20_000), st.booleans(), TEXT),
    max_size=3,
)
POOL_DOC = sparse_dict(
    {"name": st.one_of(st.sampled_from(["fuzz-pool", "Fuzz-Pool", "default"]), TEXT)},
    optional={
        "gpus": weighted((3, st.just({"default": 1})), (1, PROFILE_COUNTS)),
        "gpu_caps": PROFILE_COUNTS,
        "bundle": st.one_of(st.sampled_from(["default", "nope"]), TEXT),
        "ttl_seconds": st.one_of(st.integers(-10, 10**9), st.floats(), TEXT),
        "queue_pool": st.one_of(st.sampled_from(["default", "nope"]), TEXT),
        "minimum_worker_count": st.integers(-5, 20_000),
        "pinned_models": st.lists(st.one_of(BODY_MODELS, TEXT), max_size=3),
    },
    max_optional=4,
)


@given(data=st.data())
@fuzz_settings(150)
def test_fuzz_pools(open_stack: Stack, client: httpx.Client, data: st.DataObject) -> None:
    """The pool API (docs/pools.md): create with mutated specs, read, renew, delete."""
    t = target(open_stack)
    headers = data.draw(hostile_headers())
    if data.draw(st.booleans()):
        body, ctype = data.draw(encoded(POOL_DOC))
        fire(client, t.gateway, "gateway", "POST", "/v1/pools", {**headers, **ctype}, body)
        return
    name = data.draw(POOL_NAMES)
    method, path = data.draw(
        st.sampled_from(
            [
                ("GET", f"/v1/pools/{name}"),
                ("DELETE", f"/v1/pools/{name}"),
                ("POST", f"/v1/pools/{name}/renew"),
                ("GET", "/v1/pools"),
            ]
        )
    )
    fire(client, t.gateway, "gateway", method, path, headers, None)


# ---------------------------------------------------------------- the status stream

WS_KEY = b"dGhlIHNhbXBsZSBub25jZQ=="
WS_HANDSHAKE = {
    "Upgrade": b"websocket",
    "Connection": b"Upgrade",
    "Sec-WebSocket-Key": WS_KEY,
    "Sec-WebSocket-Version": b"13",
}
WS_QUERIES = st.one_of(
    st.sampled_from(
        [
            "",
            f"?token={USER}",
            f"?token={ADMIN}",
            "?token=wrong",
            "?token=",
            f"?token=x&token={USER}",
            f"?token=%20{USER}%20",
            "?token=%ff%00",
            "?" + "a=b&" * 100 + f"token={USER}",
        ]
    ),
    QUERY,
)


def _masked(opcode: int, payload: bytes) -> bytes:
    """A client frame (masked with a zero key: the bytes as they are)."""
    n = len(payload)
    length = bytes([0x80 | n]) if n < 126 else b"\xfe" + n.to_bytes(2, "big")
    return bytes([0x80 | opcode]) + length + b"\x00" * 4 + payload


WS_FRAMES = st.one_of(
    st.sampled_from(
        [
            b"",
            _masked(0x1, b"hello"),
            _masked(0x2, b"\x00" * 300),
            _masked(0x9, b"ping"),
            _masked(0x8, b"\x03\xe8bye"),
            _masked(0x1, b"\xff\xfe"),  # text that is not UTF-8
            b"\x81\x05hello",  # not masked
            b"\x81\xff" + b"\x7f" * 8,  # claims 2**63 bytes
            b"\x0f\x80\x00\x00\x00\x00",  # reserved opcode
        ]
    ),
    st.binary(min_size=1, max_size=64),
)


def _read_frame(sock: socket.socket, buf: bytes) -> tuple[int, bytes]:
    """The first server frame (unmasked) at ``buf`` + what the socket sends."""
    while len(buf) < 2 or len(buf) < _frame_end(buf):
        chunk = sock.recv(65536)
        assert chunk, f"closed mid-frame after {buf[:40]!r}"
        buf += chunk
    return buf[0] & 0x0F, buf[_frame_end(buf) - _frame_len(buf) : _frame_end(buf)]


def _frame_len(buf: bytes) -> int:
    n = buf[1] & 0x7F
    if n == 126:
        return int.from_bytes(buf[2:4], "big") if len(buf) >= 4 else 1 << 30
    if n == 127:
        return int.from_bytes(buf[2:10], "big") if len(buf) >= 10 else 1 << 30
    return n


def _frame_end(buf: bytes) -> int:
    n = buf[1] & 0x7F
    return 2 + (2 if n == 126 else 8 if n == 127 else 0) + _frame_len(buf)


def _ws_token(headers: dict[str, bytes], query: str) -> str | None:
    """The token the gateway reads: ``Authorization: Bearer``, else ``?token=``."""
    token = _bearer(headers.get("Authorization"))
    if token is None:
        try:
            got = parse_qs(query.removeprefix("?"), max_num_fields=64).get("token")
        except ValueError:
            got = None
        token = got[0].strip() or None if got else None
    return token


@given(data=st.data())
@fuzz_settings(120)
def test_fuzz_status_stream(open_stack: Stack, secured_stack: Stack, data: st.DataObject) -> None:
    """``/ws/cluster-status``: handshakes with a header missing or odd, tokens in the
    header or the query, then hostile frames. Every handshake is answered below 500;
    an open stream starts with the state document; with auth on, a stream opens with a
    valid token only, and a refusal is the 401 envelope."""
    secured = data.draw(st.booleans())
    base = target(secured_stack if secured else open_stack).gateway
    query = data.draw(WS_QUERIES)
    headers = {**WS_HANDSHAKE, **data.draw(hostile_headers(auth=secured))}
    valid = True
    if data.draw(st.floats(0, 1)) < 0.3:
        valid = False
        name = data.draw(st.sampled_from(list(WS_HANDSHAKE)))
        if data.draw(st.booleans()):
            del headers[name]
        else:
            headers[name] = data.draw(_hv(["", "13, 8", "99", "websocket2", "close", "x" * 300]))
    token = _ws_token(headers, query)
    allowed = not secured or token in (USER, ADMIN)
    url = urlsplit(base)
    head = f"GET /ws/cluster-status{query} HTTP/1.1\r\nHost: {url.netloc}\r\n".encode()
    head += b"".join(k.encode() + b": " + v.strip(b" \t") + b"\r\n" for k, v in headers.items())
    where = f"{'secured' if secured else 'open'} {head[:600]!r}"
    HIT.add(("gateway", "WS", "/ws/cluster-status"))
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(head + b"\r\n")
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, f"no answer to the handshake: {where}"
            buf += chunk
        status_line, _, rest = buf.partition(b"\r\n")
        status = int(status_line.split()[1])
        raw_headers, _, body = rest.partition(b"\r\n\r\n")
        code = re.search(rb"(?im)^x-sie-error-code: *(\S+)", raw_headers)
        length = re.search(rb"(?im)^content-length: *(\d+)", raw_headers)
        while status != 101 and length is not None and len(body) < int(length.group(1)):
            chunk = sock.recv(65536)
            assert chunk, f"the answer stopped short: {where} -> {buf[:300]!r}"
            body += chunk
        STATS[(_caller(), status)] = STATS.get((_caller(), status), 0) + 1
        assert status < 500, f"{status}: {where} -> {buf[:300]!r}"
        if status == 101:
            assert allowed, f"a stream opened without a valid token: {where}"
            opcode, payload = _read_frame(sock, body)
            assert opcode == 0x1, f"first frame {opcode}: {where}"
            assert {"workers", "pools", "lanes"} <= set(json.loads(payload)), where
            frame = data.draw(WS_FRAMES)
            if frame:
                sock.sendall(frame)
                sock.settimeout(0.5)
                try:
                    sock.recv(65536)
                except TimeoutError:
                    pass
            return
        if code is not None:  # the app answered, with its envelope
            assert code.group(1) in body, where
            if code.group(1) == b"UNAUTHORIZED":
                assert status == 401 and not allowed, f"{status}: {where}"
            else:  # not an upgrade after all: a plain GET of a websocket route
                assert code.group(1) == b"NOT_FOUND" and not valid, f"{status}: {where}"
        else:  # the HTTP server refused a malformed handshake (a bare 4xx)
            assert not valid or status == 400, f"{status}: {where} -> {buf[:300]!r}"


ADAPTERS = [
    "sie.engines.encoders.sentence_transformers:DenseEncoder",
    "sie.engines.encoders.sentence_transformers:SparseEncoder",
    "sie.engines.generators.openai_upstream:OpenAIUpstreamGenerator",
    "sie.engines.nope:Nope",
    "os:system",
    "",
]
CONFIG_ID = st.one_of(
    st.sampled_from(
        [
            "fuzz/m1",
            "fuzz/m2",
            "fuzz/m3",
            MINILM,
            "status",
            "a/status",
            "../x",
            "a//b",
            "a__b",
            "x" * 200,
            "",
            "-a",
            "fuzz\\m",
        ]
    ),
    st.text(max_size=16),
)
RANDOM_CONFIG_DOC = sparse_dict(
    {
        "sie_id": CONFIG_ID,
        "profiles": st.dictionaries(
            st.one_of(
                st.sampled_from(["default", "fast", "", "x" * 70, "a b"]), st.text(max_size=6)
            ),
            sparse_dict(
                {"adapter_path": st.sampled_from(ADAPTERS)},
                optional={
                    "max_batch_tokens": st.one_of(
                        st.sampled_from([1, 1024, 0, -1, 2**64]), st.integers()
                    ),
                    "extends": st.sampled_from(["default", "fast", "nope"]),
                    "compute_precision": st.sampled_from(["float16", None, "int3"]),
                    "adapter_options": sparse_dict(
                        {},
                        optional={
                            "loadtime": st.dictionaries(KEY, SCALAR, max_size=3),
                            "runtime": st.dictionaries(KEY, SCALAR, max_size=3),
                        },
                    ),
                },
            ),
            max_size=2,
        ),
    },
    optional={
        "hf_id": st.sampled_from([MINILM, "nope/nope", "", None]),
        "tasks": st.sampled_from(
            [
                {"encode": {"dense": {"dim": 8}}},
                {"encode": {"dense": {"dim": 0}}},
                {"score": {}},
                {"generate": {}},
                {"nope": {}},
                {},
            ]
        ),
        "inputs": st.just({"text": True}),
        "max_sequence_length": st.one_of(st.sampled_from([0, -1, 512, 2**70]), st.integers()),
        "pool": st.sampled_from(POOLS),
        "weights_path": st.sampled_from(["/etc/passwd", "../../", "", "s3://x/y"]),
    },
)
#: a write that can succeed (a new model id, MiniLM's weights), then mutated
VALID_CONFIG_DOC = st.builds(
    lambda n, dim, mbt: {
        "sie_id": f"fuzz/m{n}",
        "hf_id": MINILM,
        "tasks": {"encode": {"dense": {"dim": dim}}},
        "profiles": {
            "default": {
                "adapter_path": "sie.engines.encoders.sentence_transformers:DenseEncoder",
                "max_batch_tokens": mbt,
            }
        },
    },
    st.integers(0, 30),
    st.sampled_from([384, 8]),
    st.sampled_from([1024, 4096]),
)
CONFIG_DOC = weighted((1, VALID_CONFIG_DOC), (1, RANDOM_CONFIG_DOC))
LAUGHS = (
    "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9))
).encode()
RAW_YAML = [
    b"",
    b"---",
    b"--- \n...\n--- \n",
    b"a: 1\na: 2\n",  # duplicate key
    b"sie_id: fuzz/dup\nsie_id: fuzz/dup2\n",
    b"- a\n- b\n",
    b"just a string",
    b"null",
    b"\t\tsie_id: x",
    b"sie_id: !!python/object/apply:os.system ['true']\n",
    b"sie_id: !!binary aGVsbG8=\n",
    b"sie_id: 2001-12-14t21:59:43.10-05:00\n",
    b"sie_id: .nan\n",
    b"? [a, b]\n: c\n",
    b"{sie_id: fuzz/flow, profiles: {default: {adapter_path: x:y}}}",
    b"a: &a [*a]\n",
    b"a: &a\n  b: *a\n",
    LAUGHS,  # billion laughs: 9**9 values if aliases were expanded
    b"<<: {sie_id: fuzz/merge}\n",
    b"\xff\xfe\x00s\x00i\x00e",
    b"\xef\xbb\xbfsie_id: fuzz/bom\n",
    b"sie_id: fuzz/m1\n" + b"  " * 5000 + b"x",
    b"[" * 150 + b"]" * 150,
    b"a:\n" + b"".join(b"  " * i + b"b:\n" for i in range(1, 150)),
    b"%YAML 9.9\n---\na: 1\n",
    b"%TAG ! tag:evil.com,2000:\n---\n!foo a\n",
    b'sie_id: "\\ud800"\n',
]


@st.composite
def config_write(draw: st.DrawFn) -> tuple[bytes, dict[str, bytes]]:
    headers: dict[str, bytes] = {}
    if draw(st.booleans()):
        headers["Content-Type"] = draw(
            st.sampled_from(
                [b"application/yaml", b"application/json", b"text/plain; charset=latin-1", b""]
            )
        )
    kind = draw(st.sampled_from(["yaml", "yaml", "yaml", "raw", "json", "bytes"]))
    if kind == "raw":
        return Blob(draw(st.sampled_from(RAW_YAML))), headers
    if kind == "bytes":
        return draw(st.binary(max_size=200)), headers
    doc = draw(mutated(CONFIG_DOC, msgpack_ok=False))
    doc = _plain(doc, False)
    if kind == "json":
        return json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass"), headers
    try:
        text = dump_yaml(doc)
    except Exception:  # e.g. a lone surrogate: send it as JSON (YAML is a superset)
        return json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass"), headers
    return text.encode("utf-8", "surrogatepass"), headers


@given(data=st.data())
@fuzz_settings(250)
def test_fuzz_config_app(open_stack: Stack, client: httpx.Client, data: st.DataObject) -> None:
    """Every route of the config app: YAML writes (with idempotency keys), reads."""
    t = target(open_stack)
    if data.draw(st.floats(0, 1)) < 0.55:
        body, ctype = data.draw(config_write())
        headers = {**data.draw(hostile_headers()), **ctype}
        if data.draw(st.booleans()):
            headers["Idempotency-Key"] = data.draw(
                st.sampled_from([b"key-1", b"key-2", b"", b"k" * 300])
            )
        fire(client, t.config, "config", "POST", "/v1/configs/models", headers, body)
        return
    method, path, body_ = data.draw(read_case(CONFIG_READS))
    headers = data.draw(hostile_headers())
    fire(client, t.config, "config", method, path, headers, body_)


# ------------------------------------------------------------------------- raw bytes

POST_ROUTES = [
    ("gateway", "/v1/encode/" + MINILM),
    ("gateway", "/v1/score/" + MINILM),
    ("gateway", "/v1/extract/" + RAMPART),
    ("gateway", "/v1/embeddings"),
    ("gateway", "/v1/chat/completions"),
    ("gateway", "/v1/completions"),
    ("gateway", "/v1/generate/" + LLM),
    ("gateway", "/v1/configs/resolve"),
    ("gateway", "/v1/rerank"),
    ("gateway", "/v2/rerank"),
    ("gateway", "/embed"),
    ("gateway", "/embed_sparse"),
    ("gateway", "/rerank"),
    ("gateway", "/v1/encode"),
    ("gateway", "/v1/score"),
    ("gateway", "/v1/extract"),
    ("config", "/v1/configs/resolve"),
    ("config", "/v1/configs/models"),
]
RAW_BODIES = [
    b"",
    b"null",
    b"[]",
    b"{}",
    b'"str"',
    b"0",
    b"-0",
    b"1e999",
    b"-1e999",
    b"NaN",
    b"Infinity",
    b'{"items": NaN}',
    b'{"items": [{"text": "a"}], "params": {"options": {"max_active_dims": 1e999}}}',
    b'{"model": "'
    + LLM.encode()
    + b'", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
    b'{"model": "' + LLM.encode() + b'", "prompt": "hi", "max_tokens": 1e400}',
    b'{"model": "' + LLM.encode() + b'", "prompt": "hi", "model": 1}',
    b'{"model": "' + LLM.encode() + b'", "prompt": "hi", "stream": "true"}',
    b'{"model": "' + LLM.encode() + b'", "prompt": "\\ud800"}',
    b'{"model": "\\ud800", "prompt": "x"}',
    b'{"model": "' + MINILM.encode() + b'", "input": "\\udc00"}',
    b'{"items": [{"text": "\\udc00"}]}',
    b'{"items": [{"text": "a"}], "items": 5}',
    b'{"items": [{"text": "a"}]} trailing',
    b'{"items": [{"text": "a"}]',
    b"\xef\xbb\xbf{}",
    b"\xff\xfe{\x00}\x00",
    b"\x00\x00\x00{",
    b"\x80\x81\x82",
    b"{" + b'"a":{' * 199 + b"}" * 200,
    b"[" * 200 + b"]" * 200,
    b"[" * 5000,
    b"\x81",  # msgpack: truncated map
    b"\xdd\xff\xff\xff\xff",  # msgpack: array32 of 4G items, no data
    b"\xdf\xff\xff\xff\xff",  # msgpack: map32 of 4G pairs
    b"\xc6\xff\xff\xff\xff",  # msgpack: bin32 of 4 GB
    b"\xc1",  # msgpack: never used
    b"\xd4\x01\x00",  # msgpack: ext
    b"\x81\xa5items\xd4\xff\x00",  # msgpack: {"items": ext(-1)}
    b"\x81\xa5items\x91\x81\xa4text\xa3\xed\xa0\x80",  # msgpack str with a surrogate (CESU)
    b"\x82\xa5items\x91\x81\xa4text\xa1a\xa5items\x90",  # msgpack: duplicate key
]
RAW_CONTENT_TYPES = [
    None,
    "application/json",
    "application/msgpack",
    "application/yaml",
    "text/plain",
]


@given(data=st.data())
@fuzz_settings(400)
def test_fuzz_raw_bytes(open_stack: Stack, client: httpx.Client, data: st.DataObject) -> None:
    """Random bytes and hand-made malformed bodies on every POST route."""
    t = target(open_stack)
    app, path = data.draw(st.sampled_from(POST_ROUTES))
    body = Blob(data.draw(st.one_of(st.sampled_from(RAW_BODIES), st.binary(max_size=2048))))
    ctype = data.draw(st.sampled_from(RAW_CONTENT_TYPES + JSON_CONTENT_TYPES[:6]))
    headers = data.draw(hostile_headers())
    if ctype is not None:
        headers["Content-Type"] = ctype.encode()
    base = t.gateway if app == "gateway" else t.config
    fire(client, base, app, "POST", path, headers, body, chunked=data.draw(CHUNKED))


# ------------------------------------------------------------------------------ auth

ALL_CASES = (
    [("gateway", m, p) for m, p in GATEWAY_READS]
    + [("config", m, p) for m, p in CONFIG_READS]
    + [("gateway", "POST", p) for a, p in POST_ROUTES if a == "gateway"]
    + [("config", "POST", p) for a, p in POST_ROUTES if a == "config"]
)
AUTH_BODIES = {
    "/v1/encode/": ENCODE_DOC,
    "/v1/score/": SCORE_DOC,
    "/v1/extract/": EXTRACT_DOC,
    "/v1/embeddings": EMBEDDINGS_DOC,
    "/v1/chat/completions": CHAT_DOC,
    "/v1/completions": COMPLETION_DOC,
    "/v1/generate/": NATIVE_DOC,
    "/v1/configs/resolve": RESOLVE_DOC,
    **BODY_MODEL_DOCS,  # after "/v1/encode/" & co: the first prefix that matches wins
    "/v1/rerank": RERANK_DOC,
    "/v2/rerank": RERANK_DOC,
    "/embed_sparse": TEI_SPARSE_DOC,  # before its prefix "/embed"
    **TEI_DOCS,
}


@given(data=st.data())
@fuzz_settings(400)
def test_fuzz_auth(secured_stack: Stack, client: httpx.Client, data: st.DataObject) -> None:
    """Every route of both apps under ``SIE_AUTH_MODE=token`` with Authorization variants."""
    t = target(secured_stack)
    app, method, path = data.draw(st.sampled_from(ALL_CASES))
    path = _fill(path, data.draw(st.sampled_from([MINILM, LLM, "nope"])), "default")
    headers = data.draw(hostile_headers(auth=True))
    if "Authorization" in headers and data.draw(st.booleans()):  # more valid tokens
        headers["Authorization"] = data.draw(st.sampled_from(VALID_AUTHS)).encode()
    body: bytes | None = None
    if method == "POST" and path == "/v1/configs/models":
        body, ctype = data.draw(config_write())
        headers.update(ctype)
    elif method == "POST":
        doc = next((d for prefix, d in AUTH_BODIES.items() if path.startswith(prefix)), None)
        if doc is not None:
            body, ctype = data.draw(encoded(doc, allow_msgpack="generate" not in path))
            headers.update(ctype)
    base = t.gateway if app == "gateway" else t.config
    resp = fire(client, base, app, method, path, headers, body)
    token = _bearer(headers.get("Authorization"))
    bare, _, query = path.partition("?")
    if bare in BROWSER_PATHS:  # a page a browser opens: ?token= when the header has none
        token = _ws_token(headers, query)
    where = _where(resp, body)
    if path in ("/healthz", "/readyz"):
        assert resp.status_code not in (401, 403), where  # probes are always open
    elif token is None:
        assert resp.status_code == 401, where
        assert resp.headers.get("www-authenticate") == "Bearer", where
    elif token == ADMIN or (token == USER and not _admin_route(app, method, path)):
        assert resp.status_code not in (401, 403), where
    elif token not in (USER, ADMIN):
        assert resp.status_code in (401, 403), where


VALID_AUTHS = [f"Bearer {USER}", f"Bearer {ADMIN}", f"bearer {USER}", f"BEARER   {ADMIN}"]


def _bearer(value: bytes | None) -> str | None:
    """The token of ``Authorization: Bearer <token>`` as the server reads it."""
    if not value:
        return None
    scheme, _, token = value.decode("latin-1").strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _admin_route(app: str, method: str, path: str) -> bool:
    """Routes the inference token does not open (architecture §3 step 1, §13)."""
    if app == "config":
        return (method == "POST" and path == "/v1/configs/models") or path == "/v1/configs/export"
    if method not in ("POST", "PUT", "PATCH", "DELETE"):
        return False
    if path.startswith("/v1/configs/"):
        return path != "/v1/configs/resolve"
    return path.startswith(("/v1/admin/", "/v1/pools"))


# ------------------------------------------------------------------------ afterwards


def test_still_healthy_and_exact(open_stack: Stack, client: httpx.Client, st_model: Any) -> None:
    """After the fuzz run: liveness at once, and MiniLM encodes exactly as
    sentence-transformers does (1e-5)."""
    started = time.monotonic()
    r = send(client, "GET", open_stack.base_url + "/healthz")
    assert r.status_code == 200 and r.text == "ok"
    assert time.monotonic() - started < 2.0
    sentence = "The quick brown fox jumps over the lazy dog."
    r = send(
        client,
        "POST",
        f"{open_stack.base_url}/v1/encode/{MINILM}",
        headers={"Content-Type": b"application/json"},
        content=json.dumps({"items": [{"text": sentence}]}).encode(),
    )
    assert r.status_code == 200, r.text
    got = np.asarray(r.json()["items"][0]["dense"]["values"], dtype=np.float32)
    want = st_model.encode([sentence])[0]
    np.testing.assert_allclose(got, want, atol=1e-5)
    health = send(client, "GET", open_stack.base_url + "/health").json()
    assert health["status"] == "healthy", health

    by_test: dict[str, dict[int, int]] = {}
    for (test, status), n in sorted(STATS.items()):
        by_test.setdefault(test, {})[status] = n
    for test, counts in by_test.items():
        wall, cpu = COST.get(test, (0.0, 0.0))
        print(
            f"{test}: {sum(counts.values())} requests in {wall:.1f}s (process CPU {cpu:.1f}s, "
            f"waiting {REQUEST_S.get(test, 0.0):.1f}s), by status {counts}"
        )
    for took, what in sorted(SLOW, reverse=True)[:15]:
        print(f"slow: {took:.2f}s {what}")


def test_every_route_was_fuzzed(open_stack: Stack) -> None:
    """Every route of the gateway and the config app got cases (when the whole file ran)."""
    fuzz_tests = {n for n, f in globals().items() if n.startswith("test_fuzz_") and callable(f)}
    if not fuzz_tests <= set(COST):
        pytest.skip("only a subset of the fuzz tests ran")
    for app_name, app in open_stack.running.apps.items():
        for route in app.routes:
            assert isinstance(route, Route | WebSocketRoute)
            methods = route.methods or () if isinstance(route, Route) else ("WS",)
            hits = [
                p for a, m, p in HIT if a == app_name and m in methods and route.path_regex.match(p)
            ]
            assert hits, f"{app_name} route {sorted(methods)} {route.path} never fuzzed"
