"""Engine-state admission: the pure decision, the config, the vLLM metrics parser and
the settings (admission-gate.md "The decision", "What the gate reads")."""

from __future__ import annotations

import math

import pytest

from sie.core.admission import (
    REASON_HEADROOM,
    REASON_INFLIGHT,
    REASON_KV_CACHE,
    REASON_UNKNOWN,
    AdmissionConfig,
    Decision,
    EngineState,
    decide,
    effective_max_inflight,
)
from sie.core.errors import AdmissionRejected, error_for_code
from sie.engines.runtime.observer import EngineMetricsError, parse_engine_metrics
from sie.roles.gateway.admission import admission_config
from sie.settings import ENV_VARS, ServeSettings

CFG = AdmissionConfig(max_inflight=4)


def state(running: int = 0, waiting: int = 0, kv: float | None = 0.1, **kw: int) -> EngineState:
    return EngineState(running=running, waiting=waiting, kv_usage=kv, **kw)


# -- decide --------------------------------------------------------------------------


def test_unknown_state_fails_open() -> None:
    assert decide(None, CFG, local_admits=100) == Decision(True, REASON_UNKNOWN, 4)


def test_admit_with_headroom() -> None:
    d = decide(state(running=2, waiting=1, kv=0.5), CFG, local_admits=0)
    assert d == Decision(True, REASON_HEADROOM, 4)


def test_kv_cache_at_or_over_threshold_parks() -> None:
    assert decide(state(kv=0.90), CFG).reason == REASON_KV_CACHE
    assert not decide(state(kv=0.97), CFG).admit
    assert decide(state(kv=0.8999), CFG).admit
    assert decide(state(kv=0.5), AdmissionConfig(kv_threshold=0.5)).reason == REASON_KV_CACHE


def test_kv_checked_before_inflight() -> None:
    assert decide(state(running=9, kv=0.99), CFG).reason == REASON_KV_CACHE


def test_running_plus_waiting_at_cap_parks() -> None:
    assert decide(state(running=3, waiting=1), CFG) == Decision(False, REASON_INFLIGHT, 4)
    assert decide(state(running=0, waiting=4), CFG).reason == REASON_INFLIGHT
    assert decide(state(running=3, waiting=0), CFG).admit


def test_local_admits_count_against_headroom() -> None:
    reading = state(running=2)
    assert decide(reading, CFG, local_admits=0).admit
    assert decide(reading, CFG, local_admits=1).admit
    assert decide(reading, CFG, local_admits=2) == Decision(False, REASON_INFLIGHT, 4)
    with pytest.raises(ValueError):
        decide(reading, CFG, local_admits=-1)


def test_max_inflight_defaults_to_engine_max_num_seqs() -> None:
    cfg = AdmissionConfig()
    assert effective_max_inflight(state(max_num_seqs=2), cfg) == 2
    assert decide(state(running=2, max_num_seqs=2), cfg).reason == REASON_INFLIGHT
    assert decide(state(running=1, max_num_seqs=2), cfg).admit
    # the setting wins over the engine's value
    assert effective_max_inflight(state(max_num_seqs=2), AdmissionConfig(max_inflight=8)) == 8


def test_no_cap_known_gates_on_kv_only() -> None:
    cfg = AdmissionConfig()
    assert effective_max_inflight(state(), cfg) is None
    assert decide(state(running=10_000, kv=0.1), cfg, local_admits=10_000).admit
    assert not decide(state(running=0, kv=0.95), cfg).admit


def test_unknown_kv_usage_gates_on_inflight_only() -> None:
    assert decide(state(running=1, kv=None), CFG).admit
    assert decide(state(running=4, kv=None), CFG).reason == REASON_INFLIGHT


def test_engine_state_validation() -> None:
    for bad in (
        {"running": -1, "waiting": 0},
        {"running": 0, "waiting": -1},
        {"running": 0, "waiting": 0, "kv_usage": 1.5},
        {"running": 0, "waiting": 0, "kv_usage": -0.1},
        {"running": 0, "waiting": 0, "kv_usage": math.nan},
        {"running": 0, "waiting": 0, "max_num_seqs": 0},
        {"running": 0, "waiting": 0, "kv_capacity_tokens": -1},
    ):
        with pytest.raises(ValueError):
            EngineState(**bad)
    assert EngineState(running=2, waiting=3).load == 5


def test_config_defaults_and_validation() -> None:
    cfg = AdmissionConfig()
    assert (cfg.kv_threshold, cfg.max_inflight, cfg.max_park_s) == (0.90, None, 120.0)
    assert (cfg.poll_interval_s, cfg.stale_after_failures, cfg.keepalive_s) == (2.0, 3, 15.0)
    for bad in (
        {"kv_threshold": 0.0},
        {"kv_threshold": 1.1},
        {"max_inflight": 0},
        {"max_park_s": -1.0},
        {"poll_interval_s": 0.0},
        {"stale_after_failures": 0},
        {"keepalive_s": 0.0},
    ):
        with pytest.raises(ValueError):
            AdmissionConfig(**bad)


def test_observe_models_selects_gated_models() -> None:
    assert not AdmissionConfig().gates("m")
    assert not AdmissionConfig(observe_models=frozenset()).gates("m")
    cfg = AdmissionConfig(observe_models=frozenset({"m"}))
    assert cfg.gates("m") and not cfg.gates("other")


def test_admission_rejected_is_a_retryable_503() -> None:
    exc = AdmissionRejected("busy", model="m", reason="kv_cache")
    assert (exc.status, exc.retry_after_s, exc.code) == (503, 5, "ENGINE_SATURATED")
    assert exc.to_detail() == {
        "code": "ENGINE_SATURATED",
        "message": "busy",
        "model": "m",
        "reason": "kv_cache",
    }
    assert isinstance(error_for_code("ENGINE_SATURATED", "x"), AdmissionRejected)


# -- settings ------------------------------------------------------------------------


def test_settings_build_the_admission_config() -> None:
    s = ServeSettings.from_env(
        {
            "SIE_ADMISSION_KV_THRESHOLD": "0.8",
            "SIE_ADMISSION_MAX_INFLIGHT": "4",
            "SIE_ADMISSION_MAX_PARK_SECONDS": "30",
            "SIE_ADMISSION_OBSERVE_MODELS": "llama, qwen,",
            "SIE_ADMISSION_POLL_INTERVAL_S": "0.5",
            "SIE_ADMISSION_KEEPALIVE_S": "5",
        }
    )
    cfg = admission_config(s)
    assert cfg == AdmissionConfig(
        kv_threshold=0.8,
        max_inflight=4,
        max_park_s=30.0,
        poll_interval_s=0.5,
        keepalive_s=5.0,
        observe_models=frozenset({"llama", "qwen"}),
    )
    assert {k for k in ENV_VARS if k.startswith("SIE_ADMISSION_")} == {
        "SIE_ADMISSION_KV_THRESHOLD",
        "SIE_ADMISSION_MAX_INFLIGHT",
        "SIE_ADMISSION_MAX_PARK_SECONDS",
        "SIE_ADMISSION_OBSERVE_MODELS",
        "SIE_ADMISSION_POLL_INTERVAL_S",
        "SIE_ADMISSION_KEEPALIVE_S",
    }


def test_unset_observe_models_neutralises_the_gate() -> None:
    for env in ({}, {"SIE_ADMISSION_OBSERVE_MODELS": ""}, {"SIE_ADMISSION_OBSERVE_MODELS": " , "}):
        cfg = admission_config(ServeSettings.from_env(env))
        assert cfg.observe_models is None and not cfg.gates("llama")
    assert admission_config(ServeSettings.from_env({})) == AdmissionConfig()


# -- parser --------------------------------------------------------------------------

VLLM_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_running{engine="1",model_name="llama"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 1.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.42
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.87
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="9527"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="llama"} 123456.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="llama"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="llama"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="llama"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="llama"} 1.5
"""


def test_parse_vllm_page_sums_counts_and_takes_the_fullest_kv() -> None:
    s = parse_engine_metrics(VLLM_PAGE)
    assert s == EngineState(
        running=5, waiting=1, kv_usage=0.87, kv_capacity_tokens=152_432, max_num_seqs=None
    )
    assert parse_engine_metrics(VLLM_PAGE, max_num_seqs=8).max_num_seqs == 8


def test_parse_older_gpu_cache_usage_name() -> None:
    text = (
        "vllm:num_requests_running 1\n"
        "vllm:num_requests_waiting 2\n"
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.25\n'
    )
    s = parse_engine_metrics(text)
    assert (s.running, s.waiting, s.kv_usage, s.kv_capacity_tokens) == (1, 2, 0.25, None)


def test_parse_prefers_the_current_kv_name() -> None:
    text = (
        "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
        "vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.1\n"
    )
    assert parse_engine_metrics(text).kv_usage == 0.1


def test_parse_without_kv_or_capacity() -> None:
    text = (
        "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1\n'
    )
    s = parse_engine_metrics(text)
    assert s.kv_usage is None and s.kv_capacity_tokens is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "<html><body>502 Bad Gateway</body></html>",
        "hello world",
        'vllm:num_requests_running{model_name="m" 2',
        "vllm:num_requests_running 1\n",  # waiting missing
        "some_other_metric 1\n",
        "vllm:num_requests_running -1\nvllm:num_requests_waiting 0\n",
        "vllm:num_requests_running NaN\nvllm:num_requests_waiting 0\n",
        "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 42\n",
        "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc NaN\n",
    ],
)
def test_garbled_or_incomplete_exposition_is_an_error(text: str) -> None:
    with pytest.raises(EngineMetricsError):
        parse_engine_metrics(text)
    assert issubclass(EngineMetricsError, ValueError)
