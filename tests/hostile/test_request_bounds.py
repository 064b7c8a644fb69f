"""Hostile request bodies and connections against one in-process SIE (every role, real
hypercorn on loopback): nesting, charsets, surrogates, the process-wide body budget,
header and body deadlines, and the work-stream pending bound (docs/security.md)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import msgpack
import pytest

from sie.core.subjects import stream_name
from tests.conftest import MINILM, Stack, run_stack

pytestmark = pytest.mark.slow

ENCODE = f"/v1/encode/{MINILM}"
ONE = {"items": [{"text": "still serving"}]}


@pytest.fixture(scope="module")
def bounded() -> Iterator[Stack]:
    """All roles with small limits, so each one is reached cheaply."""
    with run_stack(
        preload=(MINILM,),
        http_header_timeout_s=1.0,
        http_body_timeout_s=1.5,
    ) as s:
        yield s


@pytest.fixture(scope="module")
def client(bounded: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=bounded.base_url, timeout=30) as c:
        yield c


def _served(client: httpx.Client) -> None:
    r = client.post(ENCODE, json=ONE)
    assert r.status_code == 200, r.text
    assert len(r.json()["items"][0]["dense"]["values"]) == 384


def _timed(fn):  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


# -- finding 1: nesting bombs -------------------------------------------------------------


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/v1/generate/m"])
def test_a_million_nested_brackets_is_a_fast_400(client: httpx.Client, route: str) -> None:
    body = b'{"model":"m","messages":' + b"[" * 1_000_000 + b"]" * 1_000_000 + b"}"
    r, took = _timed(lambda: client.post(route, content=body))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "body" and "nested deeper than 64" in err["message"]
    assert took < 1.0
    _served(client)


@pytest.mark.parametrize("route", [ENCODE, f"/v1/score/{MINILM}", "/v1/embeddings"])
def test_deep_json_and_msgpack_bodies_are_400(client: httpx.Client, route: str) -> None:
    deep_json = b'{"items":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    r = client.post(route, content=deep_json)
    assert r.status_code == 400, r.text
    # 65 levels: past SIE's bound, far below the decoders' own
    value: object = "x"
    for _ in range(65):
        value = [value]
    for content, ctype in (
        (json.dumps({"items": [{"text": "x", "metadata": {"a": value}}]}).encode(), "json"),
        (msgpack.packb({"items": [{"text": "x", "metadata": {"a": value}}]}), "msgpack"),
        (b"\x91" * 1_000_000 + b"\xc0", "msgpack"),
    ):
        r = client.post(route, content=content, headers={"content-type": f"application/{ctype}"})
        assert r.status_code == 400, (ctype, r.text)
        body = r.json()
        detail = body["detail"] if "detail" in body else body["error"]
        assert "body" in (detail.get("field"), detail.get("param"))
    _served(client)


# -- finding 2: charsets ------------------------------------------------------------------


@pytest.mark.parametrize("charset", ["punycode", "utf-7", "idna", "latin-1", "utf-16", "rot13"])
def test_a_charset_other_than_utf8_is_a_fast_415(
    bounded: Stack, client: httpx.Client, charset: str
) -> None:
    body = b'{"items":[{"text":"' + b"a" * 1_000_000 + b'"}]}'
    headers = {"content-type": f"application/json; charset={charset}"}
    # the answer comes before the body is read, let alone decoded: time it from a raw
    # socket that has sent the headers and a first slice only
    took = []
    for _ in range(3):
        sock = _raw(bounded)
        head = (
            f"POST {ENCODE} HTTP/1.1\r\nHost: x\r\nContent-Type: {headers['content-type']}"
            f"\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        t = time.perf_counter()
        sock.sendall(head.encode() + body[:65536])
        reply = _read_response(sock)
        took.append(time.perf_counter() - t)
        assert reply.startswith(b"HTTP/1.1 415"), reply[:200]
        sock.sendall(body[65536:])  # the rest is read and dropped: no reset
        sock.close()
    assert min(took) < 0.010, took
    # a client that sends the whole body first still receives the answer
    for route, envelope in ((ENCODE, "detail"), ("/v1/chat/completions", "error")):
        r = client.post(route, content=body, headers=headers)
        assert r.status_code == 415, r.text
        code = r.json()[envelope]["code"]
        assert code.upper() == "UNSUPPORTED_MEDIA_TYPE"
    assert r.json()["error"]["param"] == "content-type"
    # the config listener's resolve route goes through the same check (read token only)
    config = f"http://127.0.0.1:{bounded.running.config_port}"
    r = httpx.post(f"{config}/v1/configs/resolve", content=body, headers=headers, timeout=10)
    assert r.status_code == 415, r.text
    _served(client)


# -- finding 6: a lone surrogate in a chat message ------------------------------------------


def test_a_lone_surrogate_in_a_chat_message_is_400_naming_the_field(client: httpx.Client) -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"\\udc00"}]}'
    r = client.post("/v1/chat/completions", content=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages"
    body = b'{"model":"m","prompt":"\\udc00 unpaired"}'
    r = client.post("/v1/completions", content=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


# -- finding 8: a process-wide budget of body bytes -----------------------------------------


def _raw(bounded: Stack) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", bounded.running.gateway_port), timeout=10)
    return sock


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


@pytest.fixture(scope="module")
def budgeted() -> Iterator[Stack]:
    with run_stack(preload=(MINILM,), max_inflight_body_bytes=1_000_000) as s:
        yield s


def test_body_bytes_in_flight_are_bounded_by_the_budget(budgeted: Stack) -> None:
    """Budget 1,000,000 bytes: a slow upload holding 700 kB leaves room for small
    requests only; a 400 kB body gets 503 RESOURCE_EXHAUSTED with Retry-After, before
    it is read (declared) or as it arrives (chunked), and fits again once the first
    upload ends."""
    budget = budgeted.running.apps["gateway"].state.body_budget
    hog = _raw(budgeted)
    head = (
        f"POST {ENCODE} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 750000\r\n\r\n"
    )
    hog.sendall(head.encode() + b'{"items":[{"text":"' + b"a" * 700_000)
    deadline = time.monotonic() + 10
    while budget.in_flight_bytes < 700_000 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert budget.in_flight_bytes >= 700_000
    big = json.dumps({"items": [{"text": "b" * 400_000}]}).encode()
    with httpx.Client(base_url=budgeted.base_url, timeout=60) as client:
        r = client.post(ENCODE, content=big)
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == "5"
        assert r.json()["error"]["code"] == "RESOURCE_EXHAUSTED"  # the SDK's retry envelope

        def chunks() -> Iterator[bytes]:
            yield big[:200_000]
            yield big[200_000:]

        r = client.post(ENCODE, content=chunks())  # no Content-Length: charged on arrival
        assert r.status_code == 503 and r.json()["error"]["code"] == "RESOURCE_EXHAUSTED"
        r = client.post("/v1/embeddings", content=big)  # the OpenAI envelope
        assert r.status_code == 503 and r.json()["error"]["code"] == "resource_exhausted"
        _served(client)  # small requests still fit
        hog.close()
        deadline = time.monotonic() + 10
        while budget.in_flight_bytes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert budget.in_flight_bytes == 0
        r = client.post(ENCODE, content=big)
        assert r.status_code == 200, r.text
    assert budget.refused >= 3


# -- finding 10: header and body deadlines -------------------------------------------------


def test_a_half_sent_request_line_is_closed_at_the_header_deadline(bounded: Stack) -> None:
    sock = _raw(bounded)
    sock.sendall(b"POST /v1/encode/x HT")  # never finished
    t = time.monotonic()
    sock.settimeout(10)
    assert sock.recv(1024) == b""  # closed by the server
    assert time.monotonic() - t < 5
    sock.close()
    sock = _raw(bounded)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # headers never end
    assert sock.recv(1024) == b""
    sock.close()


def test_a_half_sent_body_gets_408_at_the_body_deadline(
    bounded: Stack, client: httpx.Client
) -> None:
    sock = _raw(bounded)
    head = f"POST {ENCODE} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
    sock.sendall(head.encode() + b'{"items":')
    t = time.monotonic()
    reply = _read_response(sock)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b"request_timeout" in reply.lower()  # X-SIE-Error-Code
    assert time.monotonic() - t < 5
    sock.close()
    assert _limits_idle(bounded)
    _served(client)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_client_that_leaves_mid_body_is_freed_at_once() -> None:
    """Headers and a few body bytes, then a close: the request is answered (nobody reads
    it) and the connection freed at once, not after the drain bound (5 s)."""
    with run_stack(http_body_timeout_s=30.0) as s:
        port = s.running.gateway_port
        base = _open_fds()
        head = "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(head.encode() + b'{"mo')
        t = time.monotonic()
        while _open_fds() > base and time.monotonic() - t < 10:
            time.sleep(0.02)
        assert _open_fds() <= base
        assert time.monotonic() - t < 2.5  # each waited 5 s before
        r = httpx.get(f"http://127.0.0.1:{port}/healthz")
        assert r.status_code == 200


def test_trickling_large_bodies_do_not_hold_back_other_large_uploads() -> None:
    """Two senders (as many as the large-body slots) pass 1 MiB of a 3 MiB body and then
    trickle a byte every 0.3 s: a 2 MiB upload behind them is read within seconds, not
    at their 30 s body deadline (each gives its slot up after a slow window)."""
    with run_stack(http_body_timeout_s=30.0, max_large_body_reads=2) as s:
        port = s.running.gateway_port
        head = "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n"
        stop = threading.Event()

        def trickle() -> None:
            with socket.create_connection(("127.0.0.1", port), timeout=40) as sock:
                sock.sendall(head.format(3 << 20).encode() + b"[" + b" " * (1100 * 1024))
                while not stop.wait(0.3):
                    sock.sendall(b" ")

        senders = [threading.Thread(target=trickle) for _ in range(2)]
        for t in senders:
            t.start()
        try:
            time.sleep(1.0)  # both past 1 MiB: each holds a slot
            body = json.dumps({"model": "nope/none", "input": ["x" * 1000] * 2100}).encode()
            t0 = time.monotonic()
            r = httpx.post(f"http://127.0.0.1:{port}/v1/embeddings", content=body, timeout=40)
            took = time.monotonic() - t0
        finally:
            stop.set()
            for t in senders:
                t.join()
        assert r.status_code == 404, r.text  # read whole, then the unknown model
        assert took < 6.0, took  # about 30 s before


def _limits_idle(stack: Stack) -> bool:
    budget = stack.running.apps["gateway"].state.body_budget
    deadline = time.monotonic() + 5
    while budget.in_flight_bytes and time.monotonic() < deadline:
        time.sleep(0.01)
    return budget.in_flight_bytes == 0


# -- finding 7 (part): the stream's pending limit is never exceeded ------------------------


def test_concurrent_requests_never_overshoot_the_stream_pending_limit() -> None:
    """16 concurrent 1,000-item requests against a limit of 5,000 pending items, with
    nothing consuming (a gateway in its start-up grace): exactly five are admitted,
    the rest get 503 QUEUE_FULL, and the stream never holds more than 5,000."""
    body = {"items": [{"text": f"t{i}"} for i in range(1000)]}
    with run_stack(
        roles=("gateway",),
        max_stream_pending=5000,
        request_timeout_s=3,
        heartbeat_interval_s=20,
    ) as s:
        statuses: list[int] = []
        peak = [0]
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                try:
                    info = s.portal.call(s.running.bus.stream_info, stream_name("default"))
                    peak[0] = max(peak[0], info.messages)
                except Exception:
                    pass
                time.sleep(0.005)

        def post() -> None:
            r = httpx.post(s.base_url + ENCODE, json=body, timeout=30)
            statuses.append(r.status_code)

        watcher = threading.Thread(target=watch)
        watcher.start()
        threads = [threading.Thread(target=post) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        watcher.join()
        final = s.portal.call(s.running.bus.stream_info, stream_name("default")).messages
    assert sorted(statuses) == [503] * 11 + [504] * 5, statuses
    assert max(peak[0], final) <= 5000


# -- keep-alive after early answers -------------------------------------------------------
# Hypercorn queues at most ``max_app_queue_size`` (2) events per request for the app and
# queues ``http.disconnect`` behind them when the stream closes: an answer given without
# reading the body used to leave that put waiting forever, so the next request on the
# connection was never read (found by the fuzzer's token-auth part).


@pytest.fixture(scope="module")
def secured() -> Iterator[Stack]:
    with run_stack(
        roles=("gateway", "config"), auth_mode="token", auth_token="user", admin_token="admin"
    ) as s:
        yield s


def _exchange(sock: socket.socket, request: bytes, timeout_s: float = 5.0) -> bytes:
    """Send one request on ``sock`` and read one whole response (Content-Length)."""
    sock.settimeout(timeout_s)
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data[:200]!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside a response"
        rest += chunk
    return head


def _post(path: str, body: bytes, headers: str = "", ctype: str = "application/json") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\n{headers}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _chunked(path: str, parts: list[bytes], headers: str = "") -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode() + body


@pytest.mark.parametrize("port", ["gateway", "config"])
@pytest.mark.parametrize(
    ("case", "status"),
    [
        ("no-token", b"401"),
        ("no-token-chunked", b"401"),
        ("bad-charset", b"415"),
        ("unread-body", b"200"),
    ],
)
def test_the_next_request_on_a_connection_is_served_after_an_early_answer(
    secured: Stack, port: str, case: str, status: bytes
) -> None:
    """Three requests whose bodies the server never reads, then a normal one, all on
    one connection: each is answered within 5 s."""
    num = secured.running.gateway_port if port == "gateway" else secured.running.config_port
    path = ENCODE if port == "gateway" else "/v1/configs/models"
    body = json.dumps(ONE).encode()
    auth = "Authorization: Bearer admin\r\n"
    early = {
        "no-token": _post(path, body),
        "no-token-chunked": _chunked(path, [b"{", *(b" " for _ in range(40)), b"}"]),
        "bad-charset": _post(path, body, auth, ctype="application/json; charset=utf-7"),
        "unread-body": (  # a GET route ignores the body it was sent
            f"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body,
    }[case]
    with socket.create_connection(("127.0.0.1", num), timeout=10) as sock:
        for _ in range(3):
            head = _exchange(sock, early)
            assert head.split(b" ")[1] == status, head[:300]
        head = _exchange(sock, f"GET /healthz HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
        assert head.startswith(b"HTTP/1.1 200"), head[:300]


def test_an_early_answer_to_a_body_too_big_to_drain_closes_the_connection(
    secured: Stack,
) -> None:
    """A 64 MiB body declared without a token: the 401 comes before the body is read,
    and the server then closes the connection instead of reading the rest or
    leaving it open (bounded: nothing is held for that client)."""
    with socket.create_connection(("127.0.0.1", secured.running.gateway_port)) as sock:
        head = (
            f"POST {ENCODE} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {64 * 1024 * 1024}\r\n\r\n"
        ).encode()
        sock.settimeout(10)
        sock.sendall(head + b"[" * 65536)
        started = time.monotonic()
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        assert data.startswith(b"HTTP/1.1 401"), data[:300]
        assert time.monotonic() - started < 5


def test_a_body_larger_than_the_whole_budget_is_413_not_a_retry(budgeted: Stack) -> None:
    """Declared bigger than every body the process may hold at once: it can never fit,
    so 413 ``PAYLOAD_TOO_LARGE`` (no Retry-After) before the body is read."""
    with socket.create_connection(("127.0.0.1", budgeted.running.gateway_port)) as sock:
        sock.settimeout(10)
        head = (
            f"POST {ENCODE} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 2000000\r\n\r\n"
        ).encode()
        started = time.monotonic()
        sock.sendall(head)
        reply = _read_response(sock)
        assert reply.startswith(b"HTTP/1.1 413"), reply[:300]
        assert b"payload_too_large" in reply.lower() and b"retry-after" not in reply.lower()
        assert time.monotonic() - started < 5


def test_transfer_encoding_with_content_length_is_refused_and_the_connection_closed(
    bounded: Stack, client: httpx.Client
) -> None:
    """Both framings on one request (the request-smuggling shape): 400 naming the field,
    ``Connection: close``, and the server ends the connection after the answer, so
    nothing after it on the socket is read as a request."""
    body = json.dumps(ONE).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    smuggled = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    request = (
        f"POST {ENCODE} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(chunked)}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    port = bounded.running.gateway_port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.settimeout(5)
        sock.sendall(request + chunked + smuggled)
        data = b""
        while chunk := sock.recv(65536):  # read until the server closes
            data += chunk
    assert data.startswith(b"HTTP/1.1 400"), data[:300]
    assert data.count(b"HTTP/1.1 ") == 1  # the smuggled request was never answered
    head, _, rest = data.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    detail = json.loads(rest)["detail"]  # the native envelope (docs/api.md §1)
    assert detail["code"] == "INVALID_INPUT" and detail["field"] == "content-length"
    _served(client)


def test_both_framings_with_a_body_that_never_ends_are_answered_at_once(bounded: Stack) -> None:
    """A chunked body left unfinished still gets its 400 at once; the connection then
    ends within the early answer's drain bound (5 s at most), not the idle timeout."""
    request = (
        f"POST {ENCODE} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        'Content-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"ite'
    ).encode()
    port = bounded.running.gateway_port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.settimeout(10)
        t0 = time.perf_counter()
        sock.sendall(request)
        data = sock.recv(65536)
        answered = time.perf_counter() - t0
        while chunk := sock.recv(65536):
            data += chunk
        closed = time.perf_counter() - t0
    assert data.startswith(b"HTTP/1.1 400"), data[:300]
    assert answered < 1.0 and closed < 7.0, (answered, closed)
