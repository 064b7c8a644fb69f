"""ModelRegistry: model configs and bundles, and model → bundle resolution.

Readers see an immutable ``RegistrySnapshot`` swapped atomically by writers
(architecture §3 step 3.4: "readers never observe a torn state"); writers
serialise on a lock. Resolution is architecture §16.1: take the requested
profile's ``adapter_path`` module, find every bundle listing it, prefer the
lowest ``priority`` (ties broken by name). The base id means the ``default``
profile; every other profile ``p`` of model ``m`` is routable as ``m:p``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from sie.core.config import DEFAULT_PROFILE, Bundle, ModelConfig, ResolvedProfile
from sie.core.errors import ModelNotFound, UnroutableModel

__all__ = ["ModelEntry", "ModelRegistry", "RegistrySnapshot"]


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One routable model identity (a base id or a ``base:profile`` variant).

    Attributes:
        model_id: the public id (``base`` or ``base:profile``).
        config: the base model's config.
        profile: the resolved profile this id runs.
        bundles: compatible bundle names, best (lowest priority) first; never empty.
    """

    model_id: str
    config: ModelConfig
    profile: ResolvedProfile
    bundles: tuple[str, ...]

    @property
    def base_id(self) -> str:
        return self.config.sie_id

    @property
    def bundle(self) -> str:
        """The bundle this id routes to by default."""
        return self.bundles[0]


@dataclass(frozen=True, slots=True)
class RegistrySnapshot:
    """An immutable view: bundles, base configs and every routable entry."""

    bundles: Mapping[str, Bundle] = field(default_factory=lambda: MappingProxyType({}))
    configs: Mapping[str, ModelConfig] = field(default_factory=lambda: MappingProxyType({}))
    entries: Mapping[str, ModelEntry] = field(default_factory=lambda: MappingProxyType({}))

    def bundles_for_module(self, module: str) -> tuple[str, ...]:
        """Bundle names listing ``module``, lowest priority first."""
        hits = [b for b in self.bundles.values() if module in b.adapters]
        hits.sort(key=lambda b: (b.priority, b.name))
        return tuple(b.name for b in hits)


def _entries_for(
    snapshot_bundles: Mapping[str, Bundle], config: ModelConfig
) -> dict[str, ModelEntry]:
    probe = RegistrySnapshot(bundles=snapshot_bundles)
    out: dict[str, ModelEntry] = {}
    for name in config.profiles:
        prof = config.resolve_profile(name)
        bundles = probe.bundles_for_module(prof.adapter_module)
        if not bundles:
            continue
        model_id = config.sie_id if name == DEFAULT_PROFILE else f"{config.sie_id}:{name}"
        out[model_id] = ModelEntry(model_id=model_id, config=config, profile=prof, bundles=bundles)
    return out


class ModelRegistry:
    """Thread-safe holder of the current ``RegistrySnapshot``."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._snapshot = RegistrySnapshot()

    @property
    def snapshot(self) -> RegistrySnapshot:
        """The current snapshot; lock-free, never torn."""
        return self._snapshot

    def _rebuild(self, bundles: Mapping[str, Bundle], configs: Mapping[str, ModelConfig]) -> None:
        entries: dict[str, ModelEntry] = {}
        for cfg in configs.values():
            entries.update(_entries_for(bundles, cfg))
        self._snapshot = RegistrySnapshot(
            bundles=MappingProxyType(dict(bundles)),
            configs=MappingProxyType(dict(configs)),
            entries=MappingProxyType(entries),
        )

    def install_bundles(self, bundles: Iterable[Bundle]) -> None:
        """Atomically replace the bundle set and recompute every model's bundles."""
        with self._lock:
            self._rebuild({b.name: b for b in bundles}, self._snapshot.configs)

    def validate_model_config(self, config: ModelConfig) -> dict[str, tuple[str, ...]]:
        """Pure check: the routable bundles of each profile of ``config``.

        Returns:
            ``{profile_name: bundles}`` for profiles that at least one bundle serves.

        Raises:
            UnroutableModel: no profile of the model resolves to any bundle (422).
        """
        entries = _entries_for(self._snapshot.bundles, config)
        if not entries:
            modules = sorted({config.resolve_profile(p).adapter_module for p in config.profiles})
            raise UnroutableModel(
                f"model {config.sie_id!r}: no bundle lists adapter module(s) {modules}",
                model=config.sie_id,
                adapter_modules=modules,
            )
        return {e.profile.name: e.bundles for e in entries.values()}

    def add_model_config(self, config: ModelConfig) -> dict[str, tuple[str, ...]]:
        """Insert or replace a model config (validated, then swapped in atomically).

        Returns:
            ``{profile_name: bundles}`` (see ``validate_model_config``).

        Raises:
            UnroutableModel: as ``validate_model_config``.
        """
        with self._lock:
            routable = self.validate_model_config(config)
            configs = dict(self._snapshot.configs)
            configs[config.sie_id] = config
            self._rebuild(self._snapshot.bundles, configs)
            return routable

    def resolve(self, model_id: str, bundle: str | None = None) -> tuple[ModelEntry, str]:
        """Map a public model id (optionally pinned to a bundle) to its entry and bundle.

        ``model:default`` is the base id (architecture §16.3).

        Raises:
            ModelNotFound: unknown id, or ``bundle`` not compatible with it.
        """
        entry = self._snapshot.entries.get(model_id)
        if entry is None and model_id.endswith(":" + DEFAULT_PROFILE):
            entry = self._snapshot.entries.get(model_id[: -len(DEFAULT_PROFILE) - 1])
        if entry is None:
            raise ModelNotFound(f"model {model_id!r} not found", model=model_id)
        if bundle is None:
            return entry, entry.bundle
        if bundle not in entry.bundles:
            raise ModelNotFound(
                f"model {model_id!r} is not served by bundle {bundle!r}",
                model=model_id,
                compatible_bundles=list(entry.bundles),
            )
        return entry, bundle
