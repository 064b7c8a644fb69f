"""Dead letters (architecture §8 "DLQ advisories" / "DLQ storage").

Every gateway subscribes to ``$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>``. For
each advisory it fetches the original work item (by stream sequence; work streams
keep it until ``max_age``) and republishes it to the ``DEAD_LETTERS`` stream on
``sie.dlq.{model_token}`` with the deterministic ``Nats-Msg-Id``
``dlq.{stream}.{seq}``, so several gateways receiving the same advisory store it once.
"""

from __future__ import annotations

import json
import logging

import anyio
import anyio.abc

from sie.core.errors import SieError
from sie.core.subjects import ADVISORY_MAX_DELIVERIES, dlq_msg_id, dlq_subject
from sie.transport.base import Bus, Msg, dead_letter_stream_config

__all__ = ["DeadLetters"]

log = logging.getLogger(__name__)


class DeadLetters:
    """Republishes max-delivered work to ``DEAD_LETTERS``. Start ``run`` in a task group."""

    def __init__(self, bus: Bus, *, storage: str = "memory", replicas: int = 1) -> None:
        self.bus = bus
        self.config = dead_letter_stream_config(storage=storage, replicas=replicas)
        self._ensured = False
        self.republished = 0
        self.failures = 0

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        sub = await self.bus.subscribe(f"{ADVISORY_MAX_DELIVERIES}.>")
        task_status.started()
        try:
            async for msg in sub:
                await self.handle(msg)
        finally:
            with anyio.CancelScope(shield=True):
                await sub.unsubscribe()

    async def handle(self, advisory: Msg) -> bool:
        """Dead-letter the work one advisory names; False (logged) if it cannot."""
        try:
            body = json.loads(advisory.data)
            stream, seq = str(body["stream"]), int(body["stream_seq"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a malformed max-deliveries advisory on %s", advisory.subject)
            return False
        try:
            original = await self.bus.get_message(stream, seq)
            if not self._ensured:
                await self.bus.add_stream(self.config)
                self._ensured = True
            headers = {
                **(original.headers or {}),
                "Sie-Dlq-Stream": stream,
                "Sie-Dlq-Seq": str(seq),
                "Sie-Dlq-Subject": original.subject,
                "Sie-Dlq-Deliveries": str(body.get("deliveries", "")),
                "Sie-Dlq-Consumer": str(body.get("consumer", "")),
            }
            headers.pop("Nats-Msg-Id", None)
            await self.bus.js_publish(
                dlq_subject(original.subject),
                original.data,
                msg_id=dlq_msg_id(stream, seq),
                headers=headers,
            )
        except SieError as exc:
            self.failures += 1
            log.error("cannot dead-letter %s/%d: %s", stream, seq, exc.message)
            return False
        self.republished += 1
        log.warning(
            "work item %s/%d on %s exhausted its deliveries: moved to DEAD_LETTERS",
            stream,
            seq,
            original.subject,
        )
        return True
