"""Cohere- and Jina-shaped rerank over SIE's score function (docs/api.md §15).

    POST /v1/rerank   Cohere v1 / Jina: {model?, query, documents: [str | {text, ...}],
                      top_n?, return_documents?, rank_fields?, max_chunks_per_doc?}
    POST /v2/rerank   Cohere v2 (``cohere.ClientV2.rerank``): {model, query,
                      documents: [str], top_n?, max_tokens_per_doc?, priority?}
    -> {id, results: [{index, relevance_score, document?: {text, ...}}], model,
        meta: {api_version: {version}, tokens: {input_tokens, output_tokens}},
        usage: {total_tokens}}

Both run ``GatewayRole.score`` exactly as ``POST /v1/score/{model}`` does (docs/api.md
§3): ``relevance_score`` is that route's ``score`` (the model's own scale: cosine for
bi-encoders, the profile's activation for cross-encoders), ``results`` are best first
with ties in input order, and ``top_n`` keeps the first n. No model in the body: the
gateway's ``SIE_DEFAULT_RERANK_MODEL``, else 400 naming it.

What SIE cannot honour is refused (400 naming the field), never ignored:
``rank_fields`` other than ``["text"]``; ``max_chunks_per_doc`` above 1 (SIE reads
each document once, truncated to the model's window); ``max_tokens_per_doc`` below
the model's ``max_sequence_length`` (SIE cannot truncate shorter). ``priority`` is
accepted and has no effect (scheduling only, never the scores). A dict document
needs a string ``text``; with ``return_documents`` it comes back whole, as Cohere
does; a string document comes back as ``{"text": ...}``.

Errors: SIE's envelope (docs/api.md §11) with Cohere's top-level ``message``; field
names are this route's (``documents[2]``, ``query``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from pydantic_core import PydanticSerializationError
from starlette.requests import Request
from starlette.responses import Response

from sie.core.errors import InvalidInput, SieError
from sie.core.ids import uuid7
from sie.core.validation import Text
from sie.http.compat import (
    abandonable,
    cohere_error,
    counted,
    model_for,
    ranking,
    read_request,
    renamed,
    scores_of,
)
from sie.http.inference import routing_of
from sie.http.negotiation import FastJSONResponse
from sie.roles.gateway import Collected, GatewayRole

__all__ = [
    "RerankDocument",
    "RerankMeta",
    "RerankRequest",
    "RerankResponse",
    "RerankResult",
    "rerank_v1",
    "rerank_v2",
]


class RerankRequest(BaseModel):
    """The body of ``POST /v1/rerank`` and ``/v2/rerank``. Unknown fields are ignored
    (docs/api.md §1); ``null`` is the same as absent."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    model: StrictStr | None = None
    query: Text
    documents: list[Text | dict[str, Any]] = Field(min_length=1)
    top_n: StrictInt | None = Field(default=None, gt=0)
    return_documents: StrictBool | None = None
    rank_fields: list[Text] | None = None
    max_chunks_per_doc: StrictInt | None = Field(default=None, gt=0)
    max_tokens_per_doc: StrictInt | None = Field(default=None, gt=0)
    priority: StrictInt | None = None


class RerankDocument(BaseModel):
    """A returned document: ``{"text"}``, or the whole object that was sent."""

    model_config = ConfigDict(extra="allow")
    text: str


class RerankResult(BaseModel):
    index: int = Field(description="the document's position in the request")
    relevance_score: float = Field(description="the model's score, as POST /v1/score gives it")
    document: RerankDocument | None = None


class RerankMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    api_version: dict[str, str]
    tokens: dict[str, int]


class RerankResponse(BaseModel):
    """``results`` best first (docs/api.md §15)."""

    model_config = ConfigDict(extra="allow")
    id: str
    results: list[RerankResult]
    model: str
    meta: RerankMeta
    usage: dict[str, int]


def _texts(req: RerankRequest) -> list[str]:
    """Each document's text: the string, or a dict's ``text``.

    Raises:
        InvalidInput: ``rank_fields`` other than ``["text"]``; a dict without a
            string ``text`` (or one with an unpaired surrogate); with
            ``return_documents``, a dict that cannot be rendered as JSON (non-UTF-8 bytes
            from a msgpack body, a surrogate in another field), naming ``documents[i]``.
    """
    if req.rank_fields is not None and list(req.rank_fields) != ["text"]:
        raise InvalidInput(
            f"rank_fields: SIE ranks by the documents' text field only; got "
            f"{list(req.rank_fields)[:8]!r} (omit rank_fields, or send ['text'])",
            field="rank_fields",
        )
    texts = []
    for i, doc in enumerate(req.documents):
        if isinstance(doc, str):
            texts.append(doc)
            continue
        text = doc.get("text")
        if not isinstance(text, str):
            raise InvalidInput(
                f"documents[{i}].text: required (a string) when the document is an object",
                field=f"documents[{i}].text",
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidInput(
                f"documents[{i}].text: contains an unpaired surrogate at position {exc.start}",
                field=f"documents[{i}].text",
            ) from None
        if req.return_documents:  # it comes back whole: it must render as JSON
            try:
                FastJSONResponse(doc)
            except PydanticSerializationError:
                raise InvalidInput(
                    f"documents[{i}]: cannot be returned as JSON (bytes that are not UTF-8, "
                    "or an unpaired surrogate); send text values only, or omit return_documents",
                    field=f"documents[{i}]",
                ) from None
        texts.append(text)
    return texts


def _refuse_unsupported(req: RerankRequest, window: int | None, model: str) -> None:
    """400 for the options that would change results SIE cannot change."""
    if req.max_chunks_per_doc is not None and req.max_chunks_per_doc > 1:
        raise InvalidInput(
            f"max_chunks_per_doc: SIE does not split documents into chunks; each is read "
            f"once, truncated to the model's window (send 1 or omit it), got "
            f"{req.max_chunks_per_doc}",
            field="max_chunks_per_doc",
        )
    if req.max_tokens_per_doc is not None and (window is None or req.max_tokens_per_doc < window):
        limit = f"its window of {window} tokens" if window else "the model's window"
        raise InvalidInput(
            f"max_tokens_per_doc: model {model!r} truncates documents to {limit}; SIE cannot "
            f"truncate them to {req.max_tokens_per_doc} (send at least {window} or omit it)"
            if window
            else f"max_tokens_per_doc: model {model!r} declares no max_sequence_length, so "
            f"SIE cannot honour {req.max_tokens_per_doc} (omit it)",
            field="max_tokens_per_doc",
        )


async def rerank_v1(request: Request) -> Response:
    """``POST /v1/rerank``: Cohere v1 and Jina (docs/api.md §15)."""
    return await _rerank(request, "1")


async def rerank_v2(request: Request) -> Response:
    """``POST /v2/rerank``: Cohere v2, e.g. ``cohere.ClientV2(...).rerank`` and
    LlamaIndex's ``CohereRerank`` (docs/api.md §15)."""
    return await _rerank(request, "2")


async def _rerank(request: Request, api_version: Literal["1", "2"]) -> Response:
    async def run(gateway: GatewayRole) -> Response:
        if request.state.request_id is None:  # /v2/: the gateway mints ids for /v1/ only
            request.state.request_id = uuid7()
        req = await read_request(request, gateway, RerankRequest)
        model = model_for(gateway, req.model, "rerank")
        request.state.model = model  # for the access line and the metrics
        texts = _texts(req)
        request.state.items = len(texts)
        entry, _ = gateway.registry.resolve(model)
        _refuse_unsupported(req, entry.config.max_sequence_length, model)
        try:
            got = await abandonable(
                request,
                lambda: gateway.score(
                    model,
                    {"text": req.query},
                    [{"text": t} for t in texts],
                    routing=routing_of(request),
                ),
            )
        except SieError as exc:
            raise renamed(exc, "documents", "query") from None
        if not isinstance(got, Collected):
            return got  # the client left
        return FastJSONResponse(_body(request, req, model, got, len(texts), api_version))

    return await counted(request, "rerank", run, cohere_error)


def _body(
    request: Request,
    req: RerankRequest,
    model: str,
    collected: Collected,
    n: int,
    api_version: str,
) -> dict[str, Any]:
    scores = scores_of(collected, n)
    results = []
    for i in ranking(scores, req.top_n):
        result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if req.return_documents:
            doc = req.documents[i]
            result["document"] = {"text": doc} if isinstance(doc, str) else doc
        results.append(result)
    tokens = sum(r.input_tokens or 0 for r in collected.results)
    return {
        "id": request.state.request_id,
        "results": results,
        "model": model,
        "meta": {
            "api_version": {"version": api_version},
            "tokens": {"input_tokens": tokens, "output_tokens": 0},
        },
        "usage": {"total_tokens": tokens},
    }
