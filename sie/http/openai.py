"""OpenAI-compatible ``POST /v1/embeddings`` over encode (architecture §2; docs/api.md
§5.1 "Parameter support", §6).

Every documented parameter is honoured or refused with a 400 naming it, and an unknown
one is refused too (never ignored). ``input`` is a string or a list of strings; token-id
inputs (what LangChain's ``OpenAIEmbeddings`` sends by default: tiktoken ids, which
only OpenAI's tokenizer files can read back) are refused with a 400 naming the element
and LangChain's fix, ``check_embedding_ctx_length=False``. ``encoding_format`` ``float``
(default) or ``base64`` (little-endian float32 bytes of the same numbers).
``dimensions`` truncates and re-normalises for models whose dense task is marked
``matryoshka``; for other models it must equal the native width. ``user`` is recorded
as the request span's ``enduser.id``.

Truncation: an input longer than the model reads is cut to its window (the default).
``truncate: false`` (TEI's name) refuses it instead, a 400 naming ``input[i]`` with its
token count and the limit; ``truncate_prompt_tokens`` (vLLM's) ``k >= 1`` reads at most
``k`` tokens of each input (more than the model's limit is a 400), ``-1`` is the
default. ``usage`` counts the tokens actually read (after truncation), as the workers
report them. Errors use the OpenAI envelope (``sie.http.errors.openai_error``) with
``param`` naming the element (``input[1]``, not ``input``).
"""

from __future__ import annotations

import base64
import re
import time
from typing import Any

import numpy as np
from opentelemetry import trace
from starlette.requests import Request
from starlette.responses import Response

from sie.core.echo import echo
from sie.core.errors import (
    AllItemsFailed,
    InferenceError,
    InvalidInput,
    ModelNotFound,
    PayloadTooLarge,
    SieError,
)
from sie.http.disconnect import CLIENT_CLOSED_REQUEST, until_disconnect
from sie.http.inference import routing_of, timing_headers
from sie.http.negotiation import FastJSONResponse, read_payload, validate
from sie.http.schemas import EmbeddingsRequest
from sie.roles.gateway import GatewayRole
from sie.telemetry import Metrics

__all__ = ["embeddings"]


#: What a token-id input is told (LangChain's OpenAIEmbeddings sends tiktoken ids).
TOKEN_IDS_HINT = (
    "token-id input is not supported: the ids are of a tokenizer SIE does not have "
    "(tiktoken's, for OpenAI models); send text. LangChain's OpenAIEmbeddings sends "
    "token ids by default: construct it with check_embedding_ctx_length=False"
)


def _check_input(payload: Any) -> None:
    """Clear messages for the input shapes OpenAI clients get wrong, and for unknown
    parameters (refused, not ignored: docs/api.md §5.1).

    Raises:
        InvalidInput: naming the parameter or the element (``input[i]``).
    """
    if not isinstance(payload, dict):
        raise InvalidInput("body: expected a JSON object", field="body")
    known = EmbeddingsRequest.model_fields
    unknown = [k for k in payload if k not in known]
    if unknown:
        raise InvalidInput(
            f"{unknown[0]}: unknown parameter for /v1/embeddings (SIE refuses parameters "
            "it does not implement instead of ignoring them); see docs/api.md §5.1",
            field=str(unknown[0]),
        )
    if payload.get("model") == "":  # OpenAI answers 400 naming it, not a 404
        raise InvalidInput("model: must not be empty", field="model")
    inp = payload.get("input")
    if isinstance(inp, list):
        if not inp:
            raise InvalidInput("input: must not be empty", field="input")
        if all(isinstance(x, int) and not isinstance(x, bool) for x in inp):  # one id list
            raise InvalidInput(f"input: {TOKEN_IDS_HINT}", field="input")
        for i, x in enumerate(inp):
            if (
                isinstance(x, list)
                and x
                and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
            ):
                raise InvalidInput(f"input[{i}]: {TOKEN_IDS_HINT}", field=f"input[{i}]")
            if not isinstance(x, str):
                raise InvalidInput(f"input[{i}]: expected a string", field=f"input[{i}]")
            if not x.isascii():
                try:
                    x.encode("utf-8")
                except UnicodeEncodeError:
                    raise InvalidInput(
                        f"input[{i}]: contains an unpaired surrogate", field=f"input[{i}]"
                    ) from None
    elif "input" in payload and not isinstance(inp, str):
        raise InvalidInput("input: expected a string or a list of strings", field="input")


#: Largest ``truncate_prompt_tokens`` passed on to the workers (larger values could not
#: be forwarded: they do not fit the wire's 64-bit integers).
MAX_TRUNCATE_PROMPT_TOKENS = 2**31 - 1


def _options(req: EmbeddingsRequest) -> dict[str, Any] | None:
    """The encode runtime options of ``truncate`` / ``truncate_prompt_tokens``
    (``sie.engines.truncation``; docs/api.md §6)."""
    out: dict[str, Any] = {}
    if req.truncate is False:
        out["truncate"] = False
    k = req.truncate_prompt_tokens
    if k == 0:
        raise InvalidInput(
            "truncate_prompt_tokens: must be -1 (the model's limit) or at least 1",
            field="truncate_prompt_tokens",
        )
    if k is not None and k > MAX_TRUNCATE_PROMPT_TOKENS:  # no window is this long
        raise InvalidInput(
            f"truncate_prompt_tokens: {echo(k, 24)} is more than any model reads; send at "
            "most the model's max_sequence_length, or -1 for the model's limit",
            field="truncate_prompt_tokens",
        )
    if k is not None and k > 0:
        out["max_input_tokens"] = k
    return out or None


def _dense_width(req: EmbeddingsRequest, gateway: GatewayRole) -> tuple[int, bool]:
    entry, _ = gateway.registry.resolve(req.model)
    enc = entry.config.tasks.encode
    if enc is None or enc.dense is None:
        raise InvalidInput(f"model {req.model!r} does not produce dense embeddings", field="model")
    return enc.dense.dim, enc.dense.matryoshka


_ITEM = re.compile(r"items\[(\d+)\](?:\.text)?")
#: Encode option fields as the OpenAI parameters that set them.
_OPTION_PARAMS = {
    "options.truncate": "truncate",
    "options.max_input_tokens": "truncate_prompt_tokens",
}


def _as_openai_param(exc: SieError, single: bool = False) -> SieError:
    """Name OpenAI fields: the encode path says ``items[i].text``, OpenAI ``input[i]``
    (``input`` when it was one string, ``single``); a request whose failed items all
    failed on their input is a 400 naming the first."""
    if isinstance(exc, ModelNotFound):
        exc.fields.setdefault("field", "model")
    details = exc.fields.get("details")
    if (
        isinstance(exc, InferenceError | AllItemsFailed)
        and isinstance(details, list)
        and details
        and all(isinstance(d, dict) and d.get("code") == "INVALID_INPUT" for d in details)
    ):
        first = details[0]
        idx = first.get("item_index", 0)
        exc = InvalidInput(str(first.get("error") or "invalid input"), field=f"items[{idx}].text")
    field = exc.fields.get("field")
    if isinstance(field, str):
        if field in _OPTION_PARAMS:
            param = _OPTION_PARAMS[field]
            exc.fields["field"] = param
            exc.message = exc.message.replace(field, param)
        elif (m := _ITEM.match(field)) is not None:
            name = "input" if single else f"input[{m.group(1)}]"
            exc.fields["field"] = name
            exc.message = _ITEM.sub(name, exc.message)
        elif field == "items":
            exc.fields["field"] = "input"
            exc.message = exc.message.replace("items:", "input:")
    return exc


async def embeddings(request: Request) -> Response:
    """``POST /v1/embeddings`` (module docstring; docs/api.md §5.1, §6)."""
    gateway: GatewayRole = request.app.state.gateway
    metrics: Metrics = request.app.state.metrics
    started = time.monotonic()
    status, model = "error", ""
    try:
        response = await _embeddings(request, gateway)
        status = "200"
        return response
    except SieError as exc:
        mapped = _as_openai_param(exc, getattr(request.state, "single_input", False))
        status = str(mapped.status)
        raise mapped from None
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
    if req.user:  # OpenAI's end-user id: recorded on the request's span
        trace.get_current_span().set_attribute("enduser.id", req.user[:256])
    texts = [req.input] if isinstance(req.input, str) else list(req.input)
    request.state.items = len(texts)
    request.state.single_input = isinstance(req.input, str)  # errors name "input"
    for i, t in enumerate(texts):
        if not t:
            raise InvalidInput(f"items[{i}].text: must not be an empty string", field=f"items[{i}]")
    options = _options(req)
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
            options=options,
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
        if req.encoding_format == "base64":  # None and "float": a list of floats
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
        },
        headers=timing_headers(collected),
    )
