"""The config authority: the write path of architecture §3, export and epoch (§4.1, §9).

``ConfigAuthority.write`` runs §3 step by step:

1. (the HTTP layer has checked auth and the 1 MiB body cap)
2. the delta publisher is configured but disconnected → 503 ``NATS_UNAVAILABLE``;
   ``Idempotency-Key`` handling (``IdempotencyCache``);
3. pre-lock validation, in a worker thread, one body at a time: YAML parse within
   the bounds of docs/security.md "Limits" (``MAX_CONFIG_TOKENS`` line breaks and
   flow separators, counted before parsing, then ``load_yaml``'s node, depth and
   character bounds: 400 ``PARSE_ERROR``), ``sie_id`` rules (400
   ``INVALID_MODEL_ID``) — before any state is touched;
4. under one async write lock: a new model past ``max_models``
   (``SIE_CONFIG_MAX_MODELS``) is refused (409 ``MODEL_LIMIT_EXCEEDED``); merge and
   validate (``ModelRegistry.plan_write``: 422 / 409 / 409 ``MODEL_ID_CONFLICT`` /
   422 unroutable); a no-op replay returns 200 and skips disk, epoch
   and publish; the operator's trust policy (``sie.core.trust``, docs/security.md
   "Trust model": weights roots, remote code, upstream URLs and key names) refuses
   with 422 naming the field; otherwise, shielded from cancellation: persist the merged
   document and the new epoch (a store failure rolls the model file back and
   leaves registry and epoch untouched: 503 ``STORE_UNAVAILABLE``), mutate the
   registry, advance the epoch, publish one ``ConfigNotification`` per affected
   bundle on ``sie.config.models.{bundle}`` and a copy on ``sie.config.models._all``
   (failures become ``warnings``; the write stays durable).

Unlike some config services, the epoch advances on
every creating write even without a store (in memory), so gateways can always
detect drift.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any, Protocol

import anyio

from sie.control.catalog import dump_limiter
from sie.control.idempotency import IdempotencyCache, Reply
from sie.control.store import ConfigStore
from sie.core.config import (
    DEFAULT_PROFILE,
    ModelConfig,
    dump_yaml,
    load_yaml,
    parse_model_config,
    validate_model_id,
)
from sie.core.epoch import ConfigEpoch
from sie.core.errors import (
    ContentConflict,
    ModelLimitExceeded,
    ParseError,
    PayloadTooLarge,
    PublisherUnavailable,
    RegistryUnavailable,
    SieError,
)
from sie.core.merge import MergeResult, document_of
from sie.core.registry import SOURCE_API, ModelRegistry
from sie.core.subjects import config_subject
from sie.core.trust import ConfigTrust
from sie.core.wire import ConfigNotification

__all__ = [
    "ALL_BUNDLES",
    "DEFAULT_MAX_MODELS",
    "MAX_CONFIG_BODY_BYTES",
    "MAX_CONFIG_TOKENS",
    "ConfigAuthority",
    "Publisher",
]

log = logging.getLogger(__name__)
audit = logging.getLogger("sie.audit")

#: Body cap of ``POST /v1/configs/models`` (architecture §3): 1 MiB.
MAX_CONFIG_BODY_BYTES = 1024 * 1024
#: Structural items one config body may have: line breaks (``\n``, ``\r``, ``\r\n``
#: once, NEL, LS, PS) plus ``,``, ``[`` and ``{`` (``sie.core.config.structural_tokens``),
#: counted at C speed before the pure-Python parse; a legitimate config (<= 256
#: profiles) is far below this (docs/security.md "Limits").
MAX_CONFIG_TOKENS = 10_000
#: Default most models the authority holds (``SIE_CONFIG_MAX_MODELS``).
DEFAULT_MAX_MODELS = 1_000
#: The gateways' copy of every delta: ``sie.config.models._all``.
ALL_BUNDLES = "_all"


class Publisher(Protocol):
    """What the authority needs of the bus (``sie.transport.base.Bus`` satisfies it)."""

    @property
    def is_connected(self) -> bool: ...

    async def publish(self, subject: str, data: bytes) -> None: ...


class ConfigAuthority:
    """The single writer of model configs.

    Args:
        registry: the authoritative registry, or None when it failed to load
            (every registry-dependent call then raises ``RegistryUnavailable``).
        store: durable store, or None (in-memory only: writes die with the process).
        publisher: delta publisher, or None (no deltas; gateways converge by polling).
        producer_id: this process's id on the wire (``router_id`` of each delta).
        epoch: the current epoch (loaded from the store by the caller).
        registry_error: why the registry failed to load, for the 503 message.
        trust: what a write may ask of workers (``sie.core.trust``; docs/security.md
            "Trust model"); default: nothing (no ``weights_path``, remote code, upstream).
        max_models: most models the registry may hold for a write to create another
            (``SIE_CONFIG_MAX_MODELS``; docs/security.md "Config role"). Writes to
            existing models are never refused by it; seed and restored models count
            but are not refused.
    """

    def __init__(
        self,
        registry: ModelRegistry | None,
        *,
        store: ConfigStore | None = None,
        publisher: Publisher | None = None,
        producer_id: str = "standalone",
        epoch: ConfigEpoch | None = None,
        registry_error: str | None = None,
        on_publish: Any = None,
        trust: ConfigTrust | None = None,
        max_models: int = DEFAULT_MAX_MODELS,
    ) -> None:
        self.registry = registry
        self.max_models = max_models
        self.store = store
        self.publisher = publisher
        self.producer_id = producer_id
        self.epoch = epoch or ConfigEpoch()
        self.registry_error = registry_error
        self.idempotency = IdempotencyCache()
        self.lock = anyio.Lock()
        self._parse_limiter = anyio.CapacityLimiter(1)
        self._on_publish = on_publish  # callable(result: str) for metrics
        self.trust = trust if trust is not None else ConfigTrust()

    # -- reads ---------------------------------------------------------------------------

    def require_registry(self) -> ModelRegistry:
        """Raises: RegistryUnavailable (503, architecture §11 caveat 8)."""
        if self.registry is None:
            raise RegistryUnavailable(
                f"model registry not loaded: {self.registry_error or 'unknown error'}"
            )
        return self.registry

    def epoch_info(self) -> dict[str, Any]:
        """``{epoch, bundles_hash, bundle_config_hashes_hash}``; works without a registry
        (hashes ``""``, the poller's "registry unavailable" sentinel, §4.2)."""
        snap = self.registry.snapshot if self.registry is not None else None
        return {
            "epoch": self.epoch.get(),
            "bundles_hash": snap.bundles_hash() if snap else "",
            "bundle_config_hashes_hash": snap.bundle_config_hashes_hash() if snap else "",
        }

    async def export(self) -> dict[str, Any]:
        """The authoritative snapshot, taken under the write lock so ``(epoch, models)``
        is a real serialisation point (architecture §3, §7).

        Raises:
            RegistryUnavailable.
        """
        registry = self.require_registry()
        async with self.lock:
            snap = registry.snapshot
            epoch = self.epoch.get()

        def rows() -> list[dict[str, Any]]:  # pure Python per model: not on the loop
            return [
                {
                    "model_id": model_id,
                    "model_config": document_of(snap.configs[model_id]),
                    "raw_yaml": snap.config_yaml(model_id),  # dumped once per config
                    "affected_bundles": snap.bundles_of_model(model_id),
                    "source": snap.sources.get(model_id, SOURCE_API),
                }
                for model_id in sorted(snap.configs)
            ]

        models = await anyio.to_thread.run_sync(rows, limiter=dump_limiter())
        return {
            "snapshot_version": 1,
            "epoch": epoch,
            "generated_at": dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z"),
            "bundles_hash": snap.bundles_hash(),
            "bundle_config_hashes_hash": snap.bundle_config_hashes_hash(),
            "models": models,
        }

    # -- the write path ------------------------------------------------------------------

    async def write(self, body: bytes, idempotency_key: str | None = None) -> Reply:
        """``POST /v1/configs/models``: returns ``(status, json)`` — 201 created, 200 no-op.

        Raises:
            RegistryUnavailable, PublisherUnavailable (503); PayloadTooLarge (413);
            ParseError, InvalidModelId (400); ValidationFailed (also a config the
            operator's ``ConfigTrust`` refuses, naming the field), UnroutableModel,
            IdempotencyMismatch (422); ContentConflict, ModelIdConflict,
            ModelLimitExceeded (409); StoreUnavailable (503);
            IdempotentInflightCancelled (503).
        """
        self.require_registry()
        if self.publisher is not None and not self.publisher.is_connected:
            raise PublisherUnavailable(
                "the config delta publisher is disconnected; the write was not applied, retry"
            )
        if len(body) > MAX_CONFIG_BODY_BYTES:
            raise PayloadTooLarge(
                f"body: {len(body)} bytes exceeds the {MAX_CONFIG_BODY_BYTES} byte limit",
                field="body",
            )
        if idempotency_key:
            return await self.idempotency.run(idempotency_key, body, lambda: self._write(body))
        return await self._write(body)

    def _prevalidate(self, body: bytes) -> dict[str, Any]:
        """Runs in a worker thread. Raises: ParseError, InvalidModelId (400)."""
        if not body.strip():
            raise ParseError("body: empty; send a model config YAML document", field="body")
        doc = load_yaml(body, what="body", max_tokens=MAX_CONFIG_TOKENS)
        sie_id = doc.get("sie_id")
        if isinstance(sie_id, str):
            validate_model_id(sie_id)
        return doc

    async def _write(self, body: bytes) -> Reply:
        registry = self.require_registry()
        # YAML parsing is pure Python: off the event loop, one document at a time
        doc = await anyio.to_thread.run_sync(self._prevalidate, body, limiter=self._parse_limiter)
        async with self.lock:
            self._check_model_count(registry, doc.get("sie_id"))
            plan = registry.plan_write(doc, await self._stored(doc.get("sie_id")))
            if not plan.created:
                return 200, self._reply(registry, plan, [])
            # the operator's trust policy on the merged config (its top-level fields and
            # the resolved loadtime of each new profile): 422 naming the field, before
            # anything is persisted
            self.trust.check(plan.config, plan.created)
            # the registry must accept the merged document as it stands now: checked
            # before anything is persisted, so a refusal leaves the store untouched
            registry.plan_write(document_of(plan.config))
            # commit: finish whatever the client does; no checkpoint between here and the
            # return, so a deferred cancellation cannot lose the committed reply
            with anyio.CancelScope(shield=True):
                reply = await self._commit(registry, plan)
            return reply

    def _check_model_count(self, registry: ModelRegistry, sie_id: Any) -> None:
        """Raises: ModelLimitExceeded (409) when ``sie_id`` is new and the registry
        already holds ``max_models`` models."""
        configs = registry.snapshot.configs
        if not isinstance(sie_id, str) or sie_id in configs or len(configs) < self.max_models:
            return  # a missing or non-string id is plan_write's 422
        raise ModelLimitExceeded(
            f"the config authority holds {len(configs)} models, its limit "
            f"(SIE_CONFIG_MAX_MODELS={self.max_models}): a new model cannot be added; "
            "writes to existing models still work",
            field="sie_id",
            limit=self.max_models,
        )

    async def _stored(self, sie_id: Any) -> ModelConfig | None:
        """The model's stored document, if the store holds one.

        Raises:
            ContentConflict: the file for ``sie_id`` belongs to another model (the
                ``/`` → ``__`` mapping collides) or cannot be read: refusing is safer
                than overwriting acknowledged profiles.
        """
        if self.store is None or not isinstance(sie_id, str):
            return None
        text = await anyio.to_thread.run_sync(self.store.read_model, sie_id)
        if text is None:
            return None
        try:  # pure Python, up to about a second at the node bound: a thread
            stored = await anyio.to_thread.run_sync(
                lambda: parse_model_config(text.encode(), what=f"stored model {sie_id!r}"),
                limiter=self._parse_limiter,
            )
        except SieError as exc:
            raise ContentConflict(
                f"the stored document for {sie_id!r} cannot be read ({exc.message}); "
                "repair the store before writing to this model",
                field="sie_id",
            ) from exc
        if stored.sie_id != sie_id:
            raise ContentConflict(
                f"sie_id {sie_id!r} maps to the same store file as the stored model "
                f"{stored.sie_id!r}; choose another id",
                field="sie_id",
                conflicting_model=stored.sie_id,
            )
        return stored

    async def _commit(self, registry: ModelRegistry, plan: MergeResult) -> Reply:
        model_id = plan.config.sie_id
        new_epoch = self.epoch.get() + 1
        # pure Python, up to about a second for a config at the node bound: a thread
        yaml_text = await anyio.to_thread.run_sync(dump_yaml, plan.document, limiter=dump_limiter())
        if self.store is not None:
            await anyio.to_thread.run_sync(self._persist, model_id, yaml_text, new_epoch)
        registry.add_model_config(plan.config, SOURCE_API)
        self.epoch.force_set(new_epoch)
        warnings = await self._publish(registry, plan, yaml_text, new_epoch)
        audit.info(
            "config.add_model model=%s created=%s epoch=%d", model_id, plan.created, new_epoch
        )
        return 201, self._reply(registry, plan, warnings)

    def _persist(self, model_id: str, yaml_text: str, new_epoch: int) -> None:
        """Model file, then epoch file; on an epoch failure put the old model file back
        byte for byte (or remove the new one)."""
        assert self.store is not None
        previous = self.store.read_model_raw(model_id)
        self.store.write_model(model_id, yaml_text, new_epoch)
        try:
            self.store.write_epoch(new_epoch)
        except SieError:
            try:
                if previous is None:
                    self.store.delete_model(model_id)
                else:
                    self.store.write_model_raw(model_id, previous)
            except SieError:
                log.exception("config store rollback of %s failed", model_id)
            raise

    async def _publish(
        self, registry: ModelRegistry, plan: MergeResult, yaml_text: str, epoch: int
    ) -> list[str]:
        if self.publisher is None:
            return []
        snap = registry.snapshot
        cfg = snap.configs[plan.config.sie_id]
        affected = sorted(
            {
                b
                for p in plan.created
                for b in snap.bundles_for_module(cfg.resolve_profile(p).adapter_module)
            },
            key=lambda n: (snap.bundles[n].priority, n),
        )
        pool_hashes = snap.bundle_pool_config_hashes(affected)
        failed: list[str] = []
        last_error = ""
        for bundle in affected:
            data = ConfigNotification(
                router_id=self.producer_id,
                bundle_id=bundle,
                epoch=epoch,
                bundle_config_hash=snap.bundle_config_hash(bundle),
                bundle_pool_config_hashes={bundle: pool_hashes.get(bundle, {})},
                model_id=cfg.sie_id,
                pool=cfg.effective_pool,
                profiles_added=plan.created,
                model_config_yaml=yaml_text,
                affected_bundles=affected,
            ).to_bytes()
            try:
                await self.publisher.publish(config_subject(bundle), data)
                await self.publisher.publish(config_subject(ALL_BUNDLES), data)
            except Exception as exc:  # any publisher failure is a warning, not a failed write
                log.warning("config delta for bundle %s not published: %s", bundle, exc)
                failed.append(bundle)
                last_error = str(exc)
        if not failed:
            self._count("success")
            return []
        if len(failed) < len(affected):
            self._count("partial")
            return [
                f"nats_publish_partial: failed to publish to {len(failed)} bundle(s) {failed}: "
                f"{last_error}; gateways converge through the epoch poller"
            ]
        self._count("failure")
        return [
            f"nats_publish_failed: {last_error}; the write is durable and gateways converge "
            "through the epoch poller"
        ]

    def _count(self, result: str) -> None:
        if self._on_publish is not None:
            self._on_publish(result)

    def _reply(
        self, registry: ModelRegistry, plan: MergeResult, warnings: list[str]
    ) -> dict[str, Any]:
        snap = registry.snapshot
        sie_id = plan.config.sie_id
        routable: dict[str, list[str]] = {}
        for p in [*plan.created, *plan.skipped]:
            entry = snap.entries.get(sie_id if p == DEFAULT_PROFILE else f"{sie_id}:{p}")
            routable[p] = list(entry.bundles) if entry is not None else []
        return {
            "model_id": sie_id,
            "created_profiles": plan.created,
            "existing_profiles_skipped": plan.skipped,
            "warnings": warnings,
            "routable_bundles_by_profile": routable,
            "router_id": self.producer_id if self.publisher is not None else "standalone",
            "epoch": self.epoch.get(),
        }
