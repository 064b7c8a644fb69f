"""All roles over a real NATS JetStream broker (architecture §8, §8.2, §4.3).

The same stack as the memory-bus tests, with ``--bus=nats``: encode results equal the
in-process model, config deltas travel over NATS core, work over JetStream.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import MINILM, Stack, post_until_ok, run_stack, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nats_stack(nats_server: Any) -> Iterator[Stack]:
    with run_stack(
        bus="nats", nats_url=nats_server.url, preload=(MINILM,), config_poll_interval_s=60
    ) as s:
        yield s


def test_encode_over_nats_matches_the_model(nats_stack: Stack, st_model: Any) -> None:
    texts = ["over a real broker", "JetStream work queue", "third"]
    r = httpx.post(
        f"{nats_stack.base_url}/v1/encode/{MINILM}",
        json={"items": [{"text": t} for t in texts]},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    got = np.array([it["dense"]["values"] for it in r.json()["items"]], dtype=np.float32)
    np.testing.assert_allclose(got, st_model.encode(texts), atol=1e-5)


def test_config_delta_over_nats(nats_stack: Stack) -> None:
    # the poller is slow here (60 s): convergence within seconds means the delta did it
    body = (
        f"sie_id: {MINILM}\nprofiles:\n  natsy:\n    extends: default\n    max_batch_tokens: 512\n"
    )
    cfg = f"http://127.0.0.1:{nats_stack.running.config_port}"
    w = httpx.post(f"{cfg}/v1/configs/models", content=body)
    assert w.status_code == 201, w.text
    r = post_until_ok(
        f"{nats_stack.base_url}/v1/encode/{MINILM}:natsy", {"items": [{"text": "x"}]}, timeout_s=10
    )
    assert len(r.json()["items"][0]["dense"]["values"]) == 384
    status = wait_for(
        lambda: (
            s
            if (s := httpx.get(f"{nats_stack.base_url}/v1/configs/models/{MINILM}/status").json())[
                "all_bundles_acked"
            ]
            else None
        ),
        timeout_s=10,
    )
    assert status["config_epoch"] == w.json()["epoch"]


def test_unknown_lane_is_provisioning_over_nats(nats_stack: Stack) -> None:
    gw = nats_stack.running.gateway
    assert gw is not None
    # past the gateway's start-up grace (3 heartbeat intervals), it knows which lanes are served
    wait_for(lambda: not gw.lane_served("default", "h200", "default"), timeout_s=10)
    r = httpx.post(
        f"{nats_stack.base_url}/v1/encode/{MINILM}",
        json={"items": [{"text": "x"}]},
        headers={"X-SIE-Machine-Profile": "h200"},
    )
    assert r.status_code == 503 and r.headers["Retry-After"] == "60"
    assert r.headers["X-SIE-Error-Code"] == "PROVISIONING"
