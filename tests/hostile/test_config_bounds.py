"""Bounds of the config role (docs/security.md "Limits", "Config role").

Security review findings 5, 11a and 11d, over real HTTP (in-process stacks: hypercorn,
the memory bus, every role in one process, as ``sie serve`` runs them) plus the pure
parts:

- a config body is bounded by bytes, by structural tokens counted the way YAML breaks
  lines (a ``\\r``-separated 65,000-key body was accepted and parsed for 15 s), and by
  parsed nodes and depth: ``load_yaml`` stops the parse itself at the bound, so a
  hostile document costs bounded time whatever its size; alias expansion is bounded
  in nodes and characters;
- while a hostile write is in flight, other clients' ``/healthz`` and encodes stay fast;
- a large but legal config is dumped to YAML off the event loop and once: reading it
  on the gateway (or the config port, or exporting it) does not freeze the loop;
- the authority holds at most ``SIE_CONFIG_MAX_MODELS`` models (409
  ``MODEL_LIMIT_EXCEEDED``);
- two model ids with one NATS subject token (``sec/x.y``, ``sec/x_dot_y``) are refused
  on every path (409 ``MODEL_ID_CONFLICT`` on writes);
- error bodies echo at most ``MAX_ECHO_CHARS`` of an id the client sent.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import ruamel.yaml.parser
import ruamel.yaml.scanner

import sie.core.config as config_module
import sie.core.yamldoc as yamldoc
from sie.control.seed import load_models
from sie.control.sync import ConfigSync
from sie.core.config import (
    MAX_YAML_CHARS,
    MAX_YAML_NODES,
    check_document_size,
    dump_yaml,
    load_yaml,
    parse_model_config,
    structural_tokens,
)
from sie.core.epoch import ConfigEpoch
from sie.core.errors import (
    MAX_ECHO_CHARS,
    MAX_MESSAGE_CHARS,
    ConfigError,
    InvalidInput,
    ModelIdConflict,
    ParseError,
    ValidationFailed,
    echo,
)
from sie.core.wire import ConfigNotification
from sie.settings import ServeSettings
from tests.configdata import ADAPTER, model_doc, model_yaml, registry
from tests.conftest import MINILM, Stack, run_stack, wait_for

ST_ADAPTER = "sie.engines.encoders.sentence_transformers:DenseEncoder"
LONG = "a" * 10_000


def cfg_url(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.running.config_port}"


def st_model(sie_id: str, profiles: str = "") -> bytes:
    """A routable sentence-transformers config (no weights needed to write it)."""
    return (
        f"sie_id: {sie_id}\nhf_id: {sie_id}\ntasks: {{encode: {{dense: {{dim: 8}}}}}}\n"
        f"profiles:\n  default:\n    adapter_path: {ST_ADAPTER}\n    max_batch_tokens: 64\n"
        + profiles
    ).encode()


def cr_bomb() -> bytes:
    """The finding's body: 65,000 keys with ``\\r`` line ends, about 975 KB."""
    body = "sie_id: sec/cr\r" + "".join(f"k{i:07d}: v\r" for i in range(65_000))
    return body.encode()


def deep_lines_bomb() -> bytes:
    """Few lines (passes the token pre-count) but past the node bound: each line is a
    sequence nested 30 deep (31 nodes), 700 lines are about 21,700 nodes."""
    return ("sie_id: sec/deep\nx:\n" + ("- " * 30 + "v\n") * 700).encode()


def large_legal_config(sie_id: str = "big/legal") -> bytes:
    """About 17,600 nodes in 8,800 lines: under every bound, but seconds of pure-Python
    YAML dumping (200 profiles, 40 engine-specific runtime options each)."""
    lines = [
        f"sie_id: {sie_id}",
        f"hf_id: {sie_id}",
        "tasks: {encode: {dense: {dim: 8}}}",
        "profiles:",
        "  default:",
        f"    adapter_path: {ST_ADAPTER}",
        "    max_batch_tokens: 64",
    ]
    for i in range(200):
        lines += [f"  p{i}:", "    extends: default", "    adapter_options:", "      runtime:"]
        lines += [f"        option_{j}: {j}" for j in range(40)]
    return ("\n".join(lines) + "\n").encode()


class LatencyProbe:
    """Calls ``url`` back to back in a thread until stopped; the slowest call wins."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.worst_s = 0.0
        self.calls = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                t0 = time.monotonic()
                r = client.get(self.url)
                self.worst_s = max(self.worst_s, time.monotonic() - t0)
                self.calls += 1
                if r.status_code != 200:
                    self.failures.append(f"{r.status_code} {r.text[:200]}")
                self._stop.wait(0.01)

    def __enter__(self) -> LatencyProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def healthz_baseline(url: str, seconds: float = 1.0) -> float:
    """The slowest ``/healthz`` over ``seconds`` with nothing hostile going on: latency
    bounds are relative to it (other work may share the machine's cores)."""
    with LatencyProbe(url) as probe:
        threading.Event().wait(seconds)
    return probe.worst_s


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        t0 = time.monotonic()
        out["result"] = fn()
        out["elapsed_s"] = time.monotonic() - t0

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.fixture(autouse=True)
def serve_switch_interval() -> Iterator[None]:
    """The GIL hand-over interval ``sie serve`` sets (``SIE_GIL_SWITCH_INTERVAL_MS``,
    ``sie.cli``): latencies below are those of a served process, not of Python's 5 ms
    default, with which a pure-Python thread delays each loop wake-up."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(ServeSettings().gil_switch_interval_ms / 1000)
    yield
    sys.setswitchinterval(before)


@pytest.fixture(scope="module")
def plain() -> Iterator[Stack]:
    """Gateway + config roles (no worker), default limits."""
    with run_stack(roles=("gateway", "config"), config_poll_interval_s=0.5) as s:
        yield s


# -- the parse is bounded (pure) -------------------------------------------------------------


@pytest.mark.parametrize("brk", ["\n", "\r", "\r\n", "\x85", "\u2028", "\u2029"])
def test_structural_tokens_count_every_line_break_once(brk: str) -> None:
    assert structural_tokens(f"a: 1{brk}b: 2{brk}c: [1, 2]{brk}") == 3 + 2
    assert structural_tokens(brk * 1000) == 1000


@pytest.mark.parametrize("brk", ["\r", "\r\n", "\n"])
def test_token_precount_refuses_before_parsing(brk: str, monkeypatch: pytest.MonkeyPatch) -> None:
    events = count_events(monkeypatch)
    body = brk.join(["sie_id: x", *(f"k{i}: v" for i in range(20_000))]).encode()
    with pytest.raises(ParseError, match="exceeds the limit of 10000") as err:
        load_yaml(body, what="body", max_tokens=10_000)
    assert err.value.fields["field"] == "body"
    assert events[0] == 0  # refused by the C-speed count: nothing parsed


def count_events(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the parser events ruamel produces (each costs pure-Python scanning)."""
    seen = [0]
    original = ruamel.yaml.parser.Parser.get_event

    def get_event(self: Any) -> Any:
        seen[0] += 1
        return original(self)

    monkeypatch.setattr(ruamel.yaml.parser.Parser, "get_event", get_event)
    return seen


def test_node_bound_stops_the_parse_not_just_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(yamldoc, "MAX_YAML_NODES", 1_000)
    events = count_events(monkeypatch)
    text = "a:\n" + "- x\n" * 100_000  # 100,000 nodes; composing them all takes seconds
    t0 = time.monotonic()
    with pytest.raises(ParseError, match="more than 1000 YAML nodes") as err:
        load_yaml(text)
    assert err.value.fields["field"] == "body"
    assert events[0] < 1_100, "the parse went on past the node bound"
    assert time.monotonic() - t0 < 2.0


@pytest.mark.parametrize(
    "text",
    ["a: " + "[" * 200_000, "a: " + "{a: " * 200_000, "a:\n" + "- " * 200_000 + "x\n"],
    ids=["flow-seq", "flow-map", "block-seq"],
)
def test_depth_bound_stops_the_scan(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside flow collections ruamel's scanner reads about 1,000 tokens ahead, with
    simple-key work per nesting level (quadratic): the scanner itself stops at the
    depth bound, so a few KB of ``[`` cost microseconds, not seconds."""
    fetches = [0]
    original = ruamel.yaml.scanner.Scanner.fetch_more_tokens

    def fetch_more_tokens(self: Any) -> Any:
        fetches[0] += 1
        return original(self)

    monkeypatch.setattr(ruamel.yaml.scanner.Scanner, "fetch_more_tokens", fetch_more_tokens)
    with pytest.raises(ParseError, match="nested deeper than 32 levels") as err:
        load_yaml(text)
    assert err.value.fields["field"] == "body"
    assert fetches[0] < 150, "the scan went on past the depth bound"


def test_alias_expansion_is_bounded_in_nodes_and_characters() -> None:
    long = "x" * 10_000
    chars = f"s: &s '{long}'\nl: [" + ", ".join(["*s"] * 200) + "]\n"  # 2 M characters
    with pytest.raises(ParseError, match=f"more than {MAX_YAML_CHARS} characters"):
        load_yaml(chars)
    nodes = "a: &a [" + ", ".join(["1"] * 200) + "]\nb: [" + ", ".join(["*a"] * 200) + "]\n"
    with pytest.raises(ParseError, match=f"more than {MAX_YAML_NODES} nodes"):
        load_yaml(nodes)  # 400 nodes as written, 40,000 expanded


def test_every_shipped_and_test_config_is_far_below_the_bounds() -> None:
    root = Path(__file__).resolve().parents[2]
    files = sorted([*root.glob("configs/*.yaml"), *root.glob("bundles/*.yaml")])
    assert files
    for f in files:
        text = f.read_text()
        nodes, chars = config_module.document_size(load_yaml(text))
        assert nodes * 100 < MAX_YAML_NODES and chars * 100 < MAX_YAML_CHARS, f
        assert structural_tokens(text) * 100 < 10_000, f
    # 256 profiles, each with every option block of the largest shipped profile
    doc = model_doc("org/wide")
    for i in range(255):
        doc["profiles"][f"p{i}"] = {
            "adapter_path": ADAPTER,
            "max_batch_tokens": 16384,
            "compute_precision": "float16",
            "adapter_options": {
                "loadtime": {"trust_remote_code": False},
                "runtime": {"normalize": True},
            },
        }
    text = dump_yaml(doc)
    assert structural_tokens(text) < 10_000 // 2
    nodes, _ = config_module.document_size(load_yaml(text))
    assert nodes * 4 < MAX_YAML_NODES


def test_merged_config_is_held_to_the_same_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Appends add up: a model whose merged document passed the bounds would not load
    again (restore, deltas, export), so the merge refuses it (422 naming profiles)."""
    monkeypatch.setattr(yamldoc, "MAX_YAML_NODES", 2_000)  # the same rule, faster
    r = registry()
    r.add_model_config(parse_model_config(model_doc("org/grow")))
    runtime = {f"o{j}": j for j in range(40)}  # 88 nodes a profile
    for i in range(2_000 // 90):
        r.add_model_config(
            parse_model_config(
                {
                    **model_doc("org/grow"),
                    "profiles": {
                        **model_doc()["profiles"],
                        f"p{i}": {"extends": "default", "adapter_options": {"runtime": runtime}},
                    },
                }
            )
        )
    big = {"extends": "default", "adapter_options": {"runtime": runtime}}
    with pytest.raises(ValidationFailed, match="more than 2000 YAML nodes") as err:
        r.plan_write({"sie_id": "org/grow", "profiles": {"last": big, "last2": big}})
    assert err.value.fields["field"] == "profiles"
    assert load_yaml(r.snapshot.config_yaml("org/grow"))["sie_id"] == "org/grow"
    with pytest.raises(ValidationFailed, match="characters"):
        check_document_size({"a": "x" * (MAX_YAML_CHARS + 1)}, what="doc")


# -- hostile writes over HTTP --------------------------------------------------------------


def test_cr_line_break_body_is_refused_at_once(plain: Stack) -> None:
    body = cr_bomb()
    assert len(body) < 1024 * 1024
    t0 = time.monotonic()
    r = httpx.post(f"{cfg_url(plain)}/v1/configs/models", content=body, timeout=60)
    elapsed = time.monotonic() - t0
    assert r.status_code == 400, r.text[:500]
    detail = r.json()["detail"]
    assert detail["code"] == "PARSE_ERROR" and detail["field"] == "body"
    assert "65001 lines/items exceeds the limit of 10000" in detail["message"]
    assert elapsed < 1.0


def test_node_bound_refuses_a_short_but_deep_body(plain: Stack) -> None:
    r = httpx.post(f"{cfg_url(plain)}/v1/configs/models", content=deep_lines_bomb(), timeout=60)
    assert r.status_code == 400, r.text[:500]
    detail = r.json()["detail"]
    assert detail["code"] == "PARSE_ERROR" and detail["field"] == "body"
    assert f"more than {MAX_YAML_NODES} YAML nodes" in detail["message"]


@pytest.mark.slow
@pytest.mark.parametrize("bomb", [cr_bomb, deep_lines_bomb], ids=["cr-65k-keys", "deep-lines"])
def test_hostile_write_in_flight_does_not_stall_other_clients(
    stack: Stack, bomb: Callable[[], bytes]
) -> None:
    """Every role in one process: while the hostile write is parsed, ``/healthz`` on
    both ports and a one-item encode answer as usual, and the write ends bounded."""
    authority = stack.running.config.authority  # type: ignore[union-attr]
    entered = threading.Event()
    original = authority._prevalidate

    def spy(body: bytes) -> Any:
        entered.set()
        return original(body)

    encode_url = f"{stack.base_url}/v1/encode/{MINILM}"
    one = {"items": [{"text": "hello world"}]}
    assert httpx.post(encode_url, json=one, timeout=60).status_code == 200  # warm
    base_encode = 0.0
    for _ in range(3):
        t0 = time.monotonic()
        assert httpx.post(encode_url, json=one, timeout=60).status_code == 200
        base_encode = max(base_encode, time.monotonic() - t0)
    healthz_limit = max(1.0, 3 * healthz_baseline(f"{stack.base_url}/healthz"))
    encode_limit = max(3.0, 3 * base_encode)
    body = bomb()
    authority._prevalidate = spy  # type: ignore[method-assign]
    try:
        writer, out = in_thread(
            lambda: httpx.post(f"{cfg_url(stack)}/v1/configs/models", content=body, timeout=120)
        )
        assert entered.wait(30), "the write never reached the parse"
        encodes: list[float] = []
        overlapped = 0
        with (
            LatencyProbe(f"{stack.base_url}/healthz") as gw,
            LatencyProbe(f"{cfg_url(stack)}/healthz") as cfg,
        ):
            while writer.is_alive() or len(encodes) < 3:
                overlapped += writer.is_alive()
                t0 = time.monotonic()
                r = httpx.post(encode_url, json=one, timeout=60)
                encodes.append(time.monotonic() - t0)
                assert r.status_code == 200, r.text[:300]
                if len(encodes) > 200:
                    break
        writer.join(timeout=120)
    finally:
        authority._prevalidate = original  # type: ignore[method-assign]
    reply = out["result"]
    assert reply.status_code == 400 and reply.json()["detail"]["code"] == "PARSE_ERROR"
    if bomb is cr_bomb:
        assert out["elapsed_s"] < 1.0  # refused before the pure-Python parse
    else:
        assert overlapped >= 1  # the parse took long enough to overlap the probes
        assert out["elapsed_s"] < 30.0  # bounded by the node limit
    assert not gw.failures and not cfg.failures
    assert gw.worst_s < healthz_limit and cfg.worst_s < healthz_limit, (
        gw.worst_s,
        cfg.worst_s,
        healthz_limit,
    )
    assert max(encodes) < encode_limit, (encodes, base_encode)


def test_large_legal_config_is_read_without_freezing_the_loop(plain: Stack) -> None:
    """Writing, reading (gateway and config port) and exporting a config near the node
    bound: the YAML dumps and parses run in threads, so ``/healthz`` on the shared loop
    stays fast; a second read is served from the per-config cache."""
    gw, cfg = plain.base_url, cfg_url(plain)
    body = large_legal_config()
    limit = max(1.0, 3 * healthz_baseline(f"{gw}/healthz"))
    with LatencyProbe(f"{gw}/healthz") as during_write:
        r = httpx.post(f"{cfg}/v1/configs/models", content=body, timeout=120)
        assert r.status_code == 201, r.text[:500]

        def applied() -> bool:
            listed = httpx.get(f"{gw}/v1/configs/models", timeout=60).json()["models"]
            return any(m["model_id"] == "big/legal" for m in listed)

        wait_for(applied, timeout_s=60)
    with LatencyProbe(f"{gw}/healthz") as during_reads:
        first = httpx.get(f"{gw}/v1/configs/models/big/legal", timeout=120)
        on_config = httpx.get(f"{cfg}/v1/configs/models/big/legal", timeout=120)
        export = httpx.get(f"{cfg}/v1/configs/export", timeout=120)
    assert first.status_code == 200 and on_config.status_code == 200 and export.status_code == 200
    assert first.text == on_config.text
    assert len(load_yaml(first.text)["profiles"]) == 201
    row = next(m for m in export.json()["models"] if m["model_id"] == "big/legal")
    assert row["raw_yaml"] == on_config.text
    assert during_write.calls > 0 and during_reads.calls > 0
    assert during_write.worst_s < limit, (during_write.worst_s, limit)
    assert during_reads.worst_s < limit, (during_reads.worst_s, limit)
    # dumped once per served config: the next read is the cached text
    assert plain.running.registry is not None
    assert plain.running.registry.snapshot.cached_config_yaml("big/legal") == first.text
    assert httpx.get(f"{gw}/v1/configs/models/big/legal", timeout=60).text == first.text


# -- the model-count limit -----------------------------------------------------------------


def test_model_count_limit_refuses_new_models_only() -> None:
    seeds = len(load_models(str(Path(__file__).resolve().parents[2] / "configs")))
    with run_stack(roles=("config",), config_max_models=seeds + 2) as s:
        url = f"{cfg_url(s)}/v1/configs/models"
        assert httpx.post(url, content=st_model("cap/a")).status_code == 201
        assert httpx.post(url, content=st_model("cap/b")).status_code == 201
        r = httpx.post(url, content=st_model("cap/c"))
        assert r.status_code == 409, r.text
        detail = r.json()["detail"]
        assert detail["code"] == "MODEL_LIMIT_EXCEEDED" and detail["field"] == "sie_id"
        assert detail["limit"] == seeds + 2 and "SIE_CONFIG_MAX_MODELS" in detail["message"]
        assert r.headers["X-SIE-Error-Code"] == "MODEL_LIMIT_EXCEEDED"
        # existing models: a replay is a no-op, an appended profile is created
        assert httpx.post(url, content=st_model("cap/a")).status_code == 200
        more = "  extra:\n    extends: default\n"
        assert httpx.post(url, content=st_model("cap/a", more)).status_code == 201
        listed = {m["model_id"] for m in httpx.get(url).json()["models"]}
        assert "cap/c" not in listed and len(listed) == seeds + 2


# -- one subject token per model -----------------------------------------------------------


def test_colliding_subject_token_is_refused_on_write(plain: Stack) -> None:
    url = f"{cfg_url(plain)}/v1/configs/models"
    for first, second, token in [
        ("sec/x.y", "sec/x_dot_y", "sec__x_dot_y"),  # '.' is '_dot_'
        ("sec_/z", "sec/_z", "sec___z"),  # '/' is '__' (no store here to catch it)
    ]:
        assert httpx.post(url, content=st_model(first)).status_code == 201
        r = httpx.post(url, content=st_model(second))
        assert r.status_code == 409, r.text
        detail = r.json()["detail"]
        assert detail["code"] == "MODEL_ID_CONFLICT" and detail["field"] == "sie_id"
        assert detail["conflicting_model"] == first and detail["subject_token"] == token
        listed = {m["model_id"] for m in httpx.get(url).json()["models"]}
        assert first in listed and second not in listed
    # profiles are routed as their own token too
    two = "  p.q:\n    extends: default\n  p_dot_q:\n    extends: default\n"
    r = httpx.post(url, content=st_model("sec/profiles", two))
    assert r.status_code == 422 and "same subject token" in r.json()["detail"]["message"]


def test_registry_refuses_colliding_ids_from_every_path(tmp_path: Path) -> None:
    r = registry()
    r.add_model_config(parse_model_config(model_doc("sec/x.y")))
    before = r.snapshot
    with pytest.raises(ModelIdConflict) as err:  # e.g. a seed model or a restored one
        r.add_model_config(parse_model_config(model_doc("sec/x_dot_y")))
    assert err.value.fields == {
        "field": "sie_id",
        "conflicting_model": "sec/x.y",
        "subject_token": "sec__x_dot_y",
    }
    assert r.snapshot is before
    with pytest.raises(ModelIdConflict):  # an export (gateway bootstrap)
        r.replace_models([(parse_model_config(model_doc(m)), "api") for m in ("a_/b", "a/_b")])
    assert r.snapshot is before
    # a delta from the authority's bus
    sync = ConfigSync(r, ConfigEpoch(), base_url=None)
    note = ConfigNotification(
        router_id="sie-config",
        bundle_id="default",
        epoch=5,
        model_id="sec/x_dot_y",
        model_config_yaml=model_yaml("sec/x_dot_y").decode(),
    ).to_bytes()
    assert sync.handle_delta(note) == "rejected"
    assert "sec/x_dot_y" not in r.snapshot.configs and sync.epoch.get() == 0
    # seed files
    (tmp_path / "a.yaml").write_bytes(model_yaml("sec/x.y"))
    (tmp_path / "b.yaml").write_bytes(model_yaml("sec/x_dot_y"))
    with pytest.raises(
        ConfigError, match=re.escape("b.yaml: sie_id 'sec/x_dot_y' maps to the NATS")
    ):
        load_models(str(tmp_path))


# -- bounded echo of client ids ------------------------------------------------------------


def assert_capped(detail: dict[str, Any]) -> None:
    assert len(detail["message"]) < MAX_ECHO_CHARS + 300, detail["message"][:400]
    assert re.search(r"…\(100\d\d chars\)", detail["message"]), detail["message"][:400]
    for key, value in detail.items():
        if isinstance(value, str) and key != "message":
            assert len(value) <= MAX_ECHO_CHARS + 20, key


def test_long_ids_are_echoed_capped(plain: Stack) -> None:
    gw, cfg = plain.base_url, cfg_url(plain)
    for url in (
        f"{gw}/v1/configs/models/{LONG}",
        f"{cfg}/v1/configs/models/{LONG}",
        f"{gw}/v1/models/{LONG}",
    ):
        r = httpx.get(url)
        assert r.status_code == 404, url
        assert_capped(r.json()["detail"] if "detail" in r.json() else r.json()["error"])
    r = httpx.post(f"{gw}/v1/encode/{LONG}", json={"items": [{"text": "x"}]})
    assert r.status_code == 404
    assert_capped(r.json()["detail"])
    for base in (gw, cfg):
        r = httpx.post(f"{base}/v1/configs/resolve", json={"model": LONG})
        assert r.status_code == 404
        assert_capped(r.json()["detail"])
    r = httpx.post(f"{gw}/v1/embeddings", json={"model": LONG, "input": "x"})
    assert r.status_code == 404
    error = r.json()["error"]
    assert len(error["message"]) < MAX_ECHO_CHARS + 300 and "(10000 chars)" in error["message"]
    r = httpx.post(f"{cfg}/v1/configs/models", content=model_yaml("../" + LONG))
    assert r.status_code == 400
    assert_capped(r.json()["detail"])


def test_every_error_bounds_what_it_echoes() -> None:
    assert echo("abc") == "abc"
    assert echo(LONG) == "a" * MAX_ECHO_CHARS + "…(10000 chars)"
    err = InvalidInput(f"head {LONG} {LONG} tail", model=LONG, n=3, names=["x"])
    assert len(err.message) < MAX_MESSAGE_CHARS + 40
    assert err.message.startswith("head aaa") and err.message.endswith("aaa tail")
    assert err.fields == {"model": echo(LONG), "n": 3, "names": ["x"]}
    assert str(err) == err.message
    many = {f"k{i}": 1 for i in range(5_000)}  # 5,000 unknown keys, one error each
    with pytest.raises(ConfigError) as cfg_err:
        parse_model_config({**model_doc(), **many})
    assert len(cfg_err.value.message) < MAX_MESSAGE_CHARS + 40
    assert len(cfg_err.value.fields["errors"]) == 21  # 20 listed + "... and 4980 more"


# -- strings the store, hashes and deltas cannot write ----------------------------------------


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ('a: "x\\ud800y"', "a"),
        ('a: {b: [ok, "\\udc00"]}', "a.b[1]"),
        ('"k\\ud800": 1', "k\\ud800"),  # in a key: echoed escaped, so the error encodes
    ],
)
def test_a_lone_surrogate_is_refused_at_parse(doc: str, field: str) -> None:
    with pytest.raises(ParseError) as err:
        yamldoc.load_yaml(doc)
    assert err.value.fields["field"] == field
    assert "unpaired surrogate" in err.value.message
    err.value.message.encode("utf-8")  # the reply can be written


def test_a_lone_surrogate_in_a_config_write_is_a_400_and_the_role_keeps_working(
    plain: Stack,
) -> None:
    """Found by a hostile trial: the write answered 500 after the registry had taken
    the config, and every later write and epoch read failed until a restart."""
    url = f"{cfg_url(plain)}/v1/configs/models"
    epoch = httpx.get(f"{cfg_url(plain)}/v1/configs/epoch").json()
    hostile = st_model(
        "sec/surrogate",
        '  x:\n    extends: default\n    adapter_options: {loadtime: {k: "\\ud800"}}\n',
    )
    r = httpx.post(url, content=hostile, headers={"content-type": "application/yaml"})
    assert r.status_code == 400, r.text[:500]
    detail = r.json()["detail"]
    assert detail["code"] == "PARSE_ERROR"
    assert detail["field"] == "profiles.x.adapter_options.loadtime.k"
    assert httpx.get(f"{url}/sec/surrogate").status_code == 404  # nothing was applied
    assert httpx.get(f"{cfg_url(plain)}/v1/configs/epoch").json() == epoch
    assert httpx.post(url, content=st_model("sec/after-surrogate")).status_code == 201
    assert httpx.get(f"{cfg_url(plain)}/v1/configs/epoch").status_code == 200
