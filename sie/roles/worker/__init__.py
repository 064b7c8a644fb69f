"""The worker role: pull work items, batch them through engines, publish results.

- ``role``: ``WorkerRole``, the pull loop and heartbeats;
- ``cancels``: requests their gateway abandoned, and the work running for each;
- ``tasks``: encode, score and extract items through an engine's batcher;
- ``generation``: generation requests streamed from an engine.
"""

from sie.roles.worker.role import WorkerRole

__all__ = ["WorkerRole"]
