"""Server logging (sie.logs): the connection-lost write warning is throttled."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sie.logs import (
    CONNECTION_LOST_WRITE,
    DropCancelledConnectionCallbacks,
    Throttle,
    configure_logging,
)


def _record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("asyncio", logging.WARNING, __file__, 1, msg, (), None)


def test_the_lost_write_line_passes_once_per_interval_with_the_count_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    throttle = Throttle(CONNECTION_LOST_WRITE, every_s=60.0)
    monkeypatch.setattr("sie.logs.time.monotonic", lambda: clock[0])
    passed = [throttle.filter(_record(CONNECTION_LOST_WRITE)) for _ in range(500)]
    assert passed.count(True) == 1 and passed[0]
    assert throttle.filter(_record("another warning"))  # other lines are untouched
    clock[0] += 61
    line = _record(CONNECTION_LOST_WRITE)
    assert throttle.filter(line)
    assert line.getMessage() == f"{CONNECTION_LOST_WRITE} (499 more since the last one)"


def test_configure_logging_installs_one_throttle_on_asyncio() -> None:
    asyncio_log = logging.getLogger("asyncio")
    saved = list(asyncio_log.filters), list(logging.getLogger().handlers)
    try:
        configure_logging("INFO")
        configure_logging("INFO")  # configured twice: still one filter
        throttles = [f for f in asyncio_log.filters if isinstance(f, Throttle)]
        assert len(throttles) == 1 and throttles[0].message == CONNECTION_LOST_WRITE
    finally:
        asyncio_log.filters[:] = saved[0]
        logging.getLogger().handlers[:] = saved[1]


def test_the_cancelled_connection_callback_traceback_is_dropped() -> None:
    """Python 3.11 logs a traceback per stream-server connection whose task a shutdown
    cancels; the filter drops exactly those (other errors, and other callbacks, pass)."""
    drop = DropCancelledConnectionCallbacks()

    def record(msg: str, exc: BaseException | None) -> logging.LogRecord:
        info = (type(exc), exc, None) if exc is not None else None
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, (), info)

    callback = (
        "Exception in callback StreamReaderProtocol.connection_made.<locals>.callback(<Task>)"
    )
    assert not drop.filter(record(callback, asyncio.CancelledError()))
    assert drop.filter(record(callback, RuntimeError("real")))
    assert drop.filter(record("Exception in callback other()", asyncio.CancelledError()))
    assert drop.filter(record("unrelated", None))


def test_a_stream_server_whose_connection_task_is_cancelled_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The real thing: a connection handler cancelled mid-connection (what a shutdown's
    deadline does) leaves no ERROR on the asyncio logger once logging is configured."""
    asyncio_log = logging.getLogger("asyncio")
    saved = list(asyncio_log.filters), list(logging.getLogger().handlers)
    handlers: list[asyncio.Task[None]] = []
    connected: list[asyncio.Event] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.append(task)
        connected[0].set()
        await asyncio.sleep(30)

    async def main() -> None:
        connected.append(asyncio.Event())
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.wait_for(connected[0].wait(), 5)
        handlers[0].cancel()
        await asyncio.sleep(0.1)
        writer.close()
        server.close()

    try:
        configure_logging("INFO")
        asyncio_log.addHandler(caplog.handler)
        asyncio.run(main())
    finally:
        asyncio_log.removeHandler(caplog.handler)
        asyncio_log.filters[:] = saved[0]
        logging.getLogger().handlers[:] = saved[1]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
