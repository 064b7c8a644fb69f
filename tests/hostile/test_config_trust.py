"""The trust model for model configs (docs/security.md "Trust model"; ``sie.core.trust``).

Config writers are not operators. Over real HTTP (in-process stacks: hypercorn, the
memory bus): a write asking for remote code, a ``weights_path`` outside the weights
roots, an upstream off the allowlist or an ``api_key_env`` the operator did not declare
is a 422 naming the field and persists nothing; with the operator's opt-in settings it
is accepted. Configs that bypass the write path (seed files here; bus deltas and the
store are the same for the worker) are refused by the worker at load, before any
import (a ``modeling_x.py`` that would write a marker file stays unimported) and
before the admin token could reach an upstream. Plus the pure parts: the URL allowlist
against parsing tricks, ``extends`` resolution, symlink and ``..`` escapes, the bounded
size estimate (``weights_path: /``) and path redaction of client-visible load errors.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Hashable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from pydantic import SecretStr, ValidationError

from sie.core.config import dump_yaml, parse_bundle, parse_model_config
from sie.core.errors import ModelLoadFailed, ValidationFailed
from sie.core.registry import ModelEntry, ModelRegistry
from sie.core.trust import ConfigTrust, parse_upstream_url, redact_paths
from sie.engines import weights
from sie.engines.runtime.cache import ModelCache
from sie.settings import ServeSettings
from tests.conftest import BUNDLES, Stack, run_stack, wait_for

MINILM_HF = "sentence-transformers/all-MiniLM-L6-v2"
ST = "sie.engines.encoders.sentence_transformers:DenseEncoder"
UPSTREAM = "sie.engines.generators.openai_upstream:OpenAIUpstreamGenerator"
LOADTIME = "adapter_options.loadtime"
YAML = {"Content-Type": "application/yaml"}
ADMIN = "admin-secret-never-sent"


# ------------------------------------------------------------------ config documents


def st_doc(sie_id: str, *, loadtime: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    profile: dict[str, Any] = {"adapter_path": ST, "max_batch_tokens": 1024}
    if loadtime is not None:
        profile["adapter_options"] = {"loadtime": loadtime}
    doc: dict[str, Any] = {
        "sie_id": sie_id,
        "tasks": {"encode": {"dense": {"dim": 384}}},
        "profiles": {"default": profile},
    }
    doc.update(top if "weights_path" in top or "hf_id" in top else {"hf_id": MINILM_HF, **top})
    return doc


def upstream_doc(sie_id: str, **loadtime: Any) -> dict[str, Any]:
    return {
        "sie_id": sie_id,
        "hf_id": "org/upstream-llm",
        "tasks": {"generate": {}},
        "profiles": {
            "default": {
                "adapter_path": UPSTREAM,
                "max_batch_tokens": 8192,
                "adapter_options": {"loadtime": {"metrics_url": False, **loadtime}},
            }
        },
    }


def remote_code_dir(parent: Path, name: str, marker: Path) -> Path:
    """A weights directory whose config makes transformers import ``modeling_x.py``
    (with ``trust_remote_code``), which writes ``marker`` when imported."""
    d = parent / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(
        json.dumps(
            {
                "model_type": "bert",
                "auto_map": {"AutoConfig": "modeling_x.XConfig", "AutoModel": "modeling_x.XModel"},
            }
        )
    )
    (d / "modeling_x.py").write_text(
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('imported')\n"
        "from transformers import PretrainedConfig\n\n\n"
        "class XConfig(PretrainedConfig):\n"
        "    model_type = 'x'\n"
    )
    return d


# ------------------------------------------------------------------ pure policy


ALLOW = ConfigTrust(upstream_base_urls=("http://good.example.com", "https://api.example.com/v1"))


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://good.example.com", True),
        ("http://good.example.com/", True),
        ("http://GOOD.example.com:80/v1", True),
        ("http://good.example.com./v1", True),  # the same host, fully qualified
        ("https://api.example.com/v1", True),
        ("https://api.example.com:443/v1/chat/completions", True),
        # userinfo: the host is evil (and credentials never belong in an upstream URL)
        ("http://good.example.com@evil.example", False),
        ("http://good.example.com:80@evil.example", False),
        ("http://user:pw@good.example.com", False),
        ("http://good.example.com\\@evil.example", False),
        # look-alike hosts, other ports and schemes
        ("http://good.example.com.evil.com", False),
        ("http://evilgood.example.com", False),
        ("http://good.example.com:8080", False),
        ("https://good.example.com", False),
        ("ftp://good.example.com", False),
        ("//good.example.com", False),
        ("good.example.com", False),
        # the allowed origin named in a query or fragment of another one
        ("http://evil.example/?u=http://good.example.com", False),
        ("http://good.example.com#@evil.example", False),
        ("http://good.example.com/?x=1", False),
        # path prefix is by segment; no escaping it with dot segments
        ("https://api.example.com/v1x", False),
        ("https://api.example.com/", False),
        ("https://api.example.com/v1/../admin", False),
        ("https://api.example.com/v1/%2e%2e/admin", False),
        ("https://api.example.com/v1/./x", False),
        # odd characters
        ("http://good.example.com /x", False),
        ("http://good.example.com\n.evil", False),
        ("http://gööd.example.com", False),
        ("http://good.example.com:99999", False),
        ("", False),
    ],
)
def test_upstream_allowlist_is_parsed_not_prefix_matched(url: str, allowed: bool) -> None:
    assert ALLOW.upstream_allowed(url) is allowed


def test_allowlist_entries_must_parse() -> None:
    for bad in ("http://user@good.example.com", "good.example.com", "http://h/?q=1"):
        with pytest.raises(ValueError):
            parse_upstream_url(bad)
        with pytest.raises(ValidationError, match="SIE_UPSTREAM_BASE_URLS"):
            ServeSettings.from_env({"SIE_UPSTREAM_BASE_URLS": f"http://ok.example,{bad}"})
    s = ServeSettings.from_env({"SIE_UPSTREAM_BASE_URLS": "http://a.example:8000/v1, https://b"})
    assert s.upstream_base_urls == ("http://a.example:8000/v1", "https://b")


def test_upstream_keys_are_captured_for_declared_names_only() -> None:
    env = {
        "SIE_UPSTREAM_API_KEY_ENVS": "UPSTREAM_KEY,UNSET_KEY",
        "UPSTREAM_KEY": "sk-upstream",
        "SIE_ADMIN_TOKEN": ADMIN,
        "OTHER_SECRET": "x",
    }
    s = ServeSettings.from_env(env)
    assert {k: v.get_secret_value() for k, v in s.upstream_api_keys.items()} == {
        "UPSTREAM_KEY": "sk-upstream"
    }
    assert "sk-upstream" not in repr(s)
    # an SIE setting (the admin token, the auth tokens) can never be declared as a key
    for name in ("SIE_ADMIN_TOKEN", "SIE_AUTH_TOKEN", "SIE_AUTH_TOKENS"):
        with pytest.raises(ValidationError, match="SIE setting"):
            ServeSettings.from_env({**env, "SIE_UPSTREAM_API_KEY_ENVS": name})
    with pytest.raises(ValidationError, match="not a variable name"):
        ServeSettings.from_env({"SIE_UPSTREAM_API_KEY_ENVS": "A-B"})
    trust = ConfigTrust(
        upstream_api_key_envs=frozenset({"UPSTREAM_KEY"}),
        upstream_api_keys={"UPSTREAM_KEY": SecretStr("sk"), "SIE_ADMIN_TOKEN": SecretStr(ADMIN)},
    )
    assert trust.api_key("UPSTREAM_KEY") == "sk"
    assert trust.api_key("SIE_ADMIN_TOKEN") is None  # captured by mistake: still not handed out
    assert ADMIN not in repr(trust)


def test_checks_see_the_resolved_loadtime_of_every_profile() -> None:
    remote = {"trust_remote_code": True}
    cfg = parse_model_config(
        {
            **st_doc("acme/x", loadtime=remote),
            "profiles": {
                "default": {
                    "adapter_path": ST,
                    "max_batch_tokens": 8,
                    "adapter_options": {"loadtime": remote},
                },
                "inherits": {"extends": "default", "max_batch_tokens": 4},
                "overrides": {
                    "extends": "default",
                    "adapter_options": {"loadtime": {"trust_remote_code": False}},
                },
                "own": {
                    "adapter_path": ST,
                    "max_batch_tokens": 8,
                    "adapter_options": {"loadtime": {"engine_args": {"trust_remote_code": True}}},
                },
            },
        }
    )
    fields = [f.field for f in ConfigTrust().findings(cfg)]
    assert fields == [
        f"profiles.default.{LOADTIME}.trust_remote_code",
        f"profiles.own.{LOADTIME}.engine_args.trust_remote_code",
    ]
    # a new profile inheriting the parent's loadtime is refused where the option is written
    assert [f.field for f in ConfigTrust().findings(cfg, ["inherits"])] == [fields[0]]
    assert ConfigTrust().findings(cfg, ["overrides"]) == []
    with pytest.raises(ModelLoadFailed) as info:
        ConfigTrust().check_load(cfg, cfg.resolve_profile("inherits"))
    assert info.value.fields["error_class"] == "CONFIG" and info.value.fields["permanent"]
    assert info.value.fields["config_field"] == fields[0]
    assert ConfigTrust(allow_trust_remote_code=True).findings(cfg) == []


def test_other_loadtime_escapes() -> None:
    cfg = parse_model_config(
        st_doc(
            "acme/y",
            loadtime={
                "gguf_file": "../../etc/passwd",
                "engine_args": {"model": "/etc", "worker_extension_cls": "os.system", "seed": 1},
            },
            hf_id="/srv/private/model",
        )
    )
    found = {f.field for f in ConfigTrust().findings(cfg)}
    assert found == {
        "hf_id",
        f"profiles.default.{LOADTIME}.gguf_file",
        f"profiles.default.{LOADTIME}.engine_args.model",
        f"profiles.default.{LOADTIME}.engine_args.worker_extension_cls",
    }
    with pytest.raises(ValidationFailed) as info:
        ConfigTrust().check(cfg)
    assert info.value.status == 422 and info.value.fields["field"] == "hf_id"


def test_weights_roots_resolve_symlinks_and_dot_dot(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "model").mkdir(parents=True)
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    (root / "inside").symlink_to(root / "model")
    trust = ConfigTrust(weights_roots=(root,))
    assert trust.weights_path_allowed(str(root / "model"))
    assert trust.weights_path_allowed(str(root / "inside"))
    assert trust.weights_path_allowed(str(root / "not-yet"))  # missing: a NOT_FOUND later
    assert not trust.weights_path_allowed(str(root / "escape"))
    assert not trust.weights_path_allowed(str(root / "escape" / "x"))
    assert not trust.weights_path_allowed(str(root / ".." / "outside"))
    assert not trust.weights_path_allowed(f"{root}/model/../../outside")
    assert not trust.weights_path_allowed(str(tmp_path / "rootless"))  # a sibling prefix
    assert not trust.weights_path_allowed("/")
    assert not trust.weights_path_allowed("bad\0path")
    assert not ConfigTrust().weights_path_allowed(str(root / "model"))  # no roots: none


def test_size_estimate_of_the_filesystem_root_is_bounded() -> None:
    cfg = parse_model_config(st_doc("acme/root", weights_path="/"))
    t0 = time.monotonic()
    weights.weights_bytes(cfg)
    assert time.monotonic() - t0 < 10


def test_size_estimate_stops_at_its_entry_and_depth_caps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(40):
        (tmp_path / f"w{i:02}.bin").write_bytes(b"x" * 10)
    deep = tmp_path.joinpath(*[f"d{i}" for i in range(10)])
    deep.mkdir(parents=True)
    (deep / "deep.bin").write_bytes(b"x" * 1000)
    (tmp_path / "loop").symlink_to(tmp_path)  # directory symlinks are not followed
    cfg = parse_model_config(st_doc("acme/tree", weights_path=str(tmp_path)))
    assert weights.weights_bytes(cfg) == 400  # 40 files; the deep one is past the depth cap
    monkeypatch.setattr(weights, "MAX_ESTIMATE_ENTRIES", 10)
    assert weights.weights_bytes(cfg) <= 100


def test_redact_paths_keeps_only_what_the_writer_sent() -> None:
    text = (
        "weights_path '/models/acme': does not exist; loading '/models/acme/model.gguf' into "
        "'/home/op/.cache/sie/models/acme' failed: No file /usr/lib/python3/site-packages/x.py "
        "(see ~/.config/x); http://127.0.0.1:8000/v1 answered; model org/name, ratio 1/2"
    )
    out = redact_paths(text, keep=["/models/acme"])
    assert "'/models/acme'" in out and "/models/acme/model.gguf" in out
    for leaked in ("/home/op", "/usr/lib", "~/.config"):
        assert leaked not in out
    assert "http://127.0.0.1:8000/v1" in out and "org/name" in out and "1/2" in out
    assert redact_paths("'/etc/x' and '/'", keep=["/"]) == "'<path>' and '/'"


# ------------------------------------------------------------------ worker model cache

MODULE = "tests.hostile.test_config_trust"
SEEN: dict[str, Any] = {}


class LeakyEngine:
    """Fails its load with a message naming the worker's own paths."""

    outputs = ("dense",)

    def __init__(self, config: Any, profile: Any, device: str, *, trust: Any = None) -> None:
        SEEN["trust"] = trust
        self.config = config

    def load(self) -> None:
        raise ModelLoadFailed(
            f"loading from {self.config.weights_path}/model.bin failed: see "
            "/opt/worker/site-packages/lib.py and /root/.cache/sie/models/m",
            error_class="UNKNOWN",
            permanent=True,
            tried=["package 'p': /opt/worker/site-packages/p missing"],
        )

    def unload(self) -> None:
        pass


def _entry(doc: dict[str, Any]) -> ModelEntry:
    reg = ModelRegistry()
    reg.install_bundles([parse_bundle({"name": "default", "priority": 1, "adapters": [MODULE]})])
    cfg = parse_model_config(doc)
    reg.add_model_config(cfg)
    return reg.snapshot.entries[cfg.sie_id]


def _run_batch(engine: Any) -> Any:
    def run(key: Hashable, payloads: Sequence[Any]) -> list[Any]:
        return list(payloads)

    return run


@pytest.mark.anyio
async def test_worker_load_errors_hide_worker_paths(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    doc = st_doc("acme/leaky", weights_path=str(tmp_path / "m"))
    doc["profiles"]["default"]["adapter_path"] = f"{MODULE}:LeakyEngine"
    trust = ConfigTrust(weights_roots=(tmp_path,))
    cache = ModelCache(allowed_modules=[MODULE], run_batch=_run_batch, trust=trust)
    async with anyio.create_task_group() as tg:
        await tg.start(cache.run)
        with caplog.at_level(logging.ERROR), pytest.raises(ModelLoadFailed) as info:
            await cache.get(_entry(doc))
        tg.cancel_scope.cancel()
    assert SEEN["trust"] is trust  # engines that take it get the operator's policy
    shown = info.value.to_detail()
    assert f"{tmp_path}/m/model.bin" in shown["message"]  # the writer's own path
    assert "/opt/worker" not in json.dumps(shown) and "/root/.cache" not in json.dumps(shown)
    last = {s["name"]: s for s in [st.to_map() for st in cache.statuses()]}["acme/leaky"][
        "last_error"
    ]
    assert "/opt/worker" not in json.dumps(last) and "<path>" in last["message"]
    assert "/opt/worker/site-packages/lib.py" in caplog.text  # the worker's log has it all


@pytest.mark.anyio
async def test_worker_refuses_before_sizing_or_importing(tmp_path: Path) -> None:
    SEEN.clear()
    doc = st_doc("acme/outside", weights_path="/")
    doc["profiles"]["default"]["adapter_path"] = f"{MODULE}:LeakyEngine"
    sized: list[str] = []
    cache = ModelCache(
        allowed_modules=[MODULE],
        run_batch=_run_batch,
        memory_budget_bytes=10**9,
        estimate_bytes=lambda e: sized.append(e.model_id) or 0,
        trust=ConfigTrust(weights_roots=(tmp_path,)),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(cache.run)
        with pytest.raises(ModelLoadFailed) as info:
            await cache.get(_entry(doc))
        tg.cancel_scope.cancel()
    assert info.value.fields["error_class"] == "CONFIG"
    assert info.value.fields["config_field"] == "weights_path"
    assert str(tmp_path) not in info.value.message  # the roots are not disclosed
    assert sized == [] and "trust" not in SEEN  # neither sized nor built


@pytest.mark.slow
def test_the_marker_directory_really_runs_code_when_trusted(tmp_path: Path) -> None:
    """Control for the worker test below: with trust_remote_code the load imports
    ``modeling_x.py`` (so an absent marker there means the worker refused in time)."""
    from sie.engines.encoders.sentence_transformers import DenseEncoder

    marker = tmp_path / "imported"
    d = remote_code_dir(tmp_path, f"remote-control-{os.getpid()}", marker)
    cfg = parse_model_config(
        {
            **st_doc("acme/control", weights_path=str(d)),
            "profiles": {
                "default": {
                    "adapter_path": ST,
                    "max_batch_tokens": 64,
                    "adapter_options": {"loadtime": {"trust_remote_code": True}},
                }
            },
        }
    )
    with pytest.raises(ModelLoadFailed):  # imported, then not a usable model
        DenseEncoder(cfg, cfg.resolve_profile(), "cpu").load()
    assert marker.read_text() == "imported"


# ------------------------------------------------------------------ over HTTP: writes


def post(stack: Stack, doc: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{stack.running.config_port}/v1/configs/models",
        content=dump_yaml(doc).encode(),
        headers=YAML,
        timeout=30,
    )


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("weights-root")
    (root / "model").mkdir()
    return root


@pytest.fixture(scope="module")
def deny(roots: Path) -> Iterator[Stack]:
    """The operator allows weights under ``roots`` only, and nothing else."""
    with run_stack(roles=("config",), weights_roots=(str(roots),)) as s:
        yield s


@pytest.fixture(scope="module")
def allow(roots: Path) -> Iterator[Stack]:
    """The operator opted in: remote code, one upstream, one key variable."""
    with run_stack(
        roles=("config",),
        weights_roots=(str(roots),),
        allow_trust_remote_code=True,
        upstream_base_urls=("http://good.example.com:8000",),
        upstream_api_key_envs=("UPSTREAM_KEY",),
    ) as s:
        yield s


REMOTE = f"profiles.default.{LOADTIME}.trust_remote_code"


def refused(stack: Stack, doc: dict[str, Any], field: str) -> dict[str, Any]:
    """POST ``doc``: a 422 naming ``field``; nothing was persisted."""
    cfg = f"http://127.0.0.1:{stack.running.config_port}"
    epoch = httpx.get(f"{cfg}/v1/configs/epoch").json()["epoch"]
    r = post(stack, doc)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail["code"] == "VALIDATION_ERROR" and detail["field"] == field, detail
    assert 'docs/security.md "Trust model"' in detail["message"]
    assert httpx.get(f"{cfg}/v1/configs/models/{doc['sie_id']}").status_code == 404
    assert httpx.get(f"{cfg}/v1/configs/epoch").json()["epoch"] == epoch
    return dict(detail)


def test_writes_asking_for_remote_code_are_refused(deny: Stack) -> None:
    refused(deny, st_doc("acme/remote", loadtime={"trust_remote_code": True}), REMOTE)
    # a second profile of an existing model, inheriting nothing, asking for it itself
    assert post(deny, st_doc("acme/base")).status_code == 201
    more = st_doc("acme/base")
    more["profiles"] = {
        "fast": {
            "extends": "default",
            "adapter_options": {"loadtime": {"trust_remote_code": True}},
        }
    }
    r = post(deny, more)
    assert r.status_code == 422 and r.json()["detail"]["field"] == (
        f"profiles.fast.{LOADTIME}.trust_remote_code"
    )
    vllm = st_doc("acme/vllm", loadtime={"engine_args": {"trust_remote_code": True}})
    refused(deny, vllm, f"profiles.default.{LOADTIME}.engine_args.trust_remote_code")


def test_writes_with_weights_outside_the_roots_are_refused(deny: Stack, roots: Path) -> None:
    for path in ("/", "/etc", f"{roots}/../elsewhere", "~/../../"):
        detail = refused(deny, st_doc("acme/w", weights_path=path), "weights_path")
        # the operator's roots are not disclosed (only the path the writer sent is echoed)
        assert str(roots) not in detail["message"].replace(repr(path), "")
    assert post(deny, st_doc("acme/w-ok", weights_path=str(roots / "model"))).status_code == 201


def test_writes_naming_upstreams_or_secrets_are_refused(deny: Stack, allow: Stack) -> None:
    base = f"profiles.default.{LOADTIME}"
    steal = upstream_doc(
        "acme/steal", base_url="http://good.example.com:8000", api_key_env="SIE_ADMIN_TOKEN"
    )
    # the admin token can never be declared (sie.settings), so it is refused everywhere
    refused(allow, steal, f"{base}.api_key_env")
    detail = refused(deny, steal, f"{base}.base_url")
    assert [e.split(":")[0] for e in detail["errors"]] == [
        f"{base}.base_url",
        f"{base}.api_key_env",
    ]
    refused(
        deny, upstream_doc("acme/up", base_url="http://good.example.com:8000"), f"{base}.base_url"
    )
    for trick in (
        "http://good.example.com:8000@evil.example",
        "http://good.example.com:8000.evil.example",
        "http://good.example.com:8001",
    ):
        refused(allow, upstream_doc("acme/trick", base_url=trick), f"{base}.base_url")
    refused(
        allow,
        upstream_doc(
            "acme/scrape",
            base_url="http://good.example.com:8000",
            metrics_url="http://169.254.169.254/latest/meta-data",
        ),
        f"{base}.metrics_url",
    )


def test_the_operator_opt_in_accepts_them(allow: Stack, roots: Path) -> None:
    assert (
        post(allow, st_doc("acme/remote", loadtime={"trust_remote_code": True})).status_code == 201
    )
    ok = upstream_doc(
        "acme/up",
        base_url="http://good.example.com:8000/v1",
        metrics_url="http://good.example.com:8000/metrics",
        api_key_env="UPSTREAM_KEY",
    )
    r = post(allow, ok)
    assert r.status_code == 201, r.text
    assert post(allow, st_doc("acme/w", weights_path=str(roots / "model"))).status_code == 201
    r = post(allow, st_doc("acme/w-out", weights_path="/"))  # the roots still apply
    assert r.status_code == 422 and r.json()["detail"]["field"] == "weights_path"


# ------------------------------------------------------------------ over HTTP: loads


class Recorder:
    """A TCP listener that records whatever connects to it (an 'upstream')."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.received = b""
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            with conn:
                conn.settimeout(1.0)
                try:
                    self.received += conn.recv(65536)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture(scope="module")
def recorder() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.close()


@pytest.fixture(scope="module")
def seeded(
    tmp_path_factory: pytest.TempPathFactory, roots: Path, recorder: Recorder
) -> Iterator[tuple[Stack, Path]]:
    """A full stack whose seed files (not the write path) hold configs the operator did
    not allow; the upstream ``base_url`` is on the allowlist, its key variable is not."""
    seed = tmp_path_factory.mktemp("seed")
    marker = tmp_path_factory.mktemp("marker") / "imported"
    model = remote_code_dir(roots, f"remote-seeded-{os.getpid()}", marker)
    remote = st_doc("acme/remote", weights_path=str(model))
    remote["profiles"]["default"]["adapter_options"] = {"loadtime": {"trust_remote_code": True}}
    docs = [
        remote,
        st_doc("acme/everything", weights_path="/"),
        upstream_doc("acme/steal", base_url=recorder.url, api_key_env="SIE_ADMIN_TOKEN"),
    ]
    for i, doc in enumerate(docs):
        (seed / f"m{i}.yaml").write_text(dump_yaml(doc))
    with run_stack(
        models_dir=str(seed),
        bundles_dir=str(BUNDLES),
        weights_roots=(str(roots),),
        upstream_base_urls=(recorder.url,),
        admin_token=ADMIN,
    ) as s:
        yield s, marker


def load_error(stack: Stack, model: str) -> dict[str, Any]:
    def failed() -> Any:
        info = httpx.get(f"{stack.base_url}/v1/models/{model}").json()
        return info if info.get("state") == "failed" else None

    return dict(wait_for(failed, 10)["last_error"])


@pytest.mark.slow
def test_seeded_remote_code_is_refused_at_load_without_importing(
    seeded: tuple[Stack, Path],
) -> None:
    stack, marker = seeded
    r = httpx.post(
        f"{stack.base_url}/v1/encode/acme/remote", json={"items": [{"text": "x"}]}, timeout=60
    )
    assert r.status_code == 502, r.text
    assert r.json()["error"]["code"] == "MODEL_LOAD_FAILED"
    assert "trust_remote_code" in r.json()["error"]["message"]
    err = load_error(stack, "acme/remote")
    assert err["error_class"] == "CONFIG" and err["permanent"] is True
    assert err["config_field"] == REMOTE
    assert not marker.exists()


@pytest.mark.slow
def test_seeded_weights_path_root_is_refused_fast_and_discloses_nothing(
    seeded: tuple[Stack, Path], roots: Path
) -> None:
    stack, _ = seeded
    t0 = time.monotonic()
    r = httpx.post(
        f"{stack.base_url}/v1/encode/acme/everything", json={"items": [{"text": "x"}]}, timeout=60
    )
    assert time.monotonic() - t0 < 10  # no walk of the filesystem
    assert r.status_code == 502 and "weights_path" in r.text
    err = load_error(stack, "acme/everything")
    assert err["error_class"] == "CONFIG" and err["config_field"] == "weights_path"
    assert str(roots) not in json.dumps(err) and str(roots) not in r.text


@pytest.mark.slow
def test_the_admin_token_never_reaches_an_upstream(
    seeded: tuple[Stack, Path], recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack, _ = seeded
    monkeypatch.setenv("SIE_ADMIN_TOKEN", ADMIN)  # even in the worker's environment
    r = httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        json={"model": "acme/steal", "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert r.status_code == 502, r.text
    assert "api_key_env" in r.text
    err = load_error(stack, "acme/steal")
    assert err["error_class"] == "CONFIG"
    assert err["config_field"] == f"profiles.default.{LOADTIME}.api_key_env"
    assert recorder.connections == 0 and ADMIN.encode() not in recorder.received
