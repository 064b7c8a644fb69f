"""The config role: the single writer of model configs (architecture §3).

This build serves the read side only (bundles, models, epoch) from the seed the
container loaded; the write path, store and deltas are the next issue's.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.abc

from sie.core.config import dump_yaml
from sie.core.errors import BundleNotFound, ModelNotFound
from sie.core.hashing import bundle_config_hash, bundle_config_hashes_hash, bundles_hash
from sie.core.registry import ModelRegistry

__all__ = ["ConfigRole"]


class ConfigRole:
    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry
        self.epoch = 0

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        await anyio.sleep_forever()

    def model_ids(self) -> list[str]:
        return sorted(self.registry.snapshot.configs)

    def model_yaml(self, model_id: str) -> str:
        cfg = self.registry.snapshot.configs.get(model_id)
        if cfg is None:
            raise ModelNotFound(f"model {model_id!r} not found", model=model_id)
        return dump_yaml(cfg.model_dump(mode="json", exclude_unset=True))

    def bundle_yaml(self, bundle_id: str) -> str:
        b = self.registry.snapshot.bundles.get(bundle_id)
        if b is None:
            raise BundleNotFound(f"bundle {bundle_id!r} not found", bundle=bundle_id)
        return dump_yaml(b.model_dump(mode="json", exclude_none=True))

    def epoch_info(self) -> dict[str, Any]:
        """``{epoch, bundles_hash, bundle_config_hashes_hash}`` (architecture §4.1)."""
        snap = self.registry.snapshot
        hashes = {
            name: bundle_config_hash(snap.configs.values(), b) for name, b in snap.bundles.items()
        }
        return {
            "epoch": self.epoch,
            "bundles_hash": bundles_hash(snap.bundles.values()),
            "bundle_config_hashes_hash": bundle_config_hashes_hash(hashes),
        }
