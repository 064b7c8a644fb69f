"""Engine-state observer: the latest scheduler reading of one generation engine
(admission-gate.md "What the gate reads").

Two ways in, one state:

- **HTTP** (an external vLLM server): ``EngineObserver.run`` polls the engine's
  ``/metrics`` every ``poll_interval_s`` on its **own** ``httpx.AsyncClient`` (never
  the client that carries inference traffic), with a timeout shorter than the
  interval, and parses the text exposition with ``parse_engine_metrics``.
- **In process** (the engine runs in a worker): the worker's heartbeat carries the
  same numbers and the receiver calls ``EngineObserver.update``; no HTTP.

Health: each failed read (transport error, non-200, garbled exposition) counts;
after ``stale_after_failures`` consecutive failures the state is **unhealthy**,
``current()`` returns None (the gate fails open) and ``engine_state_stale_total``
counts the transition once. A pushed source (no URL) that receives no update for
``stale_after_failures * poll_interval_s`` seconds goes unhealthy the same way.
A later good read makes it healthy again.

Startup: ``self_check`` (the first read of ``run``) that fails sets
``observer_degraded`` to 1 and logs at ERROR: a metrics outage fails open, but not
silently. The gauge clears on the next good read.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import anyio
import anyio.abc
import httpx
from prometheus_client.parser import text_string_to_metric_families

from sie.core.admission import AdmissionConfig, EngineState, effective_max_inflight
from sie.telemetry import Metrics

__all__ = [
    "CACHE_CONFIG_INFO",
    "KV_USAGE_METRICS",
    "REQUESTS_RUNNING",
    "REQUESTS_WAITING",
    "EngineMetricsError",
    "EngineObserver",
    "Reading",
    "parse_engine_metrics",
]

log = logging.getLogger(__name__)

#: KV-cache usage, fraction 0..1: the current vLLM name first, then the older one.
KV_USAGE_METRICS = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
#: Info gauge whose labels ``num_gpu_blocks`` x ``block_size`` give the KV capacity in tokens.
CACHE_CONFIG_INFO = "vllm:cache_config_info"


class EngineMetricsError(ValueError):
    """The text is not a usable engine metrics exposition (unparseable, or lacking
    ``vllm:num_requests_running`` / ``vllm:num_requests_waiting``, or values out of range)."""


def _int_label(labels: dict[str, str], key: str) -> int | None:
    try:
        return int(float(labels[key]))
    except (KeyError, ValueError, OverflowError):
        return None


def _count(name: str, values: Iterable[float]) -> int:
    total = 0.0
    for v in values:
        if not math.isfinite(v) or v < 0:
            raise EngineMetricsError(f"{name} must be a finite count >= 0, got {v}")
        total += v
    return round(total)


def parse_engine_metrics(text: str, *, max_num_seqs: int | None = None) -> EngineState:
    """Parse a vLLM ``/metrics`` page (Prometheus text format) into an ``EngineState``.

    Label sets (``model_name``, ``engine`` for data-parallel ranks, ...) are combined:
    running, waiting and KV capacity are **summed**; KV usage takes the **maximum**
    (the fullest engine; a sum of fractions means nothing). KV usage prefers
    ``vllm:kv_cache_usage_perc`` and falls back to ``vllm:gpu_cache_usage_perc``;
    absent both it is None. Capacity = sum of ``num_gpu_blocks * block_size`` over
    ``vllm:cache_config_info`` samples with integer labels (None when there are none).

    Args:
        text: the exposition text.
        max_num_seqs: the engine's sequence cap, when known from its deployment (vLLM
            does not export it); copied into the state.

    Returns:
        The reading (admission-gate.md "What the gate reads").

    Raises:
        EngineMetricsError: unparseable text, a missing running/waiting gauge, a
            negative or non-finite count, or a KV usage outside 0..1.
    """
    try:
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    except Exception as exc:  # the parser raises ValueError, IndexError, ... on garbage
        raise EngineMetricsError(f"unparseable metrics exposition: {exc!r}") from exc
    by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
    for s in samples:
        by_name.setdefault(s.name, []).append((s.labels, float(s.value)))
    for required in (REQUESTS_RUNNING, REQUESTS_WAITING):
        if required not in by_name:
            raise EngineMetricsError(f"metrics exposition has no {required}")
    running = _count(REQUESTS_RUNNING, (v for _, v in by_name[REQUESTS_RUNNING]))
    waiting = _count(REQUESTS_WAITING, (v for _, v in by_name[REQUESTS_WAITING]))
    kv_usage: float | None = None
    for name in KV_USAGE_METRICS:
        if name in by_name:
            values = [v for _, v in by_name[name]]
            bad = [v for v in values if not (math.isfinite(v) and 0.0 <= v <= 1.0)]
            if bad:
                raise EngineMetricsError(f"{name} must be a fraction 0..1, got {bad[0]}")
            kv_usage = max(values)
            break
    capacity: int | None = None
    for labels, _ in by_name.get(CACHE_CONFIG_INFO, []):
        blocks, block_size = _int_label(labels, "num_gpu_blocks"), _int_label(labels, "block_size")
        if blocks is not None and block_size is not None and blocks >= 0 and block_size >= 0:
            capacity = (capacity or 0) + blocks * block_size
    try:
        return EngineState(
            running=running,
            waiting=waiting,
            kv_usage=kv_usage,
            kv_capacity_tokens=capacity,
            max_num_seqs=max_num_seqs,
        )
    except ValueError as exc:
        raise EngineMetricsError(str(exc)) from exc


@dataclass(frozen=True, slots=True)
class Reading:
    """A healthy reading and when it was taken.

    Attributes:
        state: the engine state.
        taken_at: monotonic seconds (the observer's clock) when the read started; the
            gate counts its own admissions from this instant.
    """

    state: EngineState
    taken_at: float


def _default_client(timeout_s: float) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s))


class EngineObserver:
    """Latest healthy state of one generation engine, fed by HTTP polls or ``update``.

    Args:
        url: the engine's metrics URL (e.g. ``http://vllm:8000/metrics``); None for a
            source fed only through ``update`` (worker heartbeats).
        model: the model this engine serves (the ``model`` metric label).
        cfg: ``poll_interval_s`` (seconds) and ``stale_after_failures`` are used.
        metrics: where ``engine_state_stale_total``, ``observer_degraded`` and the
            reading gauges go; None records nothing.
        client_factory: builds the observer's own HTTP client (default: an
            ``httpx.AsyncClient`` with ``timeout_s``); closed when ``run`` ends.
        max_num_seqs: the engine's sequence cap when known from its deployment; fills
            readings that lack it (vLLM does not export it).
        clock: monotonic seconds (tests may inject one).

    Attributes:
        timeout_s: per-read timeout, seconds: 0.8 x ``poll_interval_s`` (at most 10).
        failures: consecutive failed reads.
        degraded: True after a failed startup self-check until a read succeeds.
        version: bumped on every change that can alter an admission decision.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        model: str,
        cfg: AdmissionConfig,
        metrics: Metrics | None = None,
        client_factory: Callable[[], httpx.AsyncClient] | None = None,
        max_num_seqs: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.model = model
        self.cfg = cfg
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs
        self.timeout_s = min(0.8 * cfg.poll_interval_s, 10.0)
        self._client_factory = client_factory or (lambda: _default_client(self.timeout_s))
        self._client: httpx.AsyncClient | None = None
        self._clock = clock
        self._reading: Reading | None = None
        self._updated_at: float | None = None
        self._healthy = True
        self._listeners: list[Callable[[], None]] = []
        self._logged_cap: tuple[int | None, str] | None = None
        self.failures = 0
        self.degraded = False
        self.version = 0

    # -- state -----------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """False once ``stale_after_failures`` consecutive reads failed (or a pushed
        source went silent), until the next good read."""
        self._check_age()
        return self._healthy

    def current(self) -> Reading | None:
        """The latest reading if the engine is healthy, else None (never read, or
        stale: the gate fails open)."""
        self._check_age()
        return self._reading if self._healthy else None

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (synchronously, no arguments) after every change that can
        alter a decision: a new reading, a stale transition."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        self.version += 1
        for listener in list(self._listeners):
            listener()

    def _check_age(self) -> None:
        # a pushed source has no polls to fail: silence for N update periods is N failures
        if self.url is not None or not self._healthy or self._updated_at is None:
            return
        limit = self.cfg.stale_after_failures * self.cfg.poll_interval_s
        if self._clock() - self._updated_at > limit:
            self._go_stale(f"no update for more than {limit:g} s")

    def _go_stale(self, why: str) -> None:
        self._healthy = False
        if self.metrics is not None:
            self.metrics.engine_state_stale.labels(self.model).inc()
        log.warning(
            "engine state for %s is stale (%s); admission fails open until a good read",
            self.model,
            why,
        )
        self._changed()

    def update(self, state: EngineState, *, taken_at: float | None = None) -> None:
        """Record a good reading (the in-process path, and every successful poll).

        Args:
            state: the reading; a missing ``max_num_seqs`` is filled from the observer's.
            taken_at: monotonic seconds (this observer's clock) when it was read;
                default now.
        """
        now = self._clock()
        if state.max_num_seqs is None and self.max_num_seqs is not None:
            state = EngineState(
                running=state.running,
                waiting=state.waiting,
                kv_usage=state.kv_usage,
                kv_capacity_tokens=state.kv_capacity_tokens,
                max_num_seqs=self.max_num_seqs,
            )
        self._reading = Reading(state, now if taken_at is None else taken_at)
        self._updated_at = now
        self.failures = 0
        if not self._healthy:
            log.info("engine state for %s is healthy again", self.model)
        self._healthy = True
        if self.degraded:
            self.degraded = False
            log.info("engine state observer for %s recovered: read %s", self.model, self.url)
        if self.metrics is not None:
            self.metrics.observer_degraded.labels(self.model).set(0)
            self.metrics.vllm_requests_running.labels(self.model).set(state.running)
            if state.kv_usage is not None:
                self.metrics.vllm_kv_cache_usage.labels(self.model).set(state.kv_usage)
        self._log_cap(state)
        self._changed()

    def _log_cap(self, state: EngineState) -> None:
        cap = effective_max_inflight(state, self.cfg)
        source = (
            "ADMISSION_MAX_INFLIGHT"
            if self.cfg.max_inflight is not None
            else "engine max_num_seqs"
            if cap is not None
            else "none: engine max_num_seqs unknown, KV threshold only"
        )
        if self._logged_cap != (cap, source):
            self._logged_cap = (cap, source)
            log.info(
                "admission for %s: max_inflight=%s (%s), kv_threshold=%.2f",
                self.model,
                cap,
                source,
                self.cfg.kv_threshold,
            )

    def record_failure(self, why: str) -> None:
        """Count one failed read; the ``stale_after_failures``-th consecutive one marks
        the state unhealthy (counted once in ``engine_state_stale_total``)."""
        self.failures += 1
        level = logging.WARNING if self.failures == 1 else logging.DEBUG
        log.log(level, "engine state read for %s failed (%d): %s", self.model, self.failures, why)
        if self._healthy and self.failures >= self.cfg.stale_after_failures:
            self._go_stale(f"{self.failures} consecutive failed reads; last: {why}")

    # -- HTTP ------------------------------------------------------------------------

    async def poll_once(self) -> EngineState | None:
        """Read ``url`` once: on success ``update`` and return the state; on a transport
        error, a non-200 answer or garbled text ``record_failure`` and return None.
        Bounded by ``timeout_s``.

        Raises:
            RuntimeError: the observer has no URL.
        """
        if self.url is None:
            raise RuntimeError(f"observer for {self.model} has no URL; feed it with update()")
        taken_at = self._clock()
        client = self._client
        own = client is None
        if client is None:
            client = self._client_factory()
        try:
            with anyio.fail_after(self.timeout_s):
                resp = await client.get(self.url, timeout=self.timeout_s)
            if resp.status_code != 200:
                raise EngineMetricsError(f"HTTP {resp.status_code} from {self.url}")
            state = parse_engine_metrics(resp.text, max_num_seqs=self.max_num_seqs)
        except (httpx.HTTPError, TimeoutError, EngineMetricsError) as exc:
            self.record_failure(f"{type(exc).__name__}: {exc}")
            return None
        finally:
            if own:
                await client.aclose()
        self.update(state, taken_at=taken_at)
        return state

    async def self_check(self) -> bool:
        """The startup read: on failure set ``observer_degraded`` to 1 and log at ERROR
        (admission-gate.md: fail open, but not silently). Returns whether it read."""
        ok = await self.poll_once() is not None
        if not ok:
            self.degraded = True
            if self.metrics is not None:
                self.metrics.observer_degraded.labels(self.model).set(1)
            log.error(
                "engine state self-check for %s failed: cannot read %s; admission fails open "
                "until a read succeeds",
                self.model,
                self.url,
            )
        return ok

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Self-check, signal started, then poll every ``poll_interval_s`` until cancelled
        (ticks are on a fixed schedule; a slow read delays no later tick beyond it).

        Raises:
            RuntimeError: the observer has no URL.
        """
        if self.url is None:
            raise RuntimeError(f"observer for {self.model} has no URL; feed it with update()")
        self._client = self._client_factory()
        try:
            await self.self_check()
            task_status.started()
            interval = self.cfg.poll_interval_s
            next_tick = self._clock() + interval
            while True:
                await anyio.sleep(max(0.0, next_tick - self._clock()))
                await self.poll_once()
                next_tick += interval
                now = self._clock()
                if next_tick < now:  # fell behind: skip missed ticks, never burst
                    next_tick = now + interval - ((now - next_tick) % interval)
        finally:
            client, self._client = self._client, None
            with anyio.CancelScope(shield=True):
                await client.aclose()
