"""``sie.http.server.serve_app`` over real sockets: a sized response's head and body
leave in one write, a streamed response's head leaves at once (docs/performance.md
"One write per response"); a connection whose client left while requests it had
pipelined waited is freed, and so is one whose client has sent its end, without
waiting for the keep-alive timer (docs/security.md "Limits")."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from sie.http import server
from sie.http.server import serve_app

pytestmark = pytest.mark.anyio

#: What the app does between starting its response and sending the body (s): long
#: enough that two writes would reach the client as two reads.
GAP_S = 0.3

#: The server's idle (keep-alive) timeout in these tests (s).
IDLE_S = 1.0

#: ``/big``'s body (bytes), and the send timeout of the server that serves it (s).
BIG_BYTES = 16 * 1024 * 1024
SEND_S = 1.0


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/sized``: a content-length response whose body follows ``GAP_S`` after its
    start; ``/stream``: a chunked one whose first chunk waits for ``/go``; ``/empty``:
    204; ``/broken``: starts a sized response and fails before its body."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    path = scope["path"]
    if path == "/big":  # an answer far larger than the socket buffers
        body = b"x" * BIG_BYTES
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    if path == "/slow":  # reads its body, answers after a while: the client may be gone
        app.slow += 1  # type: ignore[attr-defined]
        while (await receive()).get("more_body"):
            pass
        await anyio.sleep(0.2)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x" * 100_000})
        return
    if path == "/go":
        app.go.set()  # type: ignore[attr-defined]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/empty":
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    sized = path in ("/sized", "/broken")
    headers = [(b"content-length", b"5")] if sized else []
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    if path == "/broken":
        raise RuntimeError("the app failed after starting its response")
    if sized:
        await anyio.sleep(GAP_S)
    else:
        await app.go.wait()  # type: ignore[attr-defined]
    await send({"type": "http.response.body", "body": b"hello"})


@pytest.fixture
async def port() -> AsyncIterator[int]:
    app.go = anyio.Event()  # type: ignore[attr-defined]
    app.slow = 0  # type: ignore[attr-defined]
    shutdown = anyio.Event()
    async with anyio.create_task_group() as tg:
        # a short idle timeout: a closed connection's last tasks end within it
        serve = functools.partial(serve_app, header_timeout_s=IDLE_S)
        bound = await tg.start(serve, app, "127.0.0.1", 0, shutdown)
        yield bound
        shutdown.set()


def _request(port: int, path: str, method: str = "GET") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    return sock


async def _first_read(sock: socket.socket) -> bytes:
    return await anyio.to_thread.run_sync(sock.recv, 65536)


async def test_a_sized_responses_head_and_body_arrive_in_one_read(port: int) -> None:
    sock = _request(port, "/sized")
    with sock:
        first = await _first_read(sock)
    assert first.startswith(b"HTTP/1.1 200")
    assert first.endswith(b"\r\n\r\nhello")  # not the head alone, GAP_S before the body


async def test_a_streamed_responses_head_arrives_before_its_body(port: int) -> None:
    sock = _request(port, "/stream")
    with sock:
        first = await _first_read(sock)  # the body waits for /go: only the head is out
        assert first.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in first.lower()
        assert first.endswith(b"\r\n\r\n")
        _request(port, "/go").close()
        rest = await _first_read(sock)
    assert b"hello" in rest


async def test_empty_and_head_responses_still_send_their_head(port: int) -> None:
    for path, method, status in (("/empty", "GET", b"204"), ("/sized", "HEAD", b"200")):
        sock = _request(port, path, method)
        with sock:
            first = await _first_read(sock)
        assert first.startswith(b"HTTP/1.1 " + status) and first.endswith(b"\r\n\r\n")


async def test_a_response_that_fails_after_its_start_closes_the_connection(port: int) -> None:
    sock = _request(port, "/broken")
    with sock:
        got = b""
        with anyio.fail_after(5):
            while chunk := await _first_read(sock):  # ends: the server closes it
                got += chunk
    assert b"hello" not in got  # no body was sent; the client is not left waiting
    sock = _request(port, "/sized")  # and the server goes on serving
    with sock:
        assert (await _first_read(sock)).endswith(b"hello")


def _connections() -> int:
    """Connections hypercorn is serving in this process (one task each)."""
    return sum(
        1 for t in asyncio.all_tasks() if t.get_coro().__qualname__.endswith("_server_callback")
    )


@pytest.mark.parametrize("reset", [False, True], ids=["close", "reset"])
async def test_a_client_that_leaves_with_requests_pipelined_is_freed(
    port: int, reset: bool
) -> None:
    """Ten requests in one write, then a close: the connection's reader parks on the
    second while the first is answered, and must not stay parked once the client is
    gone; the requests nobody will read are not all run."""
    body = b"x" * 1000
    head = f"POST /slow HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n"
    for _ in range(4):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall((head.encode() + body) * 10)
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    for _ in range(int(IDLE_S * 20) + 100):  # each connection ends (its idle timeout)
        if _connections() == 0:
            break
        await anyio.sleep(0.05)
    assert _connections() == 0
    assert app.slow < 40  # type: ignore[attr-defined]  # not every request ran
    sock = _request(port, "/sized")  # the server goes on serving
    with sock:
        assert (await _first_read(sock)).endswith(b"hello")


@pytest.fixture
async def long_idle_port() -> AsyncIterator[int]:
    """A server whose keep-alive timer (30 s) outlasts the test: what closes a
    connection here is the server noticing that its client has left."""
    app.go = anyio.Event()  # type: ignore[attr-defined]
    shutdown = anyio.Event()
    async with anyio.create_task_group() as tg:
        serve = functools.partial(serve_app, header_timeout_s=30.0)
        yield await tg.start(serve, app, "127.0.0.1", 0, shutdown)
        shutdown.set()


async def _until_no_connections(seconds: float) -> int:
    """Connections left once none is, or after ``seconds``."""
    for _ in range(int(seconds / 0.02)):  # no event to wait on: hypercorn's own tasks
        if not _connections():
            break
        await anyio.sleep(0.02)
    return _connections()


async def test_a_client_that_connects_and_leaves_is_freed_at_once(long_idle_port: int) -> None:
    """50 connections opened and closed without a byte, and 50 closed after reading
    their answer: none waits for the keep-alive timer (a client doing this in a loop
    would otherwise hold a descriptor per connection for 30 s)."""
    socks = [socket.create_connection(("127.0.0.1", long_idle_port)) for _ in range(50)]
    answered = [_request(long_idle_port, "/empty") for _ in range(50)]
    for sock in answered:
        assert (await _first_read(sock)).startswith(b"HTTP/1.1 204")
    await anyio.sleep(0.2)
    assert _connections() == 100
    for sock in socks + answered:
        sock.close()
    assert await _until_no_connections(3.0) == 0


async def test_a_half_closed_client_gets_its_answer_and_then_the_end(long_idle_port: int) -> None:
    """A request followed by the client's end of the stream (``shutdown(SHUT_WR)``) is
    answered, and the server closes the connection right after the answer."""
    sock = _request(long_idle_port, "/sized")
    sock.shutdown(socket.SHUT_WR)
    got = b""
    with sock, anyio.fail_after(3):  # the server's close ends the loop, not its timer
        while chunk := await _first_read(sock):
            got += chunk
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"hello")
    assert await _until_no_connections(3.0) == 0


def _h2_partial_headers() -> bytes:
    """The HTTP/2 preface, a SETTINGS frame and a HEADERS frame without END_HEADERS:
    a request whose header block never ends (the CONTINUATION never comes)."""
    import h2.config
    import h2.connection

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    opening = conn.data_to_send()
    conn.send_headers(
        1, [(":method", "POST"), (":path", "/sized"), (":scheme", "http"), (":authority", "t")]
    )
    frame = bytearray(conn.data_to_send())
    assert frame[3] == 0x1 and frame[4] & 0x4  # a HEADERS frame with END_HEADERS
    frame[4] &= ~0x4  # the frame head: length (3 bytes), type, flags, stream id
    return opening + bytes(frame)


@pytest.mark.parametrize(
    "sent",
    [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", _h2_partial_headers()],
    ids=["preface", "unfinished-headers"],
)
async def test_an_idle_http2_connection_is_closed_by_the_idle_timer(port: int, sent: bytes) -> None:
    """HTTP/2 in cleartext (prior knowledge) with no stream ever opened: closed after
    the idle timeout like an HTTP/1.1 connection that sent nothing whole."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=IDLE_S + 5)
    with sock, anyio.fail_after(IDLE_S + 4):  # hypercorn left it open for good
        sock.sendall(sent)
        while await _first_read(sock):  # the server's SETTINGS, then its close
            pass
    assert await _until_no_connections(2.0) == 0


@pytest.fixture
async def send_port() -> AsyncIterator[int]:
    """A server whose clients must take an answer within ``SEND_S``."""
    shutdown = anyio.Event()
    async with anyio.create_task_group() as tg:
        serve = functools.partial(serve_app, header_timeout_s=30.0, send_timeout_s=SEND_S)
        yield await tg.start(serve, app, "127.0.0.1", 0, shutdown)
        shutdown.set()


def _slow_reader(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # takes little unread
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n")
    return sock


async def test_a_client_that_does_not_read_its_answer_is_cut_off(
    send_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four clients ask for a 16 MiB answer and read nothing: each connection is aborted
    about ``SEND_S`` (plus the answer's size at the least rate) after the answer was
    written (its buffer goes with it), and a client that then reads gets only part of
    the answer."""
    monkeypatch.setattr(server, "MIN_SEND_BYTES_PER_S", 64 << 20)  # 16 MiB: 0.25 s more
    socks = [_slow_reader(send_port) for _ in range(4)]
    await anyio.sleep(0.3)
    assert _connections() == 4
    assert await _until_no_connections(SEND_S + 3) == 0  # not when the client reads
    for sock in socks:
        with sock:
            got = 0
            with contextlib.suppress(ConnectionResetError):
                while chunk := await _first_read(sock):
                    got += len(chunk)
            assert got < BIG_BYTES


async def test_a_client_that_reads_its_answer_in_time_gets_all_of_it(send_port: int) -> None:
    """The deadline is for the whole buffered answer, not the request: a client that
    reads promptly gets every byte however large."""
    sock = _slow_reader(send_port)
    got = b""
    with sock, anyio.fail_after(10):
        while len(got) < BIG_BYTES + 40:
            chunk = await _first_read(sock)
            if not chunk:
                break
            got += chunk
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"x" * 1000)
    assert len(got.partition(b"\r\n\r\n")[2]) == BIG_BYTES


async def test_a_shutdown_does_not_wait_on_a_client_that_does_not_read() -> None:
    """A client that never reads its 16 MiB answer does not hold the shutdown past its
    drain time, and the server stops cleanly (hypercorn waited for the close that
    waits for the buffer to be taken, then failed when cancelled)."""
    shutdown = anyio.Event()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            serve = functools.partial(
                serve_app, header_timeout_s=30.0, send_timeout_s=60.0, graceful_timeout_s=1.0
            )
            port = await tg.start(serve, app, "127.0.0.1", 0, shutdown)
            sock = _slow_reader(port)
            await anyio.sleep(0.5)  # the answer is written, mostly still buffered
            assert _connections() == 1
            started = anyio.current_time()
            shutdown.set()
        assert anyio.current_time() - started < 4.0  # the drain time (1 s), not 60 s
    sock.close()


async def test_an_http2_request_whose_client_leaves_mid_body_is_freed(port: int) -> None:
    """HTTP/2: a request's headers and part of its body, then a close. The app sees the
    client leave and answers anyway (``/slow`` writes 100 KB); the answer has nowhere
    to go, and must not hold the request and the connection for good."""
    import h2.config
    import h2.connection

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(
        1, [(":method", "POST"), (":path", "/slow"), (":scheme", "http"), (":authority", "t")]
    )
    conn.send_data(1, b'{"a": ')  # no END_STREAM: the body never ends
    before = app.slow  # type: ignore[attr-defined]
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(conn.data_to_send())
    await anyio.sleep(0.3)
    sock.close()
    assert await _until_no_connections(3.0) == 0  # hypercorn held it until shutdown
    assert app.slow == before + 1  # type: ignore[attr-defined]  # the app did run
