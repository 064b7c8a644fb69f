"""The SDK's retry contract (docs/sdk.md "Retries") against a small real HTTP server
that answers a scripted sequence, so the exact Retry-After values, codes and timings
are known: Retry-After is honoured and bounded by the call's budget, a 502
``MODEL_LOAD_FAILED`` is never retried, out-of-memory answers are retried
``max_oom_retries`` times, ``wait_for_capacity=False`` gives up at once on capacity
signals, a refused connection is retried only within the budget, streams are retried
only before they open, and a skewed server version warns once. The same signals from
a live stack: tests/integration/test_sdk.py."""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from sie.client import (
    ModelLoadFailedError,
    ResourceExhaustedError,
    ServerError,
    SIEAsyncClient,
    SIEClient,
    SIEConnectionError,
    VersionSkewWarning,
)
from sie.client.wire import pack
from tests.natsserver import free_port

Answer = tuple[int, dict[str, str], bytes]

ENCODED = pack(
    {
        "model": "m/x",
        "items": [
            {"dense": {"dims": 3, "dtype": "float32", "values": np.ones(3, dtype=np.float32)}}
        ],
    }
)
OK: Answer = (200, {"Content-Type": "application/msgpack"}, ENCODED)


def error(status: int, code: str, retry_after: str | None = None, **extra: Any) -> Answer:
    headers = {"Content-Type": "application/json", "X-SIE-Error-Code": code}
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    key = "error" if status >= 500 else "detail"
    return status, headers, json.dumps({key: {"code": code, "message": code, **extra}}).encode()


@dataclass
class Scripted:
    """Answers in order; the last one repeats. ``seen``: (monotonic time, path,
    headers) of every request."""

    answers: list[Answer]
    seen: list[tuple[float, str, dict[str, str]]] = field(default_factory=list)
    url: str = ""

    def gaps(self) -> list[float]:
        times = [t for t, _, _ in self.seen]
        return [b - a for a, b in itertools.pairwise(times)]


@contextmanager
def scripted(*answers: Answer) -> Iterator[Scripted]:
    script = Scripted(list(answers))
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            with lock:
                script.seen.append((time.monotonic(), self.path, dict(self.headers.items())))
                status, headers, body = (
                    script.answers.pop(0) if len(script.answers) > 1 else script.answers[0]
                )
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    script.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield script
    finally:
        server.shutdown()
        server.server_close()


def test_retry_after_is_honoured_until_served() -> None:
    with (
        scripted(error(503, "QUEUE_FULL", "1"), error(503, "MODEL_LOADING", "1"), OK) as srv,
        SIEClient(srv.url) as c,
    ):
        got = c.encode("m/x", "hello")
    assert got["dense"].tolist() == [1.0, 1.0, 1.0]
    assert len(srv.seen) == 3
    assert all(0.9 <= g < 2.5 for g in srv.gaps()), srv.gaps()
    for _, path, headers in srv.seen:
        assert path == "/v1/encode/m/x"
        assert headers["Content-Type"] == "application/msgpack"
        assert headers["Accept"] == "application/msgpack"
        assert headers["X-SIE-SDK-Version"]


@pytest.mark.anyio
async def test_the_async_client_honours_retry_after_too() -> None:
    with scripted(error(503, "GATEWAY_TIMEOUT", "1"), OK) as srv:
        async with SIEAsyncClient(srv.url) as c:
            got = await c.encode("m/x", ["hello"])
    assert got[0]["dense"].shape == (3,) and len(srv.seen) == 2
    assert 0.9 <= srv.gaps()[0] < 2.5


def test_the_budget_bounds_the_retries() -> None:
    with scripted(error(503, "QUEUE_FULL", "1")) as srv, SIEClient(srv.url) as c:
        t0 = time.monotonic()
        with pytest.raises(ServerError) as exc:
            c.score("m/x", "q", ["d"], provision_timeout_s=2.5)
        took = time.monotonic() - t0
    assert exc.value.code == "QUEUE_FULL" and exc.value.status_code == 503
    assert 2.4 <= took < 4, took
    assert len(srv.seen) == 3  # at 0, 1 and 2 s; the budget ran out during the third wait


def test_a_retry_after_longer_than_the_budget_is_cut_short() -> None:
    with scripted(error(503, "SHUTTING_DOWN", "30")) as srv, SIEClient(srv.url) as c:
        t0 = time.monotonic()
        with pytest.raises(ServerError):
            c.extract("m/x", "t", provision_timeout_s=1.0)
        assert time.monotonic() - t0 < 2.5 and len(srv.seen) == 1


def test_model_load_failed_is_never_retried() -> None:
    answer = error(502, "MODEL_LOAD_FAILED", None, error_class="GATED", attempts=2, permanent=True)
    with (
        scripted(answer, OK) as srv,
        SIEClient(srv.url) as c,
        pytest.raises(ModelLoadFailedError) as exc,
    ):
        c.encode("m/x", "a", provision_timeout_s=60)
    assert len(srv.seen) == 1
    assert (exc.value.error_class, exc.value.attempts, exc.value.permanent) == ("GATED", 2, True)


def test_out_of_memory_is_retried_max_oom_retries_times() -> None:
    oom = error(503, "RESOURCE_EXHAUSTED", "0")
    with scripted(oom) as srv, SIEClient(srv.url) as c:
        with pytest.raises(ResourceExhaustedError) as exc:
            c.encode("m/x", "a", max_oom_retries=1)
        assert exc.value.retries == 1 and len(srv.seen) == 2
        with pytest.raises(ResourceExhaustedError):
            c.encode("m/x", "a", max_oom_retries=0)
        assert len(srv.seen) == 3
    with scripted(oom, OK) as srv, SIEClient(srv.url) as c:
        assert c.encode("m/x", "a")["dense"].shape == (3,) and len(srv.seen) == 2


def test_without_wait_for_capacity_a_busy_server_is_not_waited_on() -> None:
    with scripted(error(503, "QUEUE_FULL", "5"), OK) as srv, SIEClient(srv.url) as c:
        with pytest.raises(ServerError) as exc:
            c.encode("m/x", "a", wait_for_capacity=False)
        assert exc.value.code == "QUEUE_FULL" and len(srv.seen) == 1
        # MODEL_LOADING is retried whatever the flag
    with scripted(error(503, "MODEL_LOADING", "1"), OK) as srv, SIEClient(srv.url) as c:
        assert c.encode("m/x", "a", wait_for_capacity=False)["dense"].size == 3


def test_a_refused_connection_is_retried_within_the_budget() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with SIEClient(url) as c:
        t0 = time.monotonic()
        with pytest.raises(SIEConnectionError):
            c.encode("m/x", "a", provision_timeout_s=1.0)
        assert 0.9 <= time.monotonic() - t0 < 2.5
        t0 = time.monotonic()
        with pytest.raises(SIEConnectionError):
            c.encode("m/x", "a", wait_for_capacity=False)
        with pytest.raises(SIEConnectionError):
            c.list_models()  # reads are not retried
        assert time.monotonic() - t0 < 1


def test_a_stream_is_retried_only_before_it_opens() -> None:
    sse = b"".join(
        [
            b": keep-alive\n\n",
            b'data: {"choices": [{"index": 0, "delta": {"content": "Par"}}]}\n\n',
            b'data: {"choices": [{"index": 0, "delta": {"content": "is"}}]}\n\n',
            b"event: error\n",
            b'data: {"error": {"message": "worker gone", "type": "server_error", "code": "worker_lost"}}\n\n',
        ]
    )
    stream: Answer = (200, {"Content-Type": "text/event-stream"}, sse)
    with scripted(error(503, "ENGINE_SATURATED", "1"), stream) as srv, SIEClient(srv.url) as c:
        got = []
        with pytest.raises(ServerError) as exc:
            for chunk in c.chat("llm", [{"role": "user", "content": "hi"}], stream=True):
                got.append(chunk["choices"][0]["delta"]["content"])
        assert got == ["Par", "is"] and exc.value.code == "WORKER_LOST"
        assert len(srv.seen) == 2  # the 503 retried; the broken stream not


def test_a_skewed_server_version_warns_once() -> None:
    skewed = f"9.{uuid.uuid4().int % 1000}.0"  # a version no other test has seen
    answer = (200, {**OK[1], "X-SIE-Server-Version": skewed}, OK[2])
    with scripted(answer) as srv, SIEClient(srv.url) as c:
        with pytest.warns(VersionSkewWarning, match=skewed):
            c.encode("m/x", "a")
        with warnings.catch_warnings():
            warnings.simplefilter("error", VersionSkewWarning)
            c.encode("m/x", "a")  # once per process and version
    near = (200, {**OK[1], "X-SIE-Server-Version": "0.2.0"}, OK[2])
    with scripted(near) as srv, SIEClient(srv.url) as c, warnings.catch_warnings():
        warnings.simplefilter("error", VersionSkewWarning)
        c.encode("m/x", "a")  # within one minor of 0.1.x: no warning


def test_the_api_key_and_routing_headers_are_sent() -> None:
    with scripted(OK) as srv, SIEClient(srv.url, api_key="tok", gpu="acme/l4") as c:
        c.encode("m/x", "a")
        c.encode("m/x", "a", gpu="h100")
    first, second = (h for _, _, h in srv.seen)
    assert first["Authorization"] == "Bearer tok"
    assert (first["X-SIE-Pool"], first["X-SIE-Machine-Profile"]) == ("acme", "l4")
    assert "X-SIE-Pool" not in second and second["X-SIE-Machine-Profile"] == "h100"
