"""Worker-ack status: ``GET /v1/configs/models/{id}/status`` (architecture §6).

For each bundle serving the model, in the model's pool: which healthy workers
report the ``bundle_config_hash`` this gateway expects. Rules (§6):

- per replica: the workers this gateway hears;
- exact, case-sensitive bundle match; workers of other bundles or pools are
  skipped entirely;
- healthy workers only; unhealthy ones count nowhere;
- a bundle with no eligible worker is not acked (nothing serves it yet);
- a model with no routable bundle is ``all_bundles_acked: false, no_bundles: true``
  (nothing deployed is not "fully deployed");
- ``config_epoch`` is this gateway's local epoch.

Hashes are pool-scoped (§7): a worker in pool ``p`` advertises the hash of its
bundle over the models of pool ``p``; the expected value uses the same scope.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sie.core.registry import RegistrySnapshot
from sie.core.suggest import model_not_found

__all__ = ["WorkerAck", "worker_ack_status"]


@dataclass(frozen=True, slots=True)
class WorkerAck:
    """What a heartbeat says about one worker."""

    worker_id: str
    bundle: str
    pool: str
    bundle_config_hash: str
    healthy: bool


def worker_ack_status(
    snap: RegistrySnapshot, model_id: str, workers: Iterable[WorkerAck], config_epoch: int
) -> dict[str, Any]:
    """The §6 response body.

    Raises:
        ModelNotFound: ``model_id`` is not a known base model id (404).
    """
    cfg = snap.configs.get(model_id)
    if cfg is None:
        raise model_not_found(model_id, snap.configs)
    pool = cfg.effective_pool
    healthy = [w for w in workers if w.healthy and w.pool.lower() == pool]
    rows = []
    for bundle_id in snap.bundles_of_model(model_id):
        expected = snap.bundle_config_hash(bundle_id, pool)
        eligible = sorted((w for w in healthy if w.bundle == bundle_id), key=lambda w: w.worker_id)
        acked = [w.worker_id for w in eligible if w.bundle_config_hash == expected]
        pending = [w.worker_id for w in eligible if w.bundle_config_hash != expected]
        rows.append(
            {
                "bundle_id": bundle_id,
                "pool": pool,
                "expected_bundle_config_hash": expected,
                "total_eligible_workers": len(eligible),
                "acked_workers": acked,
                "pending_workers": pending,
                "acked": bool(eligible) and not pending,
            }
        )
    return {
        "model_id": model_id,
        "config_epoch": config_epoch,
        "all_bundles_acked": bool(rows) and all(r["acked"] for r in rows),
        "no_bundles": not rows,
        "bundles": rows,
        "source": "gateway-registry",
    }
