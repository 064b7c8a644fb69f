"""Server logging (sie.logs): the connection-lost write warning is throttled."""

from __future__ import annotations

import logging

import pytest

from sie.logs import CONNECTION_LOST_WRITE, Throttle, configure_logging


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
