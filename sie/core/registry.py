"""ModelRegistry: model configs and bundles, and model → bundle resolution.

Readers see an immutable ``RegistrySnapshot`` swapped atomically by writers
(architecture §3 step 3.4: "readers never observe a torn state"); writers
serialise on a lock. Resolution is architecture §16.1: take the requested
profile's ``adapter_path`` module, find every bundle listing it, prefer the
lowest ``priority`` (ties broken by name). The base id means the ``default``
profile; every other profile ``p`` of model ``m`` is routable as ``m:p``.

Two models never share a NATS subject token (``normalize_model_id``, architecture
§8.2: ``sec/x.y`` and ``sec/x_dot_y`` are both ``sec__x_dot_y``): every path into the
registry (config writes, seed files, restore, deltas, exports) refuses the second
with ``ModelIdConflict`` (409), naming both.

Each snapshot also serves its configs as YAML (``config_yaml``): dumped once per
immutable config, cached across snapshots while that config is served, so a read
never re-dumps (docs/security.md "Config role").
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from sie.core.config import DEFAULT_PROFILE, Bundle, ModelConfig, ResolvedProfile, dump_yaml
from sie.core.errors import ModelIdConflict, ModelNotFound, UnroutableModel, echo
from sie.core.hashing import (
    bundle_config_hash,
    bundle_config_hashes_hash,
    bundle_pool_config_hashes,
    bundles_hash,
)
from sie.core.merge import MergeResult, document_of, merge_model_write
from sie.core.subjects import normalize_model_id
from sie.core.suggest import model_not_found

__all__ = [
    "SOURCE_API",
    "SOURCE_FILESYSTEM",
    "YAML_CACHE_CHARS",
    "ModelEntry",
    "ModelRegistry",
    "RegistrySnapshot",
    "check_subject_tokens",
    "subject_token",
]

#: Where a model config came from (docs/api.md §8 ``source``).
SOURCE_API = "api"
SOURCE_FILESYSTEM = "filesystem"
#: Most characters of dumped YAML one registry keeps cached (least recently read go).
YAML_CACHE_CHARS = 64 * 1024 * 1024


class _YamlCache:
    """``model id → (config, YAML text)``, shared by a registry's snapshots. An entry
    is used only while ``config`` is the very object served (configs are frozen and
    replaced, never changed), so a stale dump is never returned. Thread-safe."""

    def __init__(self, max_chars: int = YAML_CACHE_CHARS) -> None:
        self.max_chars = max_chars
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[ModelConfig, str]] = OrderedDict()
        self._chars = 0

    def get(self, model_id: str, config: ModelConfig) -> str | None:
        with self._lock:
            hit = self._entries.get(model_id)
            if hit is None or hit[0] is not config:
                return None
            self._entries.move_to_end(model_id)
            return hit[1]

    def put(self, model_id: str, config: ModelConfig, text: str) -> None:
        with self._lock:
            old = self._entries.pop(model_id, None)
            if old is not None:
                self._chars -= len(old[1])
            self._entries[model_id] = (config, text)
            self._chars += len(text)
            while self._chars > self.max_chars and len(self._entries) > 1:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._chars -= len(dropped)


def subject_token(model_id: str) -> str:
    """The NATS subject token a model id travels as (``normalize_model_id``, §8.2)."""
    return normalize_model_id(model_id)


def check_subject_tokens(configs: Iterable[ModelConfig]) -> dict[str, str]:
    """``{subject token: sie_id}`` of a model set in which no two ids share a token.

    Raises:
        ModelIdConflict: 409 naming the second id (``field`` ``sie_id``), the first
            (``conflicting_model``) and the token.
    """
    owners: dict[str, str] = {}
    for cfg in configs:
        token = subject_token(cfg.sie_id)
        other = owners.setdefault(token, cfg.sie_id)
        if other != cfg.sie_id:
            raise _collision(cfg.sie_id, other, token)
    return owners


def _collision(sie_id: str, other: str, token: str) -> ModelIdConflict:
    return ModelIdConflict(
        f"sie_id {echo(sie_id)!r} maps to the NATS subject token {echo(token)!r} of the "
        f"existing model {other!r} ('/' is '__' and '.' is '_dot_' in subjects); "
        "choose another id",
        field="sie_id",
        conflicting_model=other,
        subject_token=token,
    )


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

    @property
    def load_key(self) -> tuple[Any, ...]:
        """What a loaded engine depends on: weights, shapes and the resolved profile.
        Appending another profile to the model leaves it unchanged (no reload)."""
        c = self.config
        return (
            c.hf_id,
            c.hf_revision,
            c.weights_path,
            c.package_backed,
            c.max_sequence_length,
            c.inputs,
            c.tasks,
            self.profile,
        )


@dataclass(frozen=True, slots=True)
class RegistrySnapshot:
    """An immutable view: bundles, base configs and every routable entry."""

    bundles: Mapping[str, Bundle] = field(default_factory=lambda: MappingProxyType({}))
    configs: Mapping[str, ModelConfig] = field(default_factory=lambda: MappingProxyType({}))
    entries: Mapping[str, ModelEntry] = field(default_factory=lambda: MappingProxyType({}))
    sources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: subject token → the one model id using it (``check_subject_tokens``)
    subject_owners: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: per-snapshot memo of fingerprints (architecture §5: O(1) per-request hash lookup)
    _cache: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    #: dumped YAML per served config, shared with the registry's other snapshots
    _yaml: _YamlCache = field(default_factory=_YamlCache, compare=False, repr=False)

    def cached_config_yaml(self, model_id: str) -> str | None:
        """The model's YAML if already dumped, else None (also for an unknown id): O(1),
        safe on an event loop."""
        cfg = self.configs.get(model_id)
        return self._yaml.get(model_id, cfg) if cfg is not None else None

    def config_yaml(self, model_id: str) -> str:
        """The model's full merged config (``document_of``) as YAML, dumped at most once
        per served config. A first dump costs about 50 µs of pure Python per node (up
        to ``MAX_YAML_NODES``): callers on an event loop run it in a thread
        (``sie.control.catalog.model_yaml_async``).

        Raises:
            KeyError: unknown ``model_id``.
        """
        cfg = self.configs[model_id]
        text = self._yaml.get(model_id, cfg)
        if text is None:
            text = dump_yaml(document_of(cfg))
            self._yaml.put(model_id, cfg, text)
        return text

    def bundles_for_module(self, module: str) -> tuple[str, ...]:
        """Bundle names listing ``module``, lowest priority first."""
        hits = [b for b in self.bundles.values() if b.runs(module)]
        hits.sort(key=lambda b: (b.priority, b.name))
        return tuple(b.name for b in hits)

    def bundles_of_model(self, sie_id: str) -> list[str]:
        """Every bundle serving some profile of ``sie_id``, lowest priority first."""
        cfg = self.configs.get(sie_id)
        if cfg is None:
            return []
        names = {
            b
            for p in cfg.profiles
            for b in self.bundles_for_module(cfg.resolve_profile(p).adapter_module)
        }
        return sorted(names, key=lambda n: (self.bundles[n].priority, n))

    def bundle_config_hash(self, bundle_id: str, pool: str | None = None) -> str:
        """§7 hash of ``bundle_id`` (scoped to ``pool`` when given); ``""`` if unknown."""
        key = ("bch", bundle_id, pool)
        if key not in self._cache:
            b = self.bundles.get(bundle_id)
            self._cache[key] = bundle_config_hash(self.configs.values(), b, pool) if b else ""
        return str(self._cache[key])

    def bundles_hash(self) -> str:
        if "bh" not in self._cache:
            self._cache["bh"] = bundles_hash(self.bundles.values())
        return str(self._cache["bh"])

    def bundle_config_hashes_hash(self) -> str:
        if "bchh" not in self._cache:
            self._cache["bchh"] = bundle_config_hashes_hash(
                self.configs.values(), self.bundles.values()
            )
        return str(self._cache["bchh"])

    def bundle_pool_config_hashes(self, bundle_ids: Iterable[str]) -> dict[str, dict[str, str]]:
        """``{bundle: {pool: hash}}`` for the named bundles (ConfigNotification, §8.3)."""
        bundles = [self.bundles[b] for b in bundle_ids if b in self.bundles]
        return bundle_pool_config_hashes(self.configs.values(), bundles)


def _entries_for(
    snapshot_bundles: Mapping[str, Bundle],
    config: ModelConfig,
    default_profiles: Mapping[str, str] | None = None,
) -> dict[str, ModelEntry]:
    """The routable ids of ``config``: the base id (its ``default`` profile) and
    ``id:profile`` per other profile whose adapter a bundle serves. With
    ``default_profiles`` naming a routable profile for this model, the base id serves
    that profile and ``id:default`` the ``default`` one (docs/performance.md "Choosing a
    MiniLM profile")."""
    probe = RegistrySnapshot(bundles=snapshot_bundles)
    out: dict[str, ModelEntry] = {}
    for name in config.profiles:
        prof = config.resolve_profile(name)
        bundles = probe.bundles_for_module(prof.adapter_module)
        if not bundles:
            continue
        model_id = config.sie_id if name == DEFAULT_PROFILE else f"{config.sie_id}:{name}"
        out[model_id] = ModelEntry(model_id=model_id, config=config, profile=prof, bundles=bundles)
    preferred = out.get(f"{config.sie_id}:{(default_profiles or {}).get(config.sie_id)}")
    base = out.get(config.sie_id)
    if preferred is not None and base is not None:
        out[f"{config.sie_id}:{DEFAULT_PROFILE}"] = replace(
            base, model_id=f"{config.sie_id}:{DEFAULT_PROFILE}"
        )
        out[config.sie_id] = replace(preferred, model_id=config.sie_id)
    return out


class ModelRegistry:
    """Thread-safe holder of the current ``RegistrySnapshot``.

    Reads are lock-free (``snapshot``); writes serialise on one lock across
    load → mutate → swap, so two writers never drop each other's change (§5).
    """

    def __init__(self, default_profiles: Mapping[str, str] | None = None) -> None:
        self._lock = threading.RLock()
        self._yaml = _YamlCache()
        self._snapshot = RegistrySnapshot(_yaml=self._yaml)
        #: bare model id → the profile its base id serves (``SIE_DEFAULT_PROFILES``)
        self.default_profiles: Mapping[str, str] = MappingProxyType(dict(default_profiles or {}))

    @property
    def snapshot(self) -> RegistrySnapshot:
        """The current snapshot; lock-free, never torn."""
        return self._snapshot

    def _rebuild(
        self,
        bundles: Mapping[str, Bundle],
        configs: Mapping[str, ModelConfig],
        sources: Mapping[str, str],
    ) -> None:
        """Raises: ModelIdConflict (nothing swapped)."""
        owners = check_subject_tokens(configs.values())
        entries: dict[str, ModelEntry] = {}
        for cfg in configs.values():
            entries.update(_entries_for(bundles, cfg, self.default_profiles))
        self._snapshot = RegistrySnapshot(
            bundles=MappingProxyType(dict(bundles)),
            configs=MappingProxyType(dict(configs)),
            entries=MappingProxyType(entries),
            sources=MappingProxyType({k: sources.get(k, SOURCE_API) for k in configs}),
            subject_owners=MappingProxyType(owners),
            _yaml=self._yaml,
        )

    def install_bundles(self, bundles: Iterable[Bundle]) -> None:
        """Atomically replace the bundle set and recompute every model's bundles."""
        with self._lock:
            snap = self._snapshot
            self._rebuild({b.name: b for b in bundles}, snap.configs, snap.sources)

    def validate_model_config(
        self, config: ModelConfig, profiles: Iterable[str] | None = None
    ) -> dict[str, tuple[str, ...]]:
        """Pure check (architecture §3 step 3.1): the routable bundles of each profile.

        Every profile in ``profiles`` (default: all) that names its own
        ``adapter_path`` must use an adapter module some bundle lists, and the
        model as a whole must resolve to at least one bundle. Extends-only
        profiles inherit their parent's routing.

        Returns:
            ``{profile_name: bundles}`` for the routable profiles.

        Raises:
            UnroutableModel: 422, naming the adapter modules no bundle lists.
        """
        snap = self._snapshot
        names = list(config.profiles) if profiles is None else list(profiles)
        missing = sorted(
            {
                config.resolve_profile(p).adapter_module
                for p in names
                if config.profiles[p].adapter_path is not None
                and not snap.bundles_for_module(config.resolve_profile(p).adapter_module)
            }
        )
        entries = _entries_for(snap.bundles, config, self.default_profiles)
        if missing or not entries:
            modules = missing or sorted(
                {config.resolve_profile(p).adapter_module for p in config.profiles}
            )
            raise UnroutableModel(
                f"model {config.sie_id!r}: adapter module(s) {modules} not in any known bundle "
                f"(bundles: {sorted(snap.bundles)})",
                model=config.sie_id,
                adapter_modules=modules,
            )
        return {e.profile.name: e.bundles for e in entries.values()}

    def plan_write(
        self, incoming: dict[str, Any], stored: ModelConfig | None = None
    ) -> MergeResult:
        """Merge a write into the current config and validate it; mutates nothing.

        ``stored`` is the model's durable document, when a store holds one: the write
        merges into the union of it and the served config, so the append-only rule
        holds against disk too, restored at start or not (architecture §3 step 3.3).

        Raises:
            ModelIdConflict: a new model whose subject token another model uses (409).
            ValidationFailed, ContentConflict: see ``merge_model_write``.
            UnroutableModel: a created profile (or the new model) has no bundle.
        """
        sie_id = str(incoming.get("sie_id"))
        current = self._snapshot.configs.get(sie_id)
        if current is None:
            token = subject_token(sie_id)
            owner = self._snapshot.subject_owners.get(token)
            if owner is not None and owner != sie_id:
                raise _collision(sie_id, owner, token)
        base = current
        if stored is not None:  # the union of what is served and what is durable
            base = (
                stored
                if current is None
                else merge_model_write(current, document_of(stored)).config
            )
        result = merge_model_write(base, incoming)
        if result.created:
            self.validate_model_config(result.config, result.created)
        return result

    def add_model_config(self, config: ModelConfig, source: str = SOURCE_API) -> MergeResult:
        """Append ``config`` to the registry under the §3 merge rules, atomically.

        A full document whose profiles all exist unchanged is a no-op.

        Raises:
            ModelIdConflict, ValidationFailed, ContentConflict, UnroutableModel: see
                ``plan_write``.
        """
        with self._lock:
            result = self.plan_write(document_of(config))
            if result.created or config.sie_id not in self._snapshot.configs:
                snap = self._snapshot
                configs = {**snap.configs, config.sie_id: result.config}
                sources = {**snap.sources}
                sources.setdefault(config.sie_id, source)
                self._rebuild(snap.bundles, configs, sources)
            return result

    def replace_models(self, models: Iterable[tuple[ModelConfig, str]]) -> None:
        """Atomically replace the whole model set (authoritative export, §4.1 step 3).

        Raises:
            ModelIdConflict: two of ``models`` share a subject token; nothing changed.
        """
        with self._lock:
            served = self._snapshot.configs
            configs: dict[str, ModelConfig] = {}
            sources: dict[str, str] = {}
            for c, src in models:
                current = served.get(c.sie_id)
                # an unchanged config keeps its object: per-config caches stay valid
                configs[c.sie_id] = current if current is not None and current == c else c
                sources[c.sie_id] = src
            self._rebuild(self._snapshot.bundles, configs, sources)

    def resolve(self, model_id: str, bundle: str | None = None) -> tuple[ModelEntry, str]:
        """Map a public model id (optionally pinned to a bundle) to its entry and bundle.

        ``model:default`` is the base id (architecture §16.3), unless
        ``default_profiles`` gives the model another profile: then the base id serves
        that one and ``model:default`` the ``default`` profile (``_entries_for``).

        Raises:
            ModelNotFound: unknown id, or ``bundle`` not compatible with it.
        """
        entry = self._snapshot.entries.get(model_id)
        if entry is None and model_id.endswith(":" + DEFAULT_PROFILE):
            entry = self._snapshot.entries.get(model_id[: -len(DEFAULT_PROFILE) - 1])
        if entry is None:
            raise model_not_found(model_id, self._snapshot.entries)  # names the closest ids
        if bundle is None:
            return entry, entry.bundle
        if bundle not in entry.bundles:
            raise ModelNotFound(
                f"model {echo(model_id)!r} is not served by bundle {echo(bundle)!r}",
                model=model_id,
                compatible_bundles=list(entry.bundles),
            )
        return entry, bundle
