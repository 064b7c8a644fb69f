"""The SDK's pure pieces (docs/sdk.md): the wire codec against msgpack-numpy, the
``gpu`` routing form, error envelopes, the OOM backoff, version skew, the retry policy
on a stepped clock, server-sent events, the client settings and the CLI's tables.
The SDK over real servers: tests/integration/test_sdk.py, test_sdk_retries.py."""

from __future__ import annotations

import json

import msgpack
import msgpack_numpy
import numpy as np
import pytest

from sie.cli_client import render_table
from sie.client import (
    ModelLoadFailedError,
    ProvisioningError,
    RequestError,
    ResourceExhaustedError,
    ServerError,
)
from sie.client.calls import config_url_for, filter_capacity, renew_interval
from sie.client.errors import error_from_response, parse_error_body, retry_after_of
from sie.client.retry import RetryPolicy, oom_backoff
from sie.client.shapes import encode_body, parse_encode, score_body, to_item
from sie.client.sse import DONE, SSEReader
from sie.client.wire import is_skewed, pack, routing_headers, split_gpu, unpack
from sie.settings import ServeSettings, client_settings


def test_arrays_travel_in_msgpack_numpy_form_both_ways() -> None:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    packed = pack({"values": arr, "n": np.int64(3)})
    # msgpack-numpy (what other SIE clients use) reads what the SDK writes ...
    theirs = msgpack.unpackb(packed, object_hook=msgpack_numpy.decode, raw=False)
    np.testing.assert_array_equal(theirs["values"], arr)
    assert theirs["n"] == 3
    # ... and the SDK reads what msgpack-numpy (and the server) writes, bin or str keys
    ours = unpack(msgpack.packb({"v": arr}, default=msgpack_numpy.encode, use_bin_type=True))
    np.testing.assert_array_equal(ours["v"], arr)
    str_keys = {"nd": True, "type": "<i1", "kind": "", "shape": [2], "data": b"\x01\xff"}
    assert unpack(msgpack.packb({"v": str_keys}))["v"].tolist() == [1, -1]
    with pytest.raises(ValueError):
        unpack(b"\xc1")


def test_gpu_names_a_profile_or_a_pool_and_profile() -> None:
    assert split_gpu("l4") == (None, "l4")
    assert split_gpu("acme/l4") == ("acme", "l4")
    assert split_gpu("acme/") == ("acme", None)
    assert split_gpu(None) == split_gpu(" ") == (None, None)
    assert routing_headers("acme/l4") == {"X-SIE-Pool": "acme", "X-SIE-Machine-Profile": "l4"}
    assert routing_headers("l4") == {"X-SIE-Machine-Profile": "l4"}


def test_request_bodies() -> None:
    body = encode_body(
        ["a", {"id": "x", "text": "b"}],
        output_types=["dense"],
        instruction=None,
        output_dtype="int8",
        is_query=True,
        options={"normalize": True},
    )
    assert body == {
        "items": [{"text": "a"}, {"id": "x", "text": "b"}],
        "params": {
            "output_types": ["dense"],
            "output_dtype": "int8",
            "is_query": True,
            "options": {"normalize": True},
        },
    }
    assert "params" not in encode_body(
        ["a"], output_types=None, instruction=None, output_dtype=None, is_query=None, options=None
    )
    assert score_body("q", ["d"], instruction=None, options=None) == {
        "query": {"text": "q"},
        "items": [{"text": "d"}],
    }
    assert to_item({"text": "t", "images": [b"\xff\xd8"]})["images"] == [
        {"data": b"\xff\xd8", "format": "jpeg"}
    ]
    with pytest.raises(TypeError):
        to_item(3)


def test_encode_results_carry_arrays_and_ids() -> None:
    body = {
        "items": [
            {"id": "a", "dense": {"dims": 2, "dtype": "float32", "values": np.ones(2)}},
            {"sparse": {"indices": np.array([3]), "values": np.array([0.5])}},
        ]
    }
    a, b = parse_encode(body, {"total_ms": 1.0})
    assert a["id"] == "a" and a["dense"].tolist() == [1.0, 1.0] and a["timing"]["total_ms"] == 1
    assert "id" not in b and b["sparse"]["indices"].tolist() == [3]
    with pytest.raises(ValueError):
        parse_encode({"nope": 1})


def test_error_envelopes() -> None:
    native_4xx = json.dumps({"detail": {"code": "INVALID_INPUT", "message": "m", "field": "x"}})
    err = error_from_response(400, {}, native_4xx.encode())
    assert isinstance(err, RequestError) and (err.code, err.field) == ("INVALID_INPUT", "x")
    load_failed = {
        "error": {"code": "MODEL_LOAD_FAILED", "message": "m", "error_class": "NOT_FOUND"}
    }
    err = error_from_response(502, {}, json.dumps(load_failed).encode(), model="m/x")
    assert isinstance(err, ModelLoadFailedError)
    assert (err.error_class, err.permanent, err.attempts, err.model) == (
        "NOT_FOUND",
        True,
        1,
        "m/x",
    )
    openai = {"error": {"message": "m", "type": "server_error", "param": None, "code": "x_y"}}
    err = error_from_response(503, {}, json.dumps(openai).encode())
    assert isinstance(err, ServerError) and err.code == "X_Y"
    err = error_from_response(503, {"x-sie-error-code": "PROVISIONING", "retry-after": "60"}, b"")
    assert isinstance(err, ProvisioningError) and err.retry_after == 60
    assert parse_error_body(b"plain text", "text/plain") == {"message": "plain text"}
    assert parse_error_body(pack({"error": {"code": "C"}}), "application/msgpack") == {"code": "C"}
    assert retry_after_of({"retry-after": "-3"}) == 0
    assert retry_after_of({"retry-after": "soon"}) is None


def test_oom_backoff_doubles_to_a_cap() -> None:
    assert [oom_backoff(n, None) for n in range(4)] == [5, 10, 20, 30]
    assert [oom_backoff(n, 2) for n in range(3)] == [2, 10, 20]
    assert oom_backoff(0, 99) == 30 and oom_backoff(0, -1) == 0


def test_version_skew_is_one_minor_within_the_same_major() -> None:
    assert not is_skewed("0.3.1", "0.3.9")
    assert not is_skewed("0.3.1", "0.4.0") and not is_skewed("0.3.1", "0.2.0")
    assert is_skewed("0.1.6", "0.3.0") and is_skewed("0.3.0", "0.1.6")
    assert is_skewed("1.0.0", "0.9.0")
    assert not is_skewed("0.1.0", "") and not is_skewed("0.1.0", "unknown")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def policy(clock: Clock, **kw: object) -> RetryPolicy:
    args: dict[str, object] = {"operation": "encode", "model": "m", "timeout_s": 30.0}
    return RetryPolicy(**{**args, **kw}, clock=clock)  # type: ignore[arg-type]


def test_retry_policy_follows_the_matrix() -> None:
    clock = Clock()
    p = policy(clock, provision_timeout_s=12)
    assert p.attempt_timeout() == 12  # the attempt never outlives the budget
    busy = json.dumps({"error": {"code": "QUEUE_FULL", "message": "busy"}}).encode()
    assert p.after_response(503, {"retry-after": "5"}, busy) == 5
    clock.now = 10
    assert p.after_response(503, {}, busy) == 2  # the default 5 s, capped to what is left
    clock.now = 12
    with pytest.raises(ServerError) as exc:
        p.attempt_timeout()  # spent: the last failure surfaces
    assert exc.value.code == "QUEUE_FULL"
    # no wait: a provisioning answer is raised at once with its hint
    p = policy(Clock(), wait_for_capacity=False)
    with pytest.raises(ProvisioningError) as prov:
        p.after_response(503, {"x-sie-error-code": "PROVISIONING", "retry-after": "60"}, b"")
    assert prov.value.retry_after == 60
    # MODEL_LOADING is retried even without wait; MODEL_LOAD_FAILED never
    loading = json.dumps({"error": {"code": "MODEL_LOADING", "message": "m"}}).encode()
    assert p.after_response(503, {"retry-after": "5"}, loading) == 5
    failed = json.dumps({"error": {"code": "MODEL_LOAD_FAILED", "message": "m"}}).encode()
    with pytest.raises(ModelLoadFailedError):
        policy(Clock()).after_response(502, {}, failed)
    with pytest.raises(RequestError):
        policy(Clock()).after_response(404, {}, b"{}")


def test_out_of_memory_surfaces_as_out_of_memory() -> None:
    clock = Clock()
    oom = json.dumps({"error": {"code": "RESOURCE_EXHAUSTED", "message": "m"}}).encode()
    p = policy(clock, max_oom_retries=2)
    assert p.after_response(503, {}, oom) == 5
    assert p.after_response(503, {}, oom) == 10
    with pytest.raises(ResourceExhaustedError) as exc:
        p.after_response(503, {}, oom)
    assert exc.value.retries == 2
    with pytest.raises(ResourceExhaustedError):
        policy(Clock(), max_oom_retries=0).after_response(503, {}, oom)
    # the next backoff would overrun the budget: OOM, not a provisioning timeout
    with pytest.raises(ResourceExhaustedError):
        policy(Clock(), provision_timeout_s=4).after_response(503, {}, oom)


def test_server_sent_events() -> None:
    r = SSEReader()
    lines = [": keep-alive", "", 'data: {"choices": [1]}', "", "data: [DONE]", ""]
    got = [x for x in (r.feed(line) for line in lines) if x is not None]
    assert got == [{"choices": [1]}, DONE]
    r = SSEReader()
    r.feed("event: error")
    r.feed('data: {"error": {"message": "gone", "code": "worker_lost"}}')
    with pytest.raises(ServerError) as exc:
        r.feed("")
    assert exc.value.code == "WORKER_LOST" and exc.value.message == "gone"


def test_helpers_of_the_calls() -> None:
    assert config_url_for("http://127.0.0.1:28080") == "http://127.0.0.1:28081"
    assert config_url_for("https://sie.example") == "https://sie.example:444"
    assert renew_interval(None) is None and renew_interval(30) == 10 and renew_interval(9999) == 60
    health = {
        "type": "gateway",
        "workers": [
            {"machine_profile": "l4", "ready": True, "models": [{"name": "a", "state": "loaded"}]},
            {"machine_profile": "h100", "ready": False, "models": []},
        ],
        "cluster": {"total_qps": 2.5},
    }
    cap = filter_capacity(health, "acme/l4")
    assert (cap["worker_count"], cap["gpu_count"], cap["models_loaded"]) == (1, 1, 1)
    assert filter_capacity(health, None)["worker_count"] == 2
    with pytest.raises(RequestError) as exc:
        filter_capacity({"status": "ok"}, None)
    assert exc.value.code == "not_gateway"


def test_client_settings_read_the_server_names_only() -> None:
    env = {
        "SIE_GATEWAY_URL": "http://gw:9000",
        "SIE_AUTH_TOKENS": "t1, t2",
        "SIE_ADMIN_TOKEN": "adm",
        "SIE_HOST": "0.0.0.0",  # a server setting that would stop `sie serve` is not read
    }
    s = client_settings(env)
    assert s.gateway_url == "http://gw:9000" and s.config_service_url is None
    assert s.inference_token() == "t1" and s.admin_token_value() == "adm"
    assert (
        client_settings({"SIE_AUTH_TOKEN": "t0", "SIE_AUTH_TOKENS": "t1"}).inference_token() == "t0"
    )
    assert client_settings({}, gateway_url="http://x:1").gateway_url == "http://x:1"


def test_the_config_port_follows_the_gateway_port() -> None:
    """``make run PORT=28080`` (``sie serve --port 28080``) moves the config role to
    28081; an explicit config port wins; port 0 gives both a free port."""
    assert ServeSettings().config_port == 8081
    assert ServeSettings(port=28080).config_port == 28081
    assert ServeSettings.from_env({"SIE_PORT": "9000"}).config_port == 9001
    assert ServeSettings.from_env({"SIE_CONFIG_PORT": "7000"}, port=9000).config_port == 7000
    assert ServeSettings(port=0).config_port == 0 and ServeSettings(port=65535).config_port == 0
    assert ServeSettings(port=9000, config_port=0).config_port == 0


def test_tables_pad_columns() -> None:
    out = render_table(["A", "LONGER"], [("x", 1), ("yyyy", None)])
    assert out.splitlines() == ["A     LONGER", "----  ------", "x     1", "yyyy"]


def test_cli_output_to_a_reader_that_stops_early_ends_quietly() -> None:
    """``sie models | head -1``: the closed pipe drops the rest, no traceback."""
    import subprocess
    import sys

    code = "from sie.cli_client import emit; emit('row\\n' * 200_000); print('more')"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"row\n"
    proc.stdout.close()  # what head does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=30) == 0
    assert "Traceback" not in err and "BrokenPipe" not in err, err
