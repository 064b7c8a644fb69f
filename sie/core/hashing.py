"""Cross-service config fingerprints (architecture §7).

``bundle_config_hash`` = SHA-256 hex over the compact, sorted-keys, UTF-8 JSON of::

    [{"sie_id", "revision", "profiles": [{"name", "config": {adapter_path,
      max_batch_tokens, compute_precision, adapter_options}}]}]

models sorted by ``sie_id``, profiles by name, only models with a profile whose
adapter module the bundle lists and only such profiles. ``revision`` is
``hf_revision`` or null. ``adapter_options`` is the ``{loadtime, runtime}``
object, replaced by null when every value is falsy (Python ``not any(values)``).
The empty model list hashes to ``""``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from sie.core.config import Bundle, ModelConfig

__all__ = [
    "bundle_config_hash",
    "bundle_config_hashes_hash",
    "bundle_document",
    "bundle_pool_config_hashes",
    "bundles_hash",
    "canonical_json",
    "canonicalize_adapter_options",
]


def canonical_json(obj: Any) -> bytes:
    """Compact, sorted-keys, raw UTF-8 JSON (the orjson ``OPT_SORT_KEYS`` form)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _sha(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj)).hexdigest()


def canonicalize_adapter_options(opts: Any) -> Any:
    """A mapping whose values are all Python-falsy becomes None; anything else is kept."""
    if isinstance(opts, Mapping) and not any(opts.values()):
        return None
    return opts


def bundle_document(
    configs: Iterable[ModelConfig], bundle: Bundle, pool: str | None = None
) -> list[dict[str, Any]]:
    """The canonical structure hashed for ``bundle`` (optionally only models of ``pool``)."""
    doc: list[dict[str, Any]] = []
    for cfg in sorted(configs, key=lambda c: c.sie_id):
        if pool is not None and cfg.effective_pool != pool:
            continue
        profiles = []
        for name in sorted(cfg.profiles):
            resolved = cfg.resolve_profile(name)
            if not bundle.runs(resolved.adapter_module):
                continue
            raw = cfg.profiles[name]
            opts = raw.adapter_options.model_dump() if raw.adapter_options is not None else None
            profiles.append(
                {
                    "name": name,
                    "config": {
                        "adapter_path": raw.adapter_path,
                        "max_batch_tokens": raw.max_batch_tokens,
                        "compute_precision": raw.compute_precision,
                        "adapter_options": canonicalize_adapter_options(opts),
                    },
                }
            )
        if profiles:
            doc.append({"sie_id": cfg.sie_id, "revision": cfg.hf_revision, "profiles": profiles})
    return doc


def bundle_config_hash(
    configs: Iterable[ModelConfig], bundle: Bundle, pool: str | None = None
) -> str:
    """SHA-256 hex of ``bundle_document``; ``""`` when no model matches the bundle."""
    doc = bundle_document(configs, bundle, pool)
    return _sha(doc) if doc else ""


def bundles_hash(bundles: Iterable[Bundle]) -> str:
    """Fingerprint of the bundle set: name, priority, sorted adapters; ``""`` if empty."""
    items = [
        {"name": b.name, "priority": b.priority, "adapters": sorted(b.adapters)}
        for b in sorted(bundles, key=lambda b: b.name)
    ]
    return _sha(items) if items else ""


def bundle_pool_config_hashes(
    configs: Iterable[ModelConfig], bundles: Iterable[Bundle]
) -> dict[str, dict[str, str]]:
    """``{bundle_id: {pool: bundle_config_hash scoped to pool}}`` (architecture §7, §8.3).

    Pools are the effective pools of ``configs`` plus ``default``; a worker in
    pool ``p`` serving bundle ``b`` advertises ``out[b][p]``.
    """
    configs = list(configs)
    pools = sorted({c.effective_pool for c in configs} | {"default"})
    return {b.name: {p: bundle_config_hash(configs, b, p) for p in pools} for b in bundles}


def bundle_config_hashes_hash(configs: Iterable[ModelConfig], bundles: Iterable[Bundle]) -> str:
    """Fingerprint of per-bundle config hashes plus model pool ownership (architecture §4.2).

    SHA-256 hex over ``{"bundles": {bundle: hash}, "pools": {bundle: {pool: hash}},
    "model_pools": {sie_id: pool}}``; ``""`` when there are no bundles (the
    "registry unavailable" sentinel the poller skips).
    """
    configs, bundles = list(configs), list(bundles)
    if not bundles:
        return ""
    return _sha(
        {
            "bundles": {b.name: bundle_config_hash(configs, b) for b in bundles},
            "pools": bundle_pool_config_hashes(configs, bundles),
            "model_pools": {c.sie_id: c.effective_pool for c in configs},
        }
    )
