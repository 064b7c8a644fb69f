"""Pools: capacity reserved for a workload (docs/pools.md; architecture §16.3).

A pool is a logical name clients put in ``X-SIE-Pool``. It is backed by a physical
queue pool (``queue_pool``, the ``WORK_POOL_{queue_pool}`` stream workers of
``SIE_POOL={queue_pool}`` consume; ``default`` unless given) and is assigned the live
workers of that queue pool whose machine profile it asks for (``gpus``: profile →
workers required; ``gpu_caps``: profile → most workers assigned), optionally of one
``bundle``. Every gateway computes the same assignment from the same heartbeats:
workers are taken in worker-id order.

A pool created with ``ttl_seconds`` is a lease: it expires that long after its last
renewal (``POST /v1/pools/{name}/renew``) and its requests then fail closed; without
one it lasts until deleted. The ``default`` pool always exists and cannot be created,
changed or deleted.

Pure logic: no I/O, no clock (times are passed in, epoch seconds).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sie.core.errors import InvalidInput

__all__ = [
    "DEFAULT_POOL",
    "MAX_NAME_CHARS",
    "Pool",
    "PoolSpec",
    "WorkerRef",
    "admits",
    "assign",
    "canonical_name",
    "capped",
    "hrw_pick",
    "parse_spec",
    "pool_state",
]

DEFAULT_POOL = "default"
#: Pool, queue-pool and machine-profile names: the characters of a NATS subject token
#: and a Kubernetes label, at most 63 of them; compared and stored in lowercase.
MAX_NAME_CHARS = 63
_NAME = re.compile(r"[A-Za-z0-9_-]{1,63}")
#: Longest lease a client may ask for (30 days).
MAX_TTL_S = 30 * 24 * 3600
#: Bounds of one spec: machine profiles in ``gpus`` / ``gpu_caps``, pinned models, and
#: the largest worker count or warm floor (docs/pools.md; every pool costs every
#: gateway work each second, so a spec stays small).
MAX_PROFILES = 32
MAX_PINNED = 32
MAX_WORKERS = 1024


def canonical_name(value: object, field: str) -> str:
    """``value`` as a pool / queue-pool / machine-profile name: trimmed, validated,
    lowercased.

    Raises:
        InvalidInput: not a string of 1-63 of ``[A-Za-z0-9_-]`` (400, naming ``field``).
    """
    if not isinstance(value, str) or not _NAME.fullmatch(value.strip()):
        shown = value[:80] if isinstance(value, str) else type(value).__name__
        raise InvalidInput(
            f"{field}: {shown!r} must be 1-{MAX_NAME_CHARS} of [A-Za-z0-9_-]", field=field
        )
    return value.strip().lower()


def _profiles(value: Any, field: str) -> dict[str, int]:
    if not isinstance(value, dict):
        raise ValueError("must be a map of machine profile to a count")
    if len(value) > MAX_PROFILES:
        raise ValueError(f"at most {MAX_PROFILES} machine profiles")
    out: dict[str, int] = {}
    for k, v in value.items():
        name = canonical_name(k, f"{field}.{k}" if isinstance(k, str) else field)
        low = 1 if field == "gpu_caps" else 0  # a cap of 0 could never serve
        if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= MAX_WORKERS:
            raise ValueError(f"{field}.{name}: must be an integer {low}-{MAX_WORKERS}")
        if name in out:
            raise ValueError(f"{field}: {name!r} is given twice (names are case-insensitive)")
        out[name] = v
    return out


class PoolSpec(BaseModel):
    """What a client asks for (``POST /v1/pools``; names canonical, lowercase)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    gpus: dict[str, int]
    gpu_caps: dict[str, int] | None = None
    bundle: str | None = None
    ttl_seconds: int | None = Field(default=None, ge=1, le=MAX_TTL_S, strict=True)
    queue_pool: str = DEFAULT_POOL
    minimum_worker_count: int = Field(default=0, ge=0, le=MAX_WORKERS, strict=True)
    pinned_models: tuple[str, ...] = ()

    @field_validator("name", "queue_pool", mode="before")
    @classmethod
    def _name(cls, v: Any, info: Any) -> str:
        return canonical_name(v, info.field_name)

    @field_validator("bundle", mode="before")
    @classmethod
    def _bundle(cls, v: Any) -> str | None:
        return None if v is None else canonical_name(v, "bundle")

    @field_validator("gpus", "gpu_caps", mode="before")
    @classmethod
    def _gpus(cls, v: Any, info: Any) -> dict[str, int] | None:
        if v is None and info.field_name == "gpu_caps":
            return None
        out = _profiles(v, info.field_name)
        if info.field_name == "gpus" and not out:
            raise ValueError("must name at least one machine profile")
        return out

    @field_validator("pinned_models", mode="before")
    @classmethod
    def _pinned(cls, v: Any) -> tuple[str, ...]:
        if v is None:
            return ()
        if not isinstance(v, list | tuple) or not all(isinstance(m, str) and m for m in v):
            raise ValueError("must be a list of model ids")
        if len(v) > MAX_PINNED:
            raise ValueError(f"at most {MAX_PINNED} pinned models")
        return tuple(dict.fromkeys(v))


def parse_spec(body: Any) -> PoolSpec:
    """A ``POST /v1/pools`` body as a spec.

    Raises:
        InvalidInput: not a map, a missing or invalid field (400, naming it), or the
            ``default`` pool (which cannot be created).
    """
    if not isinstance(body, dict):
        raise InvalidInput("body: must be a JSON object", field="body")
    try:
        spec = PoolSpec.model_validate(body)
    except InvalidInput:
        raise
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "body"
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        raise InvalidInput(f"{field}: {message}", field=field) from None
    if spec.name == DEFAULT_POOL:
        raise InvalidInput(
            "name: the default pool always exists and cannot be created", field="name"
        )
    extra = sorted(set(spec.gpu_caps or {}) - set(spec.gpus))
    if extra:
        raise InvalidInput(
            f"gpu_caps.{extra[0]}: caps a machine profile the pool does not ask for in gpus",
            field=f"gpu_caps.{extra[0]}",
        )
    return spec


class Pool(BaseModel):
    """A stored pool: the spec and its lease (epoch seconds)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    spec: PoolSpec
    created_at: float
    last_renewed: float
    #: the worker ids assigned when a gateway last looked (written by the gateways,
    #: read by workers deciding what to admit; ``admits``)
    assigned_workers: tuple[str, ...] = ()

    def expires_at(self) -> float | None:
        """When the lease runs out (None: never)."""
        ttl = self.spec.ttl_seconds
        return None if ttl is None else self.last_renewed + ttl

    def expired(self, now: float) -> bool:
        at = self.expires_at()
        return at is not None and now >= at


@dataclass(frozen=True, slots=True)
class WorkerRef:
    """A live worker as pools see it (from its heartbeat)."""

    worker_id: str
    pool: str
    machine_profile: str
    bundle: str
    ready: bool = True


def assign(spec: PoolSpec, workers: Iterable[WorkerRef]) -> list[WorkerRef]:
    """The workers ``spec`` is assigned, in worker-id order: the ready workers of its
    queue pool with a machine profile it names (and its bundle, if it names one), at
    most ``gpu_caps[profile]`` of each profile when capped."""
    by_profile: dict[str, list[WorkerRef]] = {}
    for w in sorted(workers, key=lambda w: w.worker_id):
        profile = w.machine_profile.lower()
        if not w.ready or w.pool.lower() != spec.queue_pool or profile not in spec.gpus:
            continue
        if spec.bundle is not None and w.bundle.lower() != spec.bundle:
            continue
        by_profile.setdefault(profile, []).append(w)
    out: list[WorkerRef] = []
    for profile in sorted(by_profile):
        ws = by_profile[profile]
        cap = (spec.gpu_caps or {}).get(profile)
        out.extend(ws if cap is None else ws[:cap])
    return sorted(out, key=lambda w: w.worker_id)


def pool_state(
    pool: Pool, assigned: list[WorkerRef], now: float
) -> Literal["pending", "active", "expired"]:
    """``expired`` past the lease; ``active`` when every profile has its required
    workers assigned; else ``pending``."""
    if pool.expired(now):
        return "expired"
    have: dict[str, int] = {}
    for w in assigned:
        have[w.machine_profile.lower()] = have.get(w.machine_profile.lower(), 0) + 1
    ok = all(have.get(p, 0) >= n for p, n in pool.spec.gpus.items())
    return "active" if ok else "pending"


def capped(spec: PoolSpec, machine_profile: str) -> bool:
    """Whether ``spec`` assigns only some of the workers of ``machine_profile``."""
    return spec.gpu_caps is not None and machine_profile.lower() in spec.gpu_caps


def admits(pool: Pool | None, worker: WorkerRef, now: float) -> bool:
    """Whether ``worker`` may run work whose ``admission_pool`` is ``pool`` (None: a
    pool it does not know of, or one removed). An unknown or expired pool admits
    nothing (fails closed); a pool of another queue pool, machine profile or bundle
    neither; a capped profile only the workers its gateways last assigned
    (``Pool.assigned_workers``); otherwise every worker of its lanes."""
    if pool is None or pool.expired(now):
        return False
    spec, profile = pool.spec, worker.machine_profile.lower()
    if worker.pool.lower() != spec.queue_pool or profile not in spec.gpus:
        return False
    if spec.bundle is not None and worker.bundle.lower() != spec.bundle:
        return False
    return not capped(spec, profile) or worker.worker_id in pool.assigned_workers


def hrw_pick(worker_ids: Iterable[str], key: str) -> str | None:
    """Rendezvous (highest random weight) choice of one of ``worker_ids`` for ``key``:
    every gateway picks the same worker for the same key and set, and a worker
    leaving moves only its own keys. None when there is no worker."""
    best: tuple[bytes, str] | None = None
    for w in worker_ids:
        weight = hashlib.blake2b(f"{w}\x00{key}".encode(), digest_size=8).digest()
        if best is None or (weight, w) > best:
            best = (weight, w)
    return None if best is None else best[1]
