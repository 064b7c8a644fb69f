"""Fair service (issue 13 item 3; docs/api.md §10): a one-item request beside large ones
is served in about one batch time, not after them. The gateway keeps at most
``REQUEST_WINDOW_ITEMS`` of a request's items in the stream, and the worker's batcher
takes requests round-robin. Default settings, every role in one process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from sie.roles.gateway.collect import REQUEST_WINDOW_ITEMS
from tests.conftest import MINILM, Stack, run_stack, wait_for

pytestmark = pytest.mark.slow

BIG = 2
ITEMS = 2048  # ~7 s of MiniLM work each on 2 cores: far longer than one batch


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with run_stack(preload=(MINILM,)) as s:
        yield s


def test_a_small_request_does_not_wait_behind_large_ones(stack: Stack) -> None:
    url = f"{stack.base_url}/v1/encode/{MINILM}"
    body = {"items": [{"text": f"a large request, text {i}"} for i in range(ITEMS)]}
    codes: list[int] = []

    def big() -> None:
        codes.append(httpx.post(url, json=body, timeout=120).status_code)

    threads = [threading.Thread(target=big) for _ in range(BIG)]
    for t in threads:
        t.start()
    gw = stack.running.gateway
    assert gw is not None
    wait_for(lambda: sum(gw.lanes.in_flight.values()) >= BIG * ITEMS - 200, timeout_s=20)
    # the stream holds a window of each large request, not the whole of it
    lat = []
    for _ in range(5):
        t0 = time.monotonic()
        r = httpx.post(url, json={"items": [{"text": "small"}]}, timeout=60)
        lat.append(time.monotonic() - t0)
        assert r.status_code == 200, r.text
    for t in threads:
        t.join(120)
    assert codes == [200] * BIG  # the large ones complete too
    # FIFO would put each small item behind up to 4,096 items (~13 s here)
    assert max(lat) < 3.0, lat
    assert REQUEST_WINDOW_ITEMS < ITEMS
