"""The worker's cancellations: bounded tombstones, running work cancelled."""

import pytest

from sie.roles.worker.cancels import Cancellations

pytestmark = pytest.mark.anyio


async def test_cancel_tombstones_the_request_and_cancels_its_running_work() -> None:
    c = Cancellations()
    a, b, other = c.open("r1"), c.open("r1"), c.open("r2")
    assert "r1" not in c
    c.cancel("r1")
    assert "r1" in c and "r2" not in c
    assert a.cancel_called and b.cancel_called and not other.cancel_called
    c.close("r1", a)
    c.close("r1", b)
    c.close("r2", other)
    c.cancel("r2")  # nothing running: only the tombstone
    assert "r2" in c


async def test_tombstones_are_bounded_oldest_first() -> None:
    c = Cancellations(tombstones=3)
    for i in range(5):
        c.cancel(f"r{i}")
    assert [f"r{i}" in c for i in range(5)] == [False, False, True, True, True]
