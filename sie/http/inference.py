"""The gateway's inference routes: encode, score, extract (docs/api.md §2-§4).

Each decodes JSON or msgpack (``sie.http.negotiation``), validates with pydantic
(400 ``INVALID_INPUT`` naming the field), hands the request to the gateway role
(which publishes work items and collects results), and renders JSON or msgpack
with the timing headers of docs/api.md §1.

    POST /v1/encode/{model}   {items, params: {output_types, output_dtype, instruction,
                              is_query, options}} -> {model, items: [{id?, dense?, sparse?,
                              multivector?}]}
    POST /v1/score/{model}    {query, items, instruction?, options?, top_k?}
                              -> {model, query_id, scores: [{item_id, score, rank}]}
    POST /v1/extract/{model}  {items, params: {labels, output_schema, instruction, options}}
                              -> {model, items: [{id, entities, relations,
                              classifications, objects, data}]}
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from sie.core.errors import InvalidInput, SieError
from sie.core.templates import check_template
from sie.http.disconnect import CLIENT_CLOSED_REQUEST, until_disconnect
from sie.http.negotiation import read_payload, render, validate
from sie.http.schemas import (
    EncodeParams,
    EncodeRequest,
    ExtractParams,
    ExtractRequest,
    ScoreRequest,
)
from sie.roles.gateway import Collected, GatewayRole, Routing
from sie.telemetry import Metrics

__all__ = ["encode", "extract", "routing_of", "score", "timing_headers"]


def timing_headers(c: Collected) -> dict[str, str]:
    """The timing headers of a collected request (docs/api.md §1): ``X-SIE-Worker``
    (the workers, comma separated) and ``X-Queue-Publish-Time``, ``X-Queue-Time``,
    ``X-Inference-Time``, ``X-Tokenization-Time``, ``X-Total-Time`` in milliseconds;
    ``X-Payload-Fetch-Time`` when an item went by reference."""
    t = c.timing()
    headers = {
        "X-SIE-Worker": ",".join(c.workers) or "unknown",
        "X-Queue-Publish-Time": f"{t['publish_ms']:.1f}",
        "X-Queue-Time": f"{t['queue_ms']:.1f}",
        "X-Inference-Time": f"{t['inference_ms']:.1f}",
        "X-Tokenization-Time": f"{t['tokenization_ms']:.1f}",
        "X-Total-Time": f"{t['total_ms']:.1f}",
    }
    fetch_ms = c.payload_fetch_ms()
    if fetch_ms is not None:  # only when an item went by reference (docs/api.md §12)
        headers["X-Payload-Fetch-Time"] = f"{fetch_ms:.1f}"
    return headers


def _profile_target(gateway: GatewayRole, model: str, profile: str | None, where: str) -> str:
    """``options.profile`` selects a named profile: route to the ``model:profile`` id (§16.1)."""
    if profile is None:
        return model
    if ":" in model:  # the path already names a profile (model:profile)
        if model.rpartition(":")[2] != profile:
            raise InvalidInput(
                f"{where}.profile: {profile!r} conflicts with the profile in the model id "
                f"{model!r}; give one or the other",
                field=f"{where}.profile",
            )
        return model
    entry = gateway.registry.snapshot.entries.get(model)
    if entry is not None and entry.profile.name == profile:
        return model  # the bare id serves that profile (SIE_DEFAULT_PROFILES may name another)
    target = f"{model}:{profile}"
    if target not in gateway.registry.snapshot.entries:
        gateway.registry.resolve(model)  # unknown base model: 404 first
        raise InvalidInput(
            f"{where}.profile: model {model!r} has no routable profile {profile!r}",
            field=f"{where}.profile",
        )
    return target


async def _handle(
    request: Request,
    endpoint: str,
    schema: type[BaseModel],
    run: Callable[[GatewayRole, str, Any], Awaitable[Response]],
) -> Response:
    """Shared wrapper: read and validate the body (off the event loop when large), run,
    and count the request (bounded labels)."""
    gateway: GatewayRole = request.app.state.gateway
    metrics: Metrics = request.app.state.metrics
    model = request.path_params["model"]
    request.state.model = model  # for the access line (sie.http.access)
    started = time.monotonic()
    status = "error"
    try:
        routing = routing_of(request)
        await gateway.refuse_if_full(model, routing.pool, routing.machine_profile)
        req = await read_payload(
            request, gateway.limits.max_body_bytes, lambda p: validate(schema, p)
        )
        request.state.items = len(getattr(req, "items", None) or ())
        # a client that leaves while the workers compute abandons its request (work_cancel)
        response = await until_disconnect(request, lambda: run(gateway, model, req))
        if response is None:
            status = str(CLIENT_CLOSED_REQUEST)
            return Response(
                status_code=CLIENT_CLOSED_REQUEST
            )  # the client is gone (docs/api.md §1)
        status = "200"
        return response
    except SieError as exc:
        status = str(exc.status)
        raise
    finally:
        known = model if model in gateway.registry.snapshot.entries else "_unknown"
        metrics.requests.labels(endpoint, known, status).inc()
        metrics.request_duration.labels(endpoint, known).observe(time.monotonic() - started)


def routing_of(request: Request) -> Routing:
    """The routing headers (``X-SIE-Pool``, ``X-SIE-Machine-Profile``) and the request id,
    read the same way for every inference route (docs/pools.md)."""
    return Routing(
        pool=request.headers.get("x-sie-pool"),
        machine_profile=request.headers.get("x-sie-machine-profile"),
        request_id=request.state.request_id,
    )  # the caller's trace context is current (sie.http.access)


async def encode(request: Request) -> Response:
    """``POST /v1/encode/{model}`` (docs/api.md §2; architecture §2)."""

    async def run(gateway: GatewayRole, model: str, req: EncodeRequest) -> Response:
        params = req.params or EncodeParams()
        options = params.options.model_dump(exclude_none=True) if params.options else {}
        for name in ("query_template", "doc_template"):
            if name in options:
                check_template(options[name], field=f"params.options.{name}")
        target = _profile_target(gateway, model, options.pop("profile", None), "params.options")
        entry, _ = gateway.registry.resolve(target)
        # precedence: params, then options, then the profile's runtime defaults
        output_types = [
            str(t) for t in params.output_types or options.pop("output_types", None) or []
        ] or None
        if entry.config.tasks.encode is None:  # e.g. a reranker, a tagger or an LLM
            raise InvalidInput(
                f"model {model!r} does not support encoding (it offers "
                f"{entry.config.outputs or 'no task'})",
                field="model",
            )
        wanted = output_types or entry.profile.runtime.get("output_types") or ["dense"]
        unsupported = [t for t in wanted if t not in entry.config.outputs]
        if unsupported:
            raise InvalidInput(
                f"params.output_types: model {model!r} does not produce {unsupported}; "
                f"it produces {[o for o in entry.config.outputs if o in ('dense', 'sparse', 'multivector')]}",
                field="params.output_types",
            )
        if params.output_dtype is not None:
            options["output_dtype"] = params.output_dtype
        for i, item in enumerate(req.items):
            if item.text is None:
                raise InvalidInput(
                    f"items[{i}].text: required for model {model!r} (text input)",
                    field=f"items[{i}].text",
                )
        is_query = params.is_query if params.is_query is not None else options.pop("is_query", None)
        instruction = (
            params.instruction
            if params.instruction is not None
            else options.pop("instruction", None)
        )
        collected = await gateway.encode(
            target,
            [{"text": item.text} for item in req.items],
            output_types=output_types,
            instruction=instruction,
            is_query=is_query,
            options=options or None,
            routing=routing_of(request),
        )
        items_out: list[dict[str, Any]] = []
        for item, result in zip(req.items, collected.results, strict=True):
            out: dict[str, Any] = {"id": item.id} if item.id is not None else {}
            out.update(result.result())
            items_out.append(out)
        return render(
            request, {"model": model, "items": items_out}, headers=timing_headers(collected)
        )

    return await _handle(request, "encode", EncodeRequest, run)


async def score(request: Request) -> Response:
    """``POST /v1/score/{model}`` (docs/api.md §3): every item ranked, best first; ties
    keep input order; ``item_id`` is the item's id or ``item-{i}``; ``top_k`` keeps
    the best k of that same ranking."""

    async def run(gateway: GatewayRole, model: str, req: ScoreRequest) -> Response:
        options = req.options.model_dump(exclude_none=True) if req.options else {}
        target = _profile_target(gateway, model, options.pop("profile", None), "options")
        if req.query.text is None:
            raise InvalidInput("query.text: required (text input)", field="query.text")
        for i, item in enumerate(req.items):
            if item.text is None:
                raise InvalidInput(
                    f"items[{i}].text: required (text input)", field=f"items[{i}].text"
                )
        try:
            collected = await gateway.score(
                target,
                {"text": req.query.text},
                [{"text": it.text} for it in req.items],
                instruction=req.instruction,
                options=options or None,
                routing=routing_of(request),
            )
        except InvalidInput as exc:  # score options sit at the top level (no params wrapper)
            field = exc.fields.get("field")
            if isinstance(field, str) and field.startswith("params."):
                raise InvalidInput(
                    exc.message.replace("params.options.", "options."),
                    field=field.removeprefix("params."),
                ) from exc
            raise
        raw = collected.results[0].result().get("scores")
        if not isinstance(raw, list) or len(raw) != len(req.items):
            raise SieError(
                f"worker returned {len(raw) if isinstance(raw, list) else 'no'} scores for "
                f"{len(req.items)} items"
            )
        order = sorted(range(len(raw)), key=lambda i: (-float(raw[i]), i))
        if req.top_k is not None:
            order = order[: req.top_k]
        scores = [
            {
                "item_id": req.items[i].id if req.items[i].id is not None else f"item-{i}",
                "score": float(raw[i]),
                "rank": rank,
            }
            for rank, i in enumerate(order)
        ]
        body = {"model": model, "query_id": req.query.id, "scores": scores}
        return render(request, body, headers=timing_headers(collected))

    return await _handle(request, "score", ScoreRequest, run)


async def extract(request: Request) -> Response:
    """``POST /v1/extract/{model}`` (docs/api.md §4): per item ``{id, entities,
    relations, classifications, objects, data}``, every key present; ``id`` is the
    item's id or ``item-{i}``; entity offsets are characters of the item's text."""

    async def run(gateway: GatewayRole, model: str, req: ExtractRequest) -> Response:
        params = req.params or ExtractParams()
        options = params.options.model_dump(exclude_none=True) if params.options else {}
        target = _profile_target(gateway, model, options.pop("profile", None), "params.options")
        for i, item in enumerate(req.items):
            if item.text is None:
                raise InvalidInput(
                    f"items[{i}].text: required (text input)", field=f"items[{i}].text"
                )
        collected = await gateway.extract(
            target,
            [{"text": it.text} for it in req.items],
            labels=list(params.labels) if params.labels is not None else None,
            output_schema=params.output_schema,
            instruction=params.instruction,
            options=options or None,
            routing=routing_of(request),
        )
        items_out = []
        for i, (item, result) in enumerate(zip(req.items, collected.results, strict=True)):
            got = result.result()
            items_out.append(
                {
                    "id": item.id if item.id is not None else f"item-{i}",
                    "entities": got.get("entities", []),
                    "relations": got.get("relations", []),
                    "classifications": got.get("classifications", []),
                    "objects": got.get("objects", []),
                    "data": got.get("data", {}),
                }
            )
        return render(
            request, {"model": model, "items": items_out}, headers=timing_headers(collected)
        )

    return await _handle(request, "extract", ExtractRequest, run)
