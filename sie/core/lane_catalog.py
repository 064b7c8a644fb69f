"""The lane catalog: the physical lanes ``(queue pool, machine profile, bundle)`` this
gateway may route to and label telemetry with (docs/pools.md "Lanes"; architecture
§16.3, §15).

Caller input never invents a lane. A machine profile resolves through the operator's
aliases (``SIE_GATEWAY_GPU_ALIASES``) and must then be a configured one
(``SIE_GATEWAY_CONFIGURED_GPUS``), the gateway's own default, or one a live worker
reports; with ``SIE_GATEWAY_CONFIGURED_PHYSICAL_LANES`` set, the lane itself must be
listed (at most 1,024) or served by a live worker. Anything else gets no stream, no
metric series and no pending-demand entry.

Pure logic: what is live is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from sie.core.errors import InvalidInput

__all__ = ["MAX_PHYSICAL_LANES", "LaneCatalog"]

#: Most lanes a deployment may declare (architecture §16.3).
MAX_PHYSICAL_LANES = 1024

Lane = tuple[str, str, str]


@dataclass(frozen=True)
class LaneCatalog:
    """``configured_gpus``: canonical machine profiles; ``gpu_aliases``: request name →
    canonical profile; ``physical_lanes``: declared lanes (empty: none declared)."""

    configured_gpus: frozenset[str] = frozenset()
    gpu_aliases: Mapping[str, str] = field(default_factory=dict)
    physical_lanes: frozenset[Lane] = frozenset()

    @property
    def declared(self) -> bool:
        """Whether the operator declared profiles or lanes (a closed catalog)."""
        return bool(self.configured_gpus or self.physical_lanes)

    def profile(self, requested: str) -> str:
        """A requested machine profile, through the aliases, lowercase."""
        name = requested.lower()
        return self.gpu_aliases.get(name, name)

    def knows(
        self,
        lane: Lane,
        *,
        default_profile: str,
        worker_profiles: Collection[str],
        served: Callable[[Lane], bool],
    ) -> bool:
        """Whether ``lane`` is a real lane (see the module docstring)."""
        if served(lane):
            return True
        if self.physical_lanes:
            return lane in self.physical_lanes
        profile = lane[1]
        return (
            profile == default_profile
            or profile in self.configured_gpus
            or profile in worker_profiles
        )

    def unknown(self, requested: str) -> InvalidInput:
        """The 400 for a machine profile a closed catalog does not have."""
        known = sorted(self.configured_gpus | {p for _, p, _ in self.physical_lanes})
        shown = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "")
        return InvalidInput(
            f"X-SIE-Machine-Profile: {requested[:64]!r} is not a configured machine profile "
            f"(configured: {shown})",
            field="X-SIE-Machine-Profile",
        )
