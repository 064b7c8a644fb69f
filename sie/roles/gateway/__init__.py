"""The gateway role: routing, admission, dispatch and result collection.

- ``role``: ``GatewayRole``, the request paths (encode, score, extract) and fan-out;
- ``admission``: the generation admission gate (docs/admission-gate.md);
- ``lanes``: per-lane in-flight, decision and demand telemetry;
- ``dlq``: the dead-letter stream of work items no worker could finish;
- ``generation``: worker-direct dispatch of generation requests.
"""

from sie.roles.gateway.role import Collected, GatewayRole

__all__ = ["Collected", "GatewayRole"]
