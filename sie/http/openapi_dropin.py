"""The drop-in routes' rows of the gateway's OpenAPI document (``sie.http.openapi``;
docs/api.md §15): Cohere/Jina rerank, TEI, ``/version`` and the native functions with
the model in the body, each with the error envelope of the server it imitates.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, RootModel, StrictStr

from sie.http.compat import TeiError
from sie.http.dropin import VersionInfo
from sie.http.openapi import (
    JSON,
    MSGPACK,
    Content,
    Operation,
    Param,
    Reply,
    Schema,
    error_replies,
    errors,
)
from sie.http.openapi_common import BODY, READ, WORK, ok
from sie.http.rerank import RerankRequest, RerankResponse
from sie.http.responses import EncodeResponse, ExtractResponse, ScoreResponse
from sie.http.responses_admin import ErrorDetail
from sie.http.schemas import EncodeRequest, ExtractRequest, ScoreRequest
from sie.http.tei import (
    TeiEmbedRequest,
    TeiInfo,
    TeiRank,
    TeiRerankRequest,
    TeiSparseRequest,
    TeiSparseValue,
)

__all__ = ["DROPIN_TAGS", "dropin_operations"]

DROPIN_TAGS = {
    "rerank": "Cohere / Jina rerank (docs/api.md §15)",
    "tei": "Hugging Face Text Embeddings Inference routes (docs/api.md §15)",
}


class CohereClientError(BaseModel):
    """4xx of ``/v1/rerank`` and ``/v2/rerank``: SIE's envelope plus Cohere's ``message``."""

    model_config = ConfigDict(extra="allow")
    message: str
    detail: ErrorDetail


class CohereServerError(BaseModel):
    """5xx of ``/v1/rerank`` and ``/v2/rerank``."""

    model_config = ConfigDict(extra="allow")
    message: str
    error: ErrorDetail


class TeiEmbedResponse(RootModel[list[list[float]]]):
    """``POST /embed``: one vector per input."""


class TeiSparseResponse(RootModel[list[list[TeiSparseValue]]]):
    """``POST /embed_sparse``: per input, its non-zero weights, index ascending."""


class TeiRerankResponse(RootModel[list[TeiRank]]):
    """``POST /rerank``: best first."""


class EncodeWithModel(EncodeRequest):
    model: StrictStr


class ScoreWithModel(ScoreRequest):
    model: StrictStr


class ExtractWithModel(ExtractRequest):
    model: StrictStr


def _rerank(path: str, summary: str) -> Operation:
    return Operation(
        "POST",
        path,
        summary,
        {200: ok(RerankResponse)}
        | error_replies(CohereClientError, CohereServerError, *READ, *BODY, *WORK),
        body=Content(RerankRequest, (JSON, MSGPACK)),
        tag="rerank",
        description="docs/api.md §15. relevance_score is POST /v1/score's score; options "
        "SIE cannot honour are 400 naming them.",
    )


def _tei(path: str, request: type[BaseModel], reply: Schema, summary: str) -> Operation:
    return Operation(
        "POST",
        path,
        summary,
        {200: ok(reply)} | error_replies(TeiError, TeiError, *READ, *BODY, *WORK),
        body=Content(request, (JSON, MSGPACK)),
        tag="tei",
        description="docs/api.md §15. No model in the body: the gateway's default model "
        "for the route, else 400 naming the setting.",
    )


def _with_model(name: str, request: type[BaseModel], reply: type[BaseModel]) -> Operation:
    return Operation(
        "POST",
        f"/v1/{name}",
        f"/v1/{name}/{{model}} with the model in the body",
        {200: Reply("OK", (Content(reply, (JSON, MSGPACK)),), ("X-SIE-Request-Id",))}
        | errors("sie", *READ, *BODY, *WORK),
        body=Content(request, (JSON, MSGPACK)),
        tag="inference",
        description="docs/api.md §15: the same answer as the route with the model in the path.",
    )


def dropin_operations() -> tuple[Operation, ...]:
    """The rows of ``sie.http.dropin.dropin_routes()``."""
    return (
        _rerank("/v1/rerank", "Rerank documents (Cohere v1, Jina)"),
        _rerank("/v2/rerank", "Rerank documents (Cohere v2)"),
        _tei("/embed", TeiEmbedRequest, TeiEmbedResponse, "TEI: dense embeddings"),
        _tei("/embed_sparse", TeiSparseRequest, TeiSparseResponse, "TEI: sparse embeddings"),
        _tei("/rerank", TeiRerankRequest, TeiRerankResponse, "TEI: rerank texts"),
        Operation(
            "GET",
            "/info",
            "TEI: the described model",
            {200: ok(TeiInfo)} | error_replies(TeiError, TeiError, *READ, 400, 404),
            params=(Param("model", "query", "the model (default: the first default set)"),),
            tag="tei",
            description="docs/api.md §15",
        ),
        Operation(
            "GET",
            "/version",
            "SIE's version, commit and API surfaces",
            {200: ok(VersionInfo)} | errors("sie", *READ),
            tag="meta",
            description="docs/api.md §15",
        ),
        _with_model("encode", EncodeWithModel, EncodeResponse),
        _with_model("score", ScoreWithModel, ScoreResponse),
        _with_model("extract", ExtractWithModel, ExtractResponse),
    )
