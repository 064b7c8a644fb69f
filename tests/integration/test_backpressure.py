"""Gateway admission (architecture §2): pool-wide stream backpressure, per-lane in-flight
accounting, and cheap drops of late results. A gateway without workers, inside its
start-up grace, so work is published and stays queued."""

from __future__ import annotations

import httpx

from tests.conftest import MINILM, run_stack, wait_for

URL = f"/v1/encode/{MINILM}"
LANE = ("default", "default", "default")
LABELS = 'bundle="default",machine_profile="default",pool="default"'
ONE = {"items": [{"text": "x"}]}


def test_stream_pending_limit_is_503_queue_full() -> None:
    with (
        run_stack(
            roles=("gateway",), max_stream_pending=2, request_timeout_s=0.3, heartbeat_interval_s=5
        ) as s,
        httpx.Client(base_url=s.base_url, timeout=10) as c,
    ):
        assert [c.post(URL, json=ONE).status_code for _ in range(2)] == [504, 504]
        gw = s.running.gateway
        assert gw is not None
        gw.pending.forget_readings()
        r = c.post(URL, json=ONE)
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == "5" and r.headers["X-SIE-Error-Code"] == "QUEUE_FULL"
        assert gw.lanes.in_flight.get(LANE, 0) == 0
        # the shed records demand for the exact lane (§2) and shows on /metrics
        assert gw.lanes.pending_demand() == {LANE: 1}
        text = c.get("/metrics").text
        assert f"sie_gateway_pending_demand{{{LABELS}}} 1.0" in text
        assert f'sie_gateway_rejected_requests_total{{{LABELS},reason="queue_full"}} 1.0' in text


def test_lane_limit_counts_and_only_sheds_when_enforced() -> None:
    two = {"items": [{"text": "a"}, {"text": "b"}]}
    for enforce, want in ((False, 504), (True, 503)):
        with run_stack(
            roles=("gateway",),
            max_lane_in_flight_items=1,
            lane_backpressure_enforce=enforce,
            request_timeout_s=0.3,
            heartbeat_interval_s=5,
        ) as s:
            r = httpx.post(s.base_url + URL, json=two, timeout=10)
            assert r.status_code == want, r.text
            gw = s.running.gateway
            assert gw is not None
            decision = "shed" if enforce else "would_shed"
            assert gw.lanes.decisions(LANE, decision) == 1
            assert gw.lanes.pending_demand() == ({LANE: 1} if enforce else {})
            # within the limit: admitted, and a published request clears the lane's demand
            r = httpx.post(s.base_url + URL, json=ONE, timeout=10)
            assert r.status_code == 504
            assert gw.lanes.decisions(LANE, "admit") == 1
            assert gw.lanes.pending_demand() == {}


def test_late_results_are_dropped_without_decoding() -> None:
    with run_stack(roles=("gateway",), heartbeat_interval_s=5) as s:
        gw = s.running.gateway
        assert gw is not None
        s.portal.call(gw.bus.publish, f"_INBOX.{gw.router_id}.finished-request", b"\xc1garbage")
        wait_for(lambda: gw.late_results == 1, timeout_s=5)
