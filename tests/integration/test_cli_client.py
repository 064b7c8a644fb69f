"""The ``sie`` client commands (docs/sdk.md "Command line") run as subprocesses
against a live stack: ``--json`` output parsed, the human tables read, exit codes
and the server's auth variables."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import MINILM, Stack, run_stack, wait_for
from tests.natsserver import free_port

pytestmark = pytest.mark.slow


def sie_bin() -> str:
    exe = Path(sys.executable).with_name("sie")
    return str(exe) if exe.exists() else "sie"


def sie(stack: Stack | None, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``sie ARGS`` with only the ``SIE_*`` variables given (the gateway's URL by
    ``SIE_GATEWAY_URL`` unless ``--url`` is among the args)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SIE_")}
    if stack is not None:
        base["SIE_GATEWAY_URL"] = stack.base_url
        base["SIE_CONFIG_SERVICE_URL"] = f"http://127.0.0.1:{stack.running.config_port}"
    return subprocess.run(
        [sie_bin(), *args], env={**base, **env}, capture_output=True, text=True, timeout=60
    )


def rows(table: str) -> list[list[str]]:
    """A human table's data rows, split on runs of two or more spaces."""
    lines = table.strip().splitlines()
    assert set(lines[1].replace(" ", "")) == {"-"}, table  # the rule under the header
    return [re.split(r"\s{2,}", line.strip()) for line in lines[2:]]


def test_models_as_json_and_as_a_table(stack: Stack) -> None:
    out = sie(stack, "models", "--json")
    assert out.returncode == 0, out.stderr
    models = {m["name"]: m for m in json.loads(out.stdout)}
    assert models[MINILM]["state"] == "loaded" and "dense" in models[MINILM]["outputs"]
    table = sie(stack, "models").stdout
    assert table.split()[:4] == ["MODEL", "STATE", "OUTPUTS", "POOL"]
    assert [MINILM, "loaded", "dense,multivector,score", "default"] in rows(table)


def test_encode_prints_the_model_vectors(stack: Stack, st_model: Any) -> None:
    texts = ["hello world", "the command line"]
    out = sie(stack, "encode", MINILM, *texts, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    got = np.array([it["dense"] for it in doc["items"]], dtype=np.float32)
    np.testing.assert_allclose(got, st_model.encode(texts), atol=1e-5)
    table = sie(stack, "encode", MINILM, "hello world", "--output-type", "multivector").stdout
    (row,) = rows(table)
    assert row[:5] == ["0", "hello world", "multivector", "4x384", "float32"]


def test_score_ranks_best_first(stack: Stack) -> None:
    docs = ["The stock market fell sharply.", "Knead the dough, then bake the loaf."]
    out = sie(stack, "score", MINILM, "how do I bake bread", *docs)
    assert out.returncode == 0, out.stderr
    ranked = rows(out.stdout)
    assert [(r[0], r[2]) for r in ranked] == [("1", "1"), ("2", "0")]
    assert float(ranked[0][1]) > float(ranked[1][1])
    doc = json.loads(sie(stack, "score", MINILM, "bread", *docs, "--json", "--top-k", "1").stdout)
    assert [s["item_id"] for s in doc["scores"]] == ["1"]


@pytest.fixture
def own_stack() -> Iterator[Stack]:
    """A stack of its own: the config written here must not show in the shared stack's
    model list (tests/integration/test_encode_http.py lists it exactly)."""
    with run_stack() as s:
        yield s


def test_config_apply_then_status(own_stack: Stack, tmp_path: Path) -> None:
    stack = own_stack
    path = tmp_path / "profile.yaml"
    path.write_text(
        f"sie_id: {MINILM}\nprofiles:\n  clitest:\n    extends: default\n    max_batch_tokens: 256\n"
    )
    out = sie(stack, "config", "apply", str(path), "--json")
    assert out.returncode == 0, out.stderr
    written = json.loads(out.stdout)
    assert written["created_profiles"] == ["clitest"]
    again = sie(stack, "config", "apply", str(path))  # unchanged: a no-op, shown as a table
    assert ["already there", "clitest"] in rows(again.stdout)
    status = wait_for(
        lambda: (
            (s := json.loads(sie(stack, "config", "status", MINILM, "--json").stdout))[
                "config_epoch"
            ]
            >= written["epoch"]
            and s
        ),
        timeout_s=15,
    )
    assert status["model_id"] == MINILM
    table = sie(stack, "config", "status", MINILM).stdout
    assert table.startswith(f"{MINILM}: config epoch")
    assert rows(table.split("\n", 1)[1])[0][0] == "default"


def test_pools_create_list_get_delete(stack: Stack) -> None:
    out = sie(stack, "pools", "create", "CliPool", "--gpus", "default=1", "--ttl", "600", "--json")
    assert out.returncode == 0, out.stderr
    spec = json.loads(out.stdout)["spec"]
    assert (spec["name"], spec["gpus"], spec["ttl_seconds"]) == ("clipool", {"default": 1}, 600)
    listed = rows(sie(stack, "pools", "list").stdout)
    assert [r[:3] for r in listed] == [
        ["default", "active", "-"],
        ["clipool", "active", "default=1"],
    ]
    got = json.loads(sie(stack, "pools", "get", "clipool", "--json").stdout)
    assert got["status"]["state"] == "active"
    assert sie(stack, "pools", "delete", "clipool").stdout.strip() == "pool clipool: deleted"
    gone = sie(stack, "pools", "get", "clipool")
    assert gone.returncode == 1 and "404 POOL_NOT_FOUND" in gone.stderr
    refused = sie(stack, "pools", "delete", "default")
    assert refused.returncode == 1 and "403 FORBIDDEN" in refused.stderr


def test_exit_codes(stack: Stack) -> None:
    unknown = sie(stack, "encode", "nobody/nothing", "x")
    assert unknown.returncode == 1 and "404 MODEL_NOT_FOUND" in unknown.stderr
    url = f"http://127.0.0.1:{free_port()}"
    down = sie(None, "models", "--url", url)
    assert down.returncode == 3 and f"cannot reach the server at {url}" in down.stderr
    assert "SIE_GATEWAY_URL" in down.stderr  # how to point it elsewhere
    assert sie(stack, "encode", MINILM).returncode == 2  # no TEXT: usage
    assert sie(None, "version").stdout.strip()  # unchanged


@pytest.fixture(scope="module")
def secured() -> Iterator[Stack]:
    with run_stack(auth_mode="token", auth_token="reader", admin_token="boss") as s:
        yield s


def test_the_server_auth_variables(secured: Stack) -> None:
    denied = sie(secured, "models")
    assert denied.returncode == 1 and "401 UNAUTHORIZED" in denied.stderr
    assert sie(secured, "models", SIE_AUTH_TOKEN="reader").returncode == 0
    assert sie(secured, "models", SIE_AUTH_TOKENS="nope,reader").returncode == 1  # the first
    write = ("pools", "create", "authpool", "--gpus", "default=1")
    refused = sie(secured, *write, SIE_AUTH_TOKEN="reader")
    assert refused.returncode == 1 and "FORBIDDEN" in refused.stderr
    made = sie(secured, *write, SIE_AUTH_TOKEN="reader", SIE_ADMIN_TOKEN="boss")
    assert made.returncode == 0, made.stderr
    gone = sie(secured, "pools", "delete", "authpool", SIE_ADMIN_TOKEN="boss")
    assert gone.returncode == 0
