"""The three functions as gateway requests (docs/api.md §2-§4; architecture §8.4): what
each one turns into work items before ``GatewayRole`` routes, publishes and collects
them. Encode and extract fan out one work item per input item; score sends ONE work
item carrying the query and every candidate."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sie.core.registry import ModelEntry, ModelRegistry
from sie.roles.gateway.collect import Collected
from sie.roles.gateway.requests import DEFAULT_ROUTING, Routing, check_request
from sie.settings_views import LimitsSettings

__all__ = ["FunctionRequests"]


class FunctionRequests:
    """``encode``, ``score`` and ``extract`` of the gateway role (a base class: the
    role provides ``registry``, ``limits`` and ``_run``)."""

    registry: ModelRegistry
    limits: LimitsSettings

    async def _run(
        self,
        entry: ModelEntry,
        bundle: str,
        operation: str,
        works: list[dict[str, Any]],
        routing: Routing,
    ) -> Collected:
        raise NotImplementedError

    def _prepare(
        self,
        model_id: str,
        items: Sequence[Mapping[str, Any]],
        task: str | None,
        texts: list[tuple[str, Any]],
    ) -> tuple[ModelEntry, str]:
        """``check_request`` against this gateway's registry and limits."""
        return check_request(self.registry, self.limits, model_id, items, task, texts)

    async def encode(
        self,
        model_id: str,
        items: Sequence[Mapping[str, Any]],
        *,
        output_types: list[str] | None = None,
        instruction: str | None = None,
        is_query: bool | None = None,
        options: Mapping[str, Any] | None = None,
        routing: Routing = DEFAULT_ROUTING,
    ) -> Collected:
        """Fan ``items`` out as encode work items (one each) and wait for every result.

        Returns:
            ``Collected`` with one successful ``WorkResult`` per item, in input order.

        Raises:
            ModelNotFound: unknown model (404).
            InvalidInput: too many items, or a text over ``max_text_chars`` (400).
            Provisioning: no live worker serves the lane (503, Retry-After 60).
            Backpressure: the pool's stream is full (503, Retry-After 5).
            GatewayTimeout: not every result arrived within ``timeout_s`` (504).
            SieError: the workers' error, when every item failed with one code
                (e.g. 503 MODEL_LOADING, 502 MODEL_LOAD_FAILED); otherwise
                InferenceError listing each failed item.
        """
        entry, bundle = self._prepare(model_id, items, None, [("params.instruction", instruction)])
        common = {
            "output_types": output_types,
            "instruction": instruction,
            "is_query": is_query,
            "options": dict(options) if options else None,
        }
        return await self._run(
            entry,
            bundle,
            "encode",
            [{"item": dict(it), **common} for it in items],
            routing,
        )

    async def score(
        self,
        model_id: str,
        query: Mapping[str, Any],
        items: Sequence[Mapping[str, Any]],
        *,
        instruction: str | None = None,
        options: Mapping[str, Any] | None = None,
        routing: Routing = DEFAULT_ROUTING,
    ) -> Collected:
        """Score ``items`` against ``query``: ONE work item carrying the query and every
        candidate (architecture §8.4). Its result is ``{"scores": [float]}`` in item order.

        Raises:
            as ``encode``; InvalidInput also when the model has no ``tasks.score``.
        """
        entry, bundle = self._prepare(
            model_id,
            items,
            "score",
            [("instruction", instruction), ("query.text", query.get("text"))],
        )
        work = {
            "query_item": dict(query),
            "score_items": [dict(it) for it in items],
            "instruction": instruction,
            "options": dict(options) if options else None,
        }
        return await self._run(
            entry,
            bundle,
            "score",
            [work],
            routing,
        )

    async def extract(
        self,
        model_id: str,
        items: Sequence[Mapping[str, Any]],
        *,
        labels: list[str] | None = None,
        output_schema: Mapping[str, Any] | None = None,
        instruction: str | None = None,
        options: Mapping[str, Any] | None = None,
        routing: Routing = DEFAULT_ROUTING,
    ) -> Collected:
        """Fan ``items`` out as extract work items (one each); each result is
        ``{"entities": [...], "relations", "classifications", "objects", "data"}``.

        Raises:
            as ``encode``; InvalidInput also when the model has no ``tasks.extract``.
        """
        entry, bundle = self._prepare(
            model_id, items, "extract", [("params.instruction", instruction)]
        )
        common = {
            "labels": labels,
            "output_schema": dict(output_schema) if output_schema else None,
            "instruction": instruction,
            "options": dict(options) if options else None,
        }
        return await self._run(
            entry,
            bundle,
            "extract",
            [{"item": dict(it), **common} for it in items],
            routing,
        )
