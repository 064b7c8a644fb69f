"""The gateway role: routing, admission, dispatch and result collection.

- ``role``: ``GatewayRole``, the request paths (encode, score, extract) and fan-out;
- ``requests``: checks made before anything is published, a request's lane and routing;
- ``work``: a request's work items as msgpack; ``publish``: publishing them;
- ``pending``: items per pool's work stream (the pending limit);
- ``collect``: a request's results as they arrive;
- ``directory``: workers as known from their heartbeats;
- ``admission``: the generation admission gate (docs/admission-gate.md);
- ``lanes``: per-lane in-flight, decision and demand telemetry;
- ``dlq``: the dead-letter stream of work items no worker could finish;
- ``generation``: worker-direct dispatch of generation requests.
"""

from sie.roles.gateway.collect import Collected
from sie.roles.gateway.requests import Routing
from sie.roles.gateway.role import GatewayRole

__all__ = ["Collected", "GatewayRole", "Routing"]
