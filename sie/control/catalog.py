"""The config read surface, shared by the config role and gateways (architecture §5).

Pure functions over a ``RegistrySnapshot``: the authority serves them from its
authoritative registry, each gateway from its own converged copy, so in a steady
state both views are byte-identical.

A model's YAML is dumped once per served config (``RegistrySnapshot.config_yaml``)
and, from an event loop, in a worker thread (``model_yaml_async``): a config at the
``MAX_YAML_NODES`` bound takes about a second to dump in pure Python, which must
not freeze a gateway's loop (docs/security.md "Config role"). Ids the client sent
are echoed at most ``MAX_ECHO_CHARS`` long.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar

from sie.core.config import DEFAULT_PROFILE, dump_yaml
from sie.core.errors import BundleConflict, BundleNotFound, InvalidInput, echo
from sie.core.registry import SOURCE_FILESYSTEM, RegistrySnapshot
from sie.core.suggest import model_not_found

__all__ = [
    "YAML_DUMP_THREADS",
    "bundle_yaml",
    "dump_limiter",
    "list_bundles",
    "list_models",
    "model_yaml",
    "model_yaml_async",
    "parse_model_spec",
    "resolve",
]

#: Worker threads that may dump config YAML at once, per event loop.
YAML_DUMP_THREADS = 2
_DUMP_LIMITER: RunVar[anyio.CapacityLimiter] = RunVar("sie_yaml_dump_limiter")


def dump_limiter() -> anyio.CapacityLimiter:
    """This event loop's limiter for YAML dumps in threads (``YAML_DUMP_THREADS``)."""
    try:
        return _DUMP_LIMITER.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(YAML_DUMP_THREADS)
        _DUMP_LIMITER.set(limiter)
        return limiter


_SPEC = re.compile(
    r"^(?:(?P<bundle>[A-Za-z0-9_-]+):/)?(?P<model>[^:\s]+)(?::(?P<profile>[^:\s]+))?$"
)


def list_models(snap: RegistrySnapshot) -> dict[str, Any]:
    """``{"models": [{model_id, profiles (sorted), source}]}`` sorted by id."""
    return {
        "models": [
            {
                "model_id": mid,
                "profiles": sorted(cfg.profiles),
                "source": snap.sources.get(mid, "api"),
            }
            for mid, cfg in sorted(snap.configs.items())
        ]
    }


def model_yaml(snap: RegistrySnapshot, model_id: str) -> str:
    """The model's full merged config as YAML (cached per served config; a first dump
    is pure Python, up to about a second: from an event loop use ``model_yaml_async``).

    Raises:
        ModelNotFound: 404.
    """
    if model_id not in snap.configs:
        raise model_not_found(model_id, snap.configs)
    return snap.config_yaml(model_id)


async def model_yaml_async(snap: RegistrySnapshot, model_id: str) -> str:
    """``model_yaml`` for an event loop: a cached dump is returned at once, a first one
    is made in a worker thread (at most ``YAML_DUMP_THREADS`` per loop).

    Raises:
        ModelNotFound: 404.
    """
    if model_id not in snap.configs:
        raise model_not_found(model_id, snap.configs)
    cached = snap.cached_config_yaml(model_id)
    if cached is not None:
        return cached
    return await anyio.to_thread.run_sync(snap.config_yaml, model_id, limiter=dump_limiter())


def list_bundles(
    snap: RegistrySnapshot, connected_workers: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """``{"bundles": [{bundle_id, priority, adapter_count, source[, connected_workers]}]}``,
    lowest priority first."""
    out = []
    for b in sorted(snap.bundles.values(), key=lambda b: (b.priority, b.name)):
        row: dict[str, Any] = {
            "bundle_id": b.name,
            "priority": b.priority,
            "adapter_count": len(b.adapters),
            "source": SOURCE_FILESYSTEM,
        }
        if connected_workers is not None:
            row["connected_workers"] = connected_workers.get(b.name, 0)
        out.append(row)
    return {"bundles": out}


def _bundle_name(snap: RegistrySnapshot, bundle_id: str) -> str | None:
    if bundle_id in snap.bundles:
        return bundle_id
    low = bundle_id.lower()
    return next((n for n in snap.bundles if n.lower() == low), None)


def bundle_yaml(snap: RegistrySnapshot, bundle_id: str) -> str:
    """YAML ``{name, priority, source, adapters, ...}`` (bundle ids match case-insensitively).

    Raises:
        BundleNotFound: 404.
    """
    name = _bundle_name(snap, bundle_id)
    if name is None:
        raise BundleNotFound(f"bundle {echo(bundle_id)!r} not found", bundle=bundle_id)
    doc = snap.bundles[name].model_dump(mode="json", exclude_none=True)
    doc["source"] = SOURCE_FILESYSTEM
    return dump_yaml(doc)


def parse_model_spec(spec: str) -> tuple[str | None, str]:
    """``[bundle:/]org/model[:profile]`` → ``(bundle or None, "org/model[:profile]")``.

    Raises:
        InvalidInput: not of that shape (400, field ``model``).
    """
    m = _SPEC.fullmatch(spec.strip())
    if m is None:
        raise InvalidInput(
            f"model: {echo(spec)!r} is not of the form '[bundle:/]org/model[:profile]'",
            field="model",
        )
    model = m["model"] + (f":{m['profile']}" if m["profile"] else "")
    return m["bundle"], model


def resolve(snap: RegistrySnapshot, body: Any) -> dict[str, Any]:
    """``POST /v1/configs/resolve``: ``{"model": spec, "bundle"?}`` →
    ``{model, resolved_bundle, compatible_bundles, profiles}``.

    Raises:
        InvalidInput: no/invalid ``model`` or ``bundle`` (400).
        ModelNotFound: unknown model or profile (404).
        BundleConflict: the requested bundle cannot serve the model (409).
    """
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        raise InvalidInput("model: required (a string)", field="model")
    bundle, model = parse_model_spec(body["model"])
    if body.get("bundle") is not None:
        if not isinstance(body["bundle"], str):
            raise InvalidInput("bundle: must be a string", field="bundle")
        bundle = body["bundle"]
    base, _, profile = model.partition(":")
    entry = snap.entries.get(base if profile in ("", DEFAULT_PROFILE) else model)
    if entry is None:
        raise model_not_found(model, snap.entries)
    compatible = list(entry.bundles)
    resolved = compatible[0]
    if bundle is not None:
        name = _bundle_name(snap, bundle)
        if name is None or name not in compatible:
            raise BundleConflict(
                f"bundle {echo(bundle)!r} cannot serve model {echo(model)!r}",
                model=model,
                bundle=bundle,
                compatible_bundles=compatible,
            )
        resolved = name
    return {
        "model": model,
        "resolved_bundle": resolved,
        "compatible_bundles": compatible,
        "profiles": sorted(entry.config.profiles),
    }
