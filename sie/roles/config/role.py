"""The config role: the single writer of model configs (architecture §3, §9, §11).

Startup (architecture §1): load the registry from ``--bundles-dir`` and
``--models-dir`` (a failure leaves the registry unset and the role running, so
``/v1/configs/epoch`` still answers and ``/readyz`` says 503
``REGISTRY_UNAVAILABLE``, §11 caveat 8) → open the ConfigStore and read its epoch
(a store that cannot be read fails startup: carrying on at epoch 0 would move the
epoch backwards) → with ``SIE_CONFIG_RESTORE=true`` replay stored models into the
registry. The bus is the delta publisher.
"""

from __future__ import annotations

import logging

import anyio
import anyio.abc

from sie.control.authority import ConfigAuthority, Publisher
from sie.control.seed import load_bundles, load_models
from sie.control.store import ConfigStore
from sie.core.config import parse_model_config
from sie.core.epoch import ConfigEpoch
from sie.core.errors import ContentConflict, SieError
from sie.core.registry import SOURCE_API, SOURCE_FILESYSTEM, ModelRegistry
from sie.core.trust import ConfigTrust
from sie.settings_views import ConfigRoleSettings
from sie.telemetry import METRICS, Metrics

__all__ = ["ConfigRole", "load_authority_registry"]

log = logging.getLogger(__name__)


def load_authority_registry(
    settings: ConfigRoleSettings,
) -> tuple[ModelRegistry | None, str | None]:
    """``(registry, None)``, or ``(None, reason)`` when the seed cannot be loaded."""
    registry = ModelRegistry()
    try:
        if settings.bundles_dir:
            registry.install_bundles(load_bundles(settings.bundles_dir))
        if settings.models_dir:
            for cfg in load_models(settings.models_dir):
                try:
                    registry.add_model_config(cfg, SOURCE_FILESYSTEM)
                except SieError as exc:
                    log.warning("seed model %s is not routable: %s", cfg.sie_id, exc.message)
    except SieError as exc:
        log.error("config registry failed to load: %s", exc.message)
        return None, exc.message
    return registry, None


def restore(registry: ModelRegistry, store: ConfigStore) -> int:
    """Replay stored models into ``registry`` (stored documents win conflicts)."""
    n = 0
    for model_id, text in store.load_all():
        try:
            cfg = parse_model_config(text.encode(), what=f"stored model {model_id!r}")
        except SieError as exc:
            log.error("skipping unreadable stored model %s: %s", model_id, exc.message)
            continue
        try:
            registry.add_model_config(cfg, SOURCE_API)
        except ContentConflict:
            log.warning("stored %s differs from the seed: the stored document wins", model_id)
            snap = registry.snapshot
            rows = [(c, snap.sources.get(k, SOURCE_API)) for k, c in snap.configs.items()]
            registry.replace_models(
                [*(r for r in rows if r[0].sie_id != model_id), (cfg, SOURCE_API)]
            )
        except SieError as exc:
            log.error("stored model %s no longer applies: %s", model_id, exc.message)
            continue
        n += 1
    return n


class ConfigRole:
    """Holds the ``ConfigAuthority``. Start ``run`` in a task group.

    Built by ``ConfigRole.open`` (which reads the seed and the store); the constructor
    itself does no I/O.
    """

    def __init__(
        self, settings: ConfigRoleSettings, authority: ConfigAuthority, metrics: Metrics = METRICS
    ) -> None:
        self.settings = settings
        self.authority = authority
        self.metrics = metrics
        metrics.config_epoch.labels("config").set(authority.epoch.get())

    @classmethod
    def open(
        cls,
        settings: ConfigRoleSettings,
        publisher: Publisher | None,
        metrics: Metrics = METRICS,
        *,
        store: ConfigStore | None,
        trust: ConfigTrust,
    ) -> ConfigRole:
        """Load the seed (``SIE_MODELS_DIR``, ``SIE_BUNDLES_DIR``), read the store's
        epoch, replay the store when ``SIE_CONFIG_RESTORE`` is on, and build the role. A seed that does not load leaves the authority without a
        registry (its routes answer 503 ``registry_unavailable``).

        ``store``: the config store (``SIE_CONFIG_STORE_DIR``; None: in memory only);
        ``trust``: what writes may ask of workers, checked before anything is persisted
        (``sie.roles.trust.config_trust``; docs/security.md "Trust model"). Seed and
        restored configs are not checked here: workers check every load.

        Raises:
            SieError: the store cannot be read.
        """
        registry, error = load_authority_registry(settings)
        epoch = ConfigEpoch(store.read_epoch() if store is not None else 0)
        if store is not None and settings.config_restore and registry is not None:
            n = restore(registry, store)
            log.info("restored %d model config(s) from %s (epoch %d)", n, store.url, epoch.get())
        elif store is not None and registry is not None:
            unserved = [m for m in store.list_models() if m not in registry.snapshot.configs]
            if unserved:
                log.warning(
                    "%d stored model config(s) are not served because SIE_CONFIG_RESTORE is "
                    "off (e.g. %s); gateways will drop them at their next resync",
                    len(unserved),
                    ", ".join(unserved[:3]),
                )
        authority = ConfigAuthority(
            registry,
            store=store,
            publisher=publisher,
            producer_id=settings.config_producer_id,
            epoch=epoch,
            registry_error=error,
            on_publish=lambda result: metrics.config_publishes.labels(result).inc(),
            trust=trust,
            max_models=settings.config_max_models,
        )
        return cls(settings, authority, metrics)

    @property
    def registry(self) -> ModelRegistry | None:
        return self.authority.registry

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        await anyio.sleep_forever()
