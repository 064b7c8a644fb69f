"""The request-rate meter behind /health's total_qps (sie.roles.gateway.rates)."""

from sie.roles.gateway.rates import RateMeter


def test_rate_over_a_sliding_window() -> None:
    now = [100.0]
    meter = RateMeter(window_s=10, clock=lambda: now[0])
    assert meter.rate() == 0
    for _ in range(20):
        meter.tick()
    assert meter.rate() == 2.0
    now[0] = 105.0
    meter.tick()
    assert meter.rate() == 2.1
    now[0] = 110.5  # the first 20 fell out of the window
    assert meter.rate() == 0.1
