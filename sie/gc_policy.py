"""The garbage-collector policy of a serving process (docs/security.md "Liveness").

CPython's cyclic collector stops the whole process while it walks every tracked
object. Measured with every role in one process under the heavy encode load of
docs/security.md, full collections over a heap holding torch, transformers and a
loaded model paused the process for up to 1.5 s (6 s in all over one run), and every
probe, heartbeat and result waited behind them. Two measures keep collections short:

- objects that live as long as the process — the imports, and each loaded model —
  are frozen out of collection (``gc.freeze``) once start-up, and each model load,
  is done, so a full collection walks request data only;
- the youngest generation is collected every ``GEN0`` allocations instead of 700, so
  a request's objects mostly die before they reach the old generation.

A leaf module: any layer may call it; only the process edge (``sie.cli``) configures.
"""

from __future__ import annotations

import gc

__all__ = ["GEN0", "GEN1", "GEN2", "configure", "freeze_long_lived"]

#: Allocations between collections of the young generation (CPython's default: 700).
GEN0 = 50_000
#: Young collections per middle-generation collection (default 10).
GEN1 = 20
#: Middle collections per full collection (default 10; CPython also waits until a
#: quarter of the old generation is new).
GEN2 = 10


def configure() -> None:
    """Set the collection thresholds for a serving process."""
    gc.set_threshold(GEN0, GEN1, GEN2)


def freeze_long_lived() -> None:
    """Move every object alive now out of future collections: call once start-up or a
    model load is done. Cyclic garbage alive at that moment is never reclaimed, which
    is why this is not called on a hot path."""
    gc.freeze()
