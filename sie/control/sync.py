"""Config convergence for gateways and workers (architecture §4.1-§4.3).

Three independent mechanisms keep a local ``ModelRegistry`` + ``ConfigEpoch`` in
step with the config authority:

- **bootstrap** (``run_bootstrap``): ``GET /v1/configs/epoch`` → bundles → export,
  in that order (the epoch/hashes are read *before* the bundles, so a stored hash
  is never newer than the installed state, §4.1), retried with backoff 1 s doubling
  to 60 s until one attempt succeeds; ``degraded`` after 10 failures or 5 minutes,
  cleared on success. A partial apply (any export entry failing) changes no model
  and advances nothing.
- **poller** (``run_poller``): every ``poll_interval_s`` (first tick skipped) compare
  the remote epoch and hashes with local state: remote ahead or a hash differs
  (``""`` remote hashes skipped) → bootstrap; remote behind → re-export first and
  only then ``force_set`` the epoch. Poll failures are logged and swallowed.
- **live deltas** (``handle_delta``): ``ConfigNotification`` from a trusted
  producer (exact id or Kubernetes pod-name prefix), blank body = epoch bump,
  unparseable body or registry rejection advances nothing, the epoch only moves
  forward (``set_max``).

Startup never blocks on the authority: ``run`` signals started at once.
"""

from __future__ import annotations

import functools
import logging
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import httpx

from sie.core.config import Bundle, ModelConfig, load_yaml, parse_bundle, parse_model_config
from sie.core.epoch import ConfigEpoch
from sie.core.errors import SieError
from sie.core.registry import SOURCE_API, ModelRegistry, check_subject_tokens
from sie.core.wire import ConfigNotification
from sie.telemetry import Metrics

__all__ = ["BootstrapError", "BootstrapOutcome", "ConfigSync", "producer_trusted"]

log = logging.getLogger(__name__)

DEGRADED_AFTER_FAILURES = 10
DEGRADED_AFTER_S = 300.0


class BootstrapError(Exception):
    """One bootstrap attempt failed (network, HTTP status, decode, partial apply)."""


@dataclass(frozen=True, slots=True)
class BootstrapOutcome:
    epoch: int
    bundles_hash: str
    bundle_config_hashes_hash: str
    applied: int
    failed: int
    total: int


def producer_trusted(producer: str, allowlist: Iterable[str]) -> bool:
    """Exact match, or a Kubernetes pod name of an allowed Deployment/StatefulSet:
    ``sie-config`` trusts ``sie-config-5f7b6d8c-kxwvr`` and ``sie-config-0`` but not
    ``sie-configuration`` (§4.3). An empty allowlist trusts everyone."""
    allow = [a for a in allowlist if a]
    return not allow or any(producer == a or producer.startswith(a + "-") for a in allow)


class ConfigSync:
    """Keeps ``registry`` and ``epoch`` converged with the config authority at ``base_url``.

    Args:
        base_url: the authority (``SIE_CONFIG_SERVICE_URL``); None: bootstrap and
            poller are no-ops, only deltas apply.
        admin_token: bearer presented to the authority (export is admin-only).
        poll_interval_s: seconds between epoch polls.
        backoff_initial_s / backoff_max_s: bootstrap retry backoff, seconds.
        transport: an httpx transport (tests may pass an ASGI transport).
        on_change: called after the registry changed (e.g. to re-advertise a hash).
        role: metric label (``gateway`` / ``worker``).
    """

    def __init__(
        self,
        registry: ModelRegistry,
        epoch: ConfigEpoch,
        *,
        base_url: str | None,
        admin_token: str | None = None,
        poll_interval_s: float = 30.0,
        trusted_producers: Iterable[str] = ("sie-config",),
        trust_any_producer: bool = False,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        request_timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        on_change: Callable[[], None] | None = None,
        metrics: Metrics | None = None,
        role: str = "gateway",
    ) -> None:
        self.registry = registry
        self.epoch = epoch
        self.base_url = base_url.rstrip("/") if base_url else None
        self.admin_token = admin_token
        self.poll_interval_s = poll_interval_s
        self.trusted_producers = tuple(trusted_producers)
        self.trust_any_producer = trust_any_producer
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.request_timeout_s = request_timeout_s
        self.transport = transport
        self.on_change = on_change
        self._listeners: list[Callable[[], None]] = []
        self.metrics = metrics
        self.role = role
        self.bundles_hash = ""
        self.bundle_config_hashes_hash = ""
        self.bootstrapped = False
        self.degraded = False
        self.failures = 0
        self._first_failure: float | None = None
        self._set_gauges()

    # -- lifecycle -----------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Bootstrap retry and poller, side by side; started at once (never blocks startup)."""
        task_status.started()
        if self.base_url is None:
            return
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.run_bootstrap)
            tg.start_soon(self.run_poller)

    async def run_bootstrap(self) -> None:
        """Retry ``bootstrap_once`` until it succeeds (no attempt ceiling, §4.1)."""
        delay = self.backoff_initial_s
        while True:
            try:
                await self.bootstrap_once()
                return
            except BootstrapError as exc:
                self._record_failure(exc)
            await anyio.sleep(delay)
            delay = min(delay * 2, self.backoff_max_s)

    async def run_poller(self) -> None:
        while True:
            await anyio.sleep(
                self.poll_interval_s
            )  # the first tick is skipped (architecture §4 step 3)
            await self.poll_once()

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Also call ``fn`` whenever the registry changed (after ``on_change``)."""
        self._listeners.append(fn)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()
        for fn in self._listeners:
            fn()

    # -- bootstrap -----------------------------------------------------------------------

    def _client(self) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}
        return httpx.AsyncClient(
            base_url=self.base_url or "",
            headers=headers,
            timeout=self.request_timeout_s,
            transport=self.transport,
            verify=_tls_context(),
        )

    @staticmethod
    async def _get(client: httpx.AsyncClient, path: str) -> httpx.Response:
        try:
            r = await client.get(path)
        except httpx.HTTPError as exc:
            raise BootstrapError(f"GET {path}: {type(exc).__name__}: {exc}") from exc
        if r.status_code != 200:
            raise BootstrapError(f"GET {path}: HTTP {r.status_code}: {r.text[:200]}")
        return r

    @staticmethod
    def _json(r: httpx.Response) -> Any:
        try:
            return r.json()
        except ValueError as exc:
            raise BootstrapError(f"GET {r.request.url.path}: malformed JSON") from exc

    async def fetch_epoch(self, client: httpx.AsyncClient) -> tuple[int, str, str]:
        body = self._json(await self._get(client, "/v1/configs/epoch"))
        try:
            return (
                int(body["epoch"]),
                str(body.get("bundles_hash") or ""),
                str(body.get("bundle_config_hashes_hash") or ""),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BootstrapError(f"/v1/configs/epoch: unexpected body {body!r:.200}") from exc

    async def bootstrap_once(self) -> BootstrapOutcome:
        """epoch → bundles → export; apply all or nothing (architecture §4.1).

        Raises:
            BootstrapError: on any failure; nothing was advanced, no model changed.
        """
        if self.base_url is None:
            raise BootstrapError("no config service URL configured")
        async with self._client() as client:
            epoch, b_hash, bc_hash = await self.fetch_epoch(client)
            listing = self._json(await self._get(client, "/v1/configs/bundles"))
            bundles = []
            try:
                ids = [b["bundle_id"] for b in listing["bundles"]]
            except (KeyError, TypeError) as exc:
                raise BootstrapError("/v1/configs/bundles: unexpected body") from exc
            for bid in ids:
                r = await self._get(client, f"/v1/configs/bundles/{bid}")
                try:
                    doc = load_yaml(r.content, what=f"bundle {bid!r}")
                    doc.pop("source", None)  # read-surface annotation, not bundle content
                    bundles.append(parse_bundle(doc, default_name=bid))
                except SieError as exc:
                    raise BootstrapError(f"bundle {bid!r}: {exc.message}") from exc
            export = self._json(await self._get(client, "/v1/configs/export"))
        configs, failed, total = self._parse_export(export, bundles)
        if failed:
            raise BootstrapError(f"export: {failed} of {total} model entries failed to apply")
        try:  # two ids on one subject token: refused before anything changes
            check_subject_tokens(c for c, _ in configs)
        except SieError as exc:
            raise BootstrapError(f"export: {exc.message}") from exc
        self.registry.install_bundles(bundles)
        self.registry.replace_models(configs)
        export_epoch = int(export.get("epoch", epoch))
        self.epoch.set_max(export_epoch)
        self.bundles_hash, self.bundle_config_hashes_hash = b_hash, bc_hash
        self._record_success()
        self._changed()
        return BootstrapOutcome(export_epoch, b_hash, bc_hash, len(configs), failed, total)

    def _parse_export(
        self, export: Any, bundles: Iterable[Bundle]
    ) -> tuple[list[tuple[ModelConfig, str]], int, int]:
        rows = export.get("models") if isinstance(export, dict) else None
        if not isinstance(rows, list):
            raise BootstrapError("/v1/configs/export: no 'models' list")
        configs: list[tuple[ModelConfig, str]] = []
        failed = total = 0
        probe = ModelRegistry()
        probe.install_bundles(bundles)
        for row in rows:
            body = row.get("model_config") or row.get("raw_yaml") if isinstance(row, dict) else None
            if not body:
                continue  # rows without a body are skipped, not failures (§4.1 step 3)
            total += 1
            try:
                cfg = parse_model_config(body, what=f"export entry {row.get('model_id')!r}")
                probe.validate_model_config(cfg)
            except SieError as exc:
                log.warning("config export entry rejected: %s", exc.message)
                failed += 1
                continue
            configs.append((cfg, str(row.get("source") or SOURCE_API)))
        return configs, failed, total

    def _record_success(self) -> None:
        if self.degraded:
            log.info("config bootstrap recovered after %d failed attempts", self.failures)
        self.bootstrapped = True
        self.failures = 0
        self._first_failure = None
        self.degraded = False
        self._op("bootstrap", "success")
        self._set_gauges()

    def _record_failure(self, exc: BootstrapError) -> None:
        now = time.monotonic()
        self.failures += 1
        self._first_failure = self._first_failure or now
        self._op("bootstrap", "failure")
        if (
            self.failures >= DEGRADED_AFTER_FAILURES
            or now - self._first_failure >= DEGRADED_AFTER_S
        ):
            self.degraded = True
            log.error("config bootstrap failing (%d attempts): %s", self.failures, exc)
        else:
            log.warning("config bootstrap attempt %d failed: %s", self.failures, exc)
        self._set_gauges()

    # -- poller --------------------------------------------------------------------------

    async def poll_once(self) -> str:
        """One poller tick; returns the decision taken (for logs and tests):
        ``error``, ``in_sync``, ``resynced``, ``recovered`` or ``resync_failed``."""
        try:
            async with self._client() as client:
                remote, r_bh, r_bchh = await self.fetch_epoch(client)
        except BootstrapError as exc:
            log.warning("config epoch poll failed: %s", exc)
            self._op("poll", "error")
            return "error"
        local = self.epoch.get()
        try:
            if remote < local:
                log.error(
                    "config epoch went backwards (remote %d < local %d): re-exporting",
                    remote,
                    local,
                )
                outcome = await self.bootstrap_once()
                self.epoch.force_set(outcome.epoch)
                self._op("poll", "recovered")
                return "recovered"
            drift = (
                remote > local
                or (r_bh != "" and r_bh != self.bundles_hash)
                or (r_bchh != "" and r_bchh != self.bundle_config_hashes_hash)
            )
            if drift:
                await self.bootstrap_once()
                self._op("poll", "resynced")
                return "resynced"
        except BootstrapError as exc:
            self._record_failure(exc)
            return "resync_failed"
        self._op("poll", "in_sync")
        return "in_sync"

    # -- live deltas ---------------------------------------------------------------------

    def handle_delta(self, data: bytes) -> str:
        """Apply one ``ConfigNotification``; returns the outcome: ``untrusted``,
        ``bad_payload``, ``epoch_bump``, ``bad_yaml``, ``rejected`` or ``applied``."""
        parsed = self._parse_delta(data)
        return self._finish(parsed if isinstance(parsed, str) else self._apply_parsed(*parsed))

    async def handle_delta_async(self, data: bytes) -> str:
        """``handle_delta`` for an event loop: decoding and the pure-Python YAML parse
        (up to about a second for a config at ``MAX_YAML_NODES``) run in a worker
        thread; the registry change runs on the caller's loop, one delta at a time in
        arrival order (docs/security.md "Config role")."""
        parsed = await anyio.to_thread.run_sync(self._parse_delta, data)
        return self._finish(parsed if isinstance(parsed, str) else self._apply_parsed(*parsed))

    def _finish(self, outcome: str) -> str:
        if self.metrics is not None:
            self.metrics.config_deltas.labels(self.role, outcome).inc()
        self._set_gauges()
        return outcome

    def _parse_delta(self, data: bytes) -> str | tuple[ConfigNotification, ModelConfig | None]:
        """Decode, check the producer and parse the YAML; touches no state (safe in a
        thread). An outcome string when the delta stops here, else ``(note, config)``
        (config None: a pure epoch bump)."""
        try:
            note = ConfigNotification.from_bytes(data)
        except SieError as exc:
            log.warning("dropping unparseable config delta: %s", exc.message)
            return "bad_payload"
        if not self.trust_any_producer and not producer_trusted(
            note.router_id, self.trusted_producers
        ):
            log.warning("dropping config delta from untrusted producer %r", note.router_id)
            return "untrusted"
        if not note.model_config_yaml.strip():
            return note, None
        try:
            cfg = parse_model_config(note.model_config_yaml.encode(), what="config delta")
        except SieError as exc:
            log.warning("config delta for %s has a bad body: %s", note.model_id, exc.message)
            return "bad_yaml"
        return note, cfg

    def _apply_parsed(self, note: ConfigNotification, cfg: ModelConfig | None) -> str:
        if cfg is None:
            self.epoch.set_max(note.epoch)
            return "epoch_bump"
        try:
            result = self.registry.add_model_config(cfg, SOURCE_API)
        except SieError as exc:
            log.warning("config delta for %s rejected: %s", cfg.sie_id, exc.message)
            return "rejected"
        self.epoch.set_max(note.epoch)
        # Hash parity (§7): once applied, our own fingerprints are what the authority
        # advertises for the same state, so the next poll need not re-export.
        snap = self.registry.snapshot
        self.bundles_hash = snap.bundles_hash()
        self.bundle_config_hashes_hash = snap.bundle_config_hashes_hash()
        if result.created:
            self._changed()
        return "applied"

    # -- metrics -------------------------------------------------------------------------

    def _op(self, operation: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.config_operations.labels(self.role, operation, outcome).inc()

    def _set_gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.config_epoch.labels(self.role).set(self.epoch.get())
            self.metrics.config_bootstrap_degraded.labels(self.role).set(int(self.degraded))


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default verifying context, built once per process: building it loads the
    CA bundle, about 30 ms of event-loop time that each poll's client used to pay."""
    return httpx.create_ssl_context()
