"""Engine-state admission for generation: the pure decision (admission-gate.md).

A generation request is admitted on the engine's **own** scheduler state, not on a
gateway-local counter. This module holds only the values and the rule; polling
(``sie.engines.runtime.observer``) and parking (``sie.roles.gateway.admission``) live elsewhere.

The rule (admission-gate.md "The decision")::

    reading is None (never read, or unhealthy)         -> admit  ("unknown": fail open)
    kv_usage is known and kv_usage >= kv_threshold     -> park   ("kv_cache")
    running + waiting + local_admits >= max_inflight   -> park   ("inflight")
    otherwise                                          -> admit  ("headroom")

``local_admits`` is this gateway's own admissions since the reading was taken; they
are counted against the headroom, so one gateway never admits more than the headroom
the reading showed, however many requests arrive between two polls.

Cross-replica bound (what remains soft). Let ``C`` be the effective max in-flight,
``P`` the poll interval and ``R`` the number of gateway replicas gating one engine.
A replica whose latest reading shows load ``L = running + waiting`` admits at most
``h = max(0, C - L)`` requests until its next reading (it counts its own
admissions). The replicas do not see one another's admissions until the engine
reports them, so in the worst case all ``R`` hold readings with the same headroom
``h`` and together admit ``R * h``: the engine then holds ``C + (R - 1) * h``. So per
poll interval the cap is exceeded by at most ``(R - 1) * h <= (R - 1) * C`` requests,
and by at most ``R - 1`` in the saturated steady state that matters (slots free up
one at a time, ``h = 1``). The excess does not accumulate: the next readings show
``L >= C``, every replica parks, and admission resumes only once the engine has
drained below ``C``. (The source this follows had no local accounting: every parked
request on every replica could be released by one fresh reading.)

One more term: admissions made shortly before a scrape that had not yet reached the
engine's queue (bus and worker transit, ``delta`` seconds) are neither in the reading
nor counted locally any more (local counting starts when the scrape starts), adding
at most the admissions of the last ``delta`` seconds per replica. KV usage is also a
soft limit (a request's cache grows after admission). The engine remains the hard
limit: vLLM queues whatever exceeds ``max_num_seqs`` in ``waiting``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "REASON_HEADROOM",
    "REASON_INFLIGHT",
    "REASON_KV_CACHE",
    "REASON_UNGATED",
    "REASON_UNKNOWN",
    "AdmissionConfig",
    "Decision",
    "EngineState",
    "decide",
    "effective_max_inflight",
]

#: Decision reasons; stable strings, used as metric labels (``admission_rejected_total``).
REASON_HEADROOM = "headroom"  # admit: fresh reading with room
REASON_UNKNOWN = "unknown"  # admit: no healthy reading (fail open)
REASON_UNGATED = "ungated"  # admit: model not in observe_models (set by the gate)
REASON_KV_CACHE = "kv_cache"  # park: KV-cache usage at or over the threshold
REASON_INFLIGHT = "inflight"  # park: running + waiting + local admits at the cap


@dataclass(frozen=True, slots=True)
class EngineState:
    """One reading of a generation engine's scheduler (admission-gate.md "What the gate reads").

    Attributes:
        running: requests in the engine's running batch (``vllm:num_requests_running``), >= 0.
        waiting: requests queued in the engine (``vllm:num_requests_waiting``), >= 0.
        kv_usage: KV-cache usage as a fraction 0..1 (``vllm:kv_cache_usage_perc``), or
            None when the engine does not report it (then only the in-flight cap applies).
        kv_capacity_tokens: KV capacity in tokens (``num_gpu_blocks * block_size``);
            informational, None when unknown.
        max_num_seqs: the engine's sequence cap (vLLM ``--max-num-seqs``), the default
            of ``AdmissionConfig.max_inflight``; None when unknown.

    Raises:
        ValueError: negative counts, or a ``kv_usage`` outside 0..1 or not finite.
    """

    running: int
    waiting: int
    kv_usage: float | None = None
    kv_capacity_tokens: int | None = None
    max_num_seqs: int | None = None

    def __post_init__(self) -> None:
        if self.running < 0 or self.waiting < 0:
            raise ValueError(f"running/waiting must be >= 0, got {self.running}/{self.waiting}")
        if self.kv_usage is not None and not (
            math.isfinite(self.kv_usage) and 0.0 <= self.kv_usage <= 1.0
        ):
            raise ValueError(f"kv_usage must be a fraction 0..1, got {self.kv_usage}")
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < 0:
            raise ValueError(f"kv_capacity_tokens must be >= 0, got {self.kv_capacity_tokens}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")

    @property
    def load(self) -> int:
        """``running + waiting``: requests the engine holds."""
        return self.running + self.waiting


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Admission settings (admission-gate.md; env ``SIE_ADMISSION_*``).

    Attributes:
        kv_threshold: park at or above this KV-cache usage fraction (0 < x <= 1; 0.90).
        max_inflight: park when ``running + waiting (+ local admits)`` reaches this; None:
            the engine's ``max_num_seqs``; no in-flight cap when both are unknown.
        max_park_s: seconds a request may stay parked before 503 (120).
        poll_interval_s: seconds between engine state reads (2).
        stale_after_failures: consecutive failed reads that mark the state unhealthy (3).
        keepalive_s: seconds between keep-alive callbacks of a parked request (15).
        observe_models: the gated models; None or empty gates nobody.

    Raises:
        ValueError: a value out of range.
    """

    kv_threshold: float = 0.90
    max_inflight: int | None = None
    max_park_s: float = 120.0
    poll_interval_s: float = 2.0
    stale_after_failures: int = 3
    keepalive_s: float = 15.0
    observe_models: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if not (0.0 < self.kv_threshold <= 1.0):
            raise ValueError(f"kv_threshold must be in (0, 1], got {self.kv_threshold}")
        if self.max_inflight is not None and self.max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {self.max_inflight}")
        if self.max_park_s < 0:
            raise ValueError(f"max_park_s must be >= 0, got {self.max_park_s}")
        if self.poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {self.poll_interval_s}")
        if self.stale_after_failures < 1:
            raise ValueError(f"stale_after_failures must be >= 1, got {self.stale_after_failures}")
        if self.keepalive_s <= 0:
            raise ValueError(f"keepalive_s must be > 0, got {self.keepalive_s}")

    def gates(self, model: str) -> bool:
        """Whether ``model`` is gated (listed in ``observe_models``)."""
        return bool(self.observe_models) and model in (self.observe_models or ())


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of ``decide``.

    Attributes:
        admit: True to admit now, False to park.
        reason: one of the ``REASON_*`` strings (a metric label).
        max_inflight: the effective in-flight cap used, or None when there was none.
    """

    admit: bool
    reason: str
    max_inflight: int | None = None


def effective_max_inflight(reading: EngineState | None, cfg: AdmissionConfig) -> int | None:
    """``cfg.max_inflight``, else the engine's ``max_num_seqs``, else None (no cap)."""
    if cfg.max_inflight is not None:
        return cfg.max_inflight
    return reading.max_num_seqs if reading is not None else None


def decide(reading: EngineState | None, cfg: AdmissionConfig, *, local_admits: int = 0) -> Decision:
    """Admit or park one request (admission-gate.md "The decision"; rule in the module doc).

    Args:
        reading: the latest **healthy** reading, or None when the engine was never read
            or its state is unhealthy (then the request is admitted: fail open).
        cfg: thresholds.
        local_admits: this gateway's admissions since ``reading`` was taken (>= 0);
            counted against the in-flight headroom.

    Returns:
        The decision and its reason.

    Raises:
        ValueError: ``local_admits`` < 0.
    """
    if local_admits < 0:
        raise ValueError(f"local_admits must be >= 0, got {local_admits}")
    if reading is None:
        return Decision(True, REASON_UNKNOWN, effective_max_inflight(None, cfg))
    cap = effective_max_inflight(reading, cfg)
    if reading.kv_usage is not None and reading.kv_usage >= cfg.kv_threshold:
        return Decision(False, REASON_KV_CACHE, cap)
    if cap is not None and reading.load + local_admits >= cap:
        return Decision(False, REASON_INFLIGHT, cap)
    return Decision(True, REASON_HEADROOM, cap)
