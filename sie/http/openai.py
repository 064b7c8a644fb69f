"""OpenAI-compatible ``POST /v1/embeddings`` over encode (architecture §2).

``input`` is a string or a list of strings; token-id and nested-array inputs are
rejected with 400. ``encoding_format`` ``float`` (default) or ``base64``
(little-endian float32 bytes of the same numbers). ``dimensions`` truncates and
re-normalises for models whose dense task is marked ``matryoshka``; for other
models it must equal the native width. ``usage`` counts real tokens (after
truncation), as reported by the workers. Errors use the OpenAI envelope
(``sie.http.errors.openai_error``) with ``param`` naming the request field.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from sie.core.errors import InvalidInput, ModelNotFound, PayloadTooLarge, SieError
from sie.http.disconnect import CLIENT_CLOSED_REQUEST, until_disconnect
from sie.http.inference import routing_of
from sie.http.negotiation import FastJSONResponse, read_payload, validate
from sie.http.schemas import EmbeddingsRequest
from sie.roles.gateway import GatewayRole
from sie.telemetry import Metrics

__all__ = ["embeddings"]


def _check_input(payload: Any) -> None:
    """Clear messages for the input shapes OpenAI clients get wrong."""
    if not isinstance(payload, dict):
        raise InvalidInput("body: expected a JSON object", field="body")
    inp = payload.get("input")
    if isinstance(inp, list):
        if not inp:
            raise InvalidInput("input: must not be empty", field="input")
        if any(isinstance(x, int | list) and not isinstance(x, bool) for x in inp):
            raise InvalidInput(
                "input: token-id and nested-array inputs are not supported; send a string or a list of strings",
                field="input",
            )
        bad = next((i for i, x in enumerate(inp) if not isinstance(x, str)), None)
        if bad is not None:
            raise InvalidInput(f"input[{bad}]: expected a string", field="input")
        for i, x in enumerate(inp):
            if not x.isascii():
                try:
                    x.encode("utf-8")
                except UnicodeEncodeError:
                    raise InvalidInput(
                        f"input[{i}]: contains an unpaired surrogate", field="input"
                    ) from None
    elif "input" in payload and not isinstance(inp, str):
        raise InvalidInput("input: expected a string or a list of strings", field="input")


def _dense_width(req: EmbeddingsRequest, gateway: GatewayRole) -> tuple[int, bool]:
    entry, _ = gateway.registry.resolve(req.model)
    enc = entry.config.tasks.encode
    if enc is None or enc.dense is None:
        raise InvalidInput(f"model {req.model!r} does not produce dense embeddings", field="model")
    return enc.dense.dim, enc.dense.matryoshka


def _as_openai_param(exc: SieError) -> SieError:
    """Name OpenAI fields: the encode path says ``items[i].text``, OpenAI says ``input``."""
    if isinstance(exc, ModelNotFound):
        exc.fields.setdefault("field", "model")
    field = exc.fields.get("field")
    if isinstance(field, str) and field.startswith("input"):
        exc.fields["field"] = "input"
    elif isinstance(field, str) and field.startswith("items"):
        exc.fields["field"] = "input"
        exc.message = (
            exc.message.replace("items[", "input[")
            .replace(".text:", ":")
            .replace("items:", "input:")
        )
    return exc


async def embeddings(request: Request) -> Response:
    gateway: GatewayRole = request.app.state.gateway
    metrics: Metrics = request.app.state.metrics
    started = time.monotonic()
    status, model = "error", ""
    try:
        response = await _embeddings(request, gateway)
        status = "200"
        return response
    except SieError as exc:
        status = str(exc.status)
        raise _as_openai_param(exc) from None
    finally:
        model = getattr(request.state, "model", "")
        known = (
            model if model in gateway.registry.snapshot.entries else "_unknown"
        )  # bounded labels
        metrics.requests.labels("embeddings", known, status).inc()
        metrics.request_duration.labels("embeddings", known).observe(time.monotonic() - started)


#: Bytes of encode results ``/v1/embeddings`` buffers before reshaping them (docs/api.md
#: §6): the reply grows with the inputs, so it has its own bound, apart from the body's.
MAX_COMPAT_RESPONSE_BODY = 16 * 1024 * 1024


async def _embeddings(request: Request, gateway: GatewayRole) -> Response:
    def check(payload: Any) -> EmbeddingsRequest:
        _check_input(payload)
        req: EmbeddingsRequest = validate(EmbeddingsRequest, payload)
        return req

    req = await read_payload(request, gateway.limits.max_body_bytes, check)
    request.state.model = req.model
    texts = [req.input] if isinstance(req.input, str) else list(req.input)
    request.state.items = len(texts)
    for i, t in enumerate(texts):
        if not t:
            raise InvalidInput(f"input[{i}]: must not be an empty string", field="input")
    native, matryoshka = _dense_width(req, gateway)
    dims = req.dimensions
    if dims is not None and dims != native:
        if not matryoshka:
            raise InvalidInput(
                f"dimensions: model {req.model!r} has fixed width {native} and does not support other dimensions",
                field="dimensions",
            )
        if dims > native:
            raise InvalidInput(
                f"dimensions: must be at most {native} for model {req.model!r}", field="dimensions"
            )
    collected = await until_disconnect(  # a client that leaves abandons the request
        request,
        lambda: gateway.encode(
            req.model,
            [{"text": t} for t in texts],
            output_types=["dense"],
            is_query=False,
            routing=routing_of(request),  # routing headers as on every route
        ),
    )
    if collected is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)  # the client is gone (docs/api.md §1)
    if (size := collected.result_bytes()) > MAX_COMPAT_RESPONSE_BODY:
        raise PayloadTooLarge(
            f"the embeddings of these {len(texts)} inputs take {size} bytes, over the "
            f"{MAX_COMPAT_RESPONSE_BODY}-byte reply limit of /v1/embeddings; send fewer "
            "inputs per request (encoding_format=base64 does not change this limit)",
            field="input",
        )
    data = []
    for i, result in enumerate(collected.results):
        vec = np.asarray(result.result()["dense"]["values"], dtype=np.float32)
        if dims is not None and dims < native:
            vec = vec[:dims]
            norm = float(np.linalg.norm(vec))
            vec = vec / norm if norm > 0 else vec
        emb: Any
        if req.encoding_format == "base64":
            emb = base64.b64encode(vec.astype("<f4").tobytes()).decode("ascii")
        else:
            emb = vec.tolist()
        data.append({"object": "embedding", "embedding": emb, "index": i})
    tokens = sum(r.input_tokens or 0 for r in collected.results)
    return FastJSONResponse(
        {
            "object": "list",
            "data": data,
            "model": req.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )
