"""The gateway's route table for its OpenAPI document (``sie.http.openapi``; docs/api.md
§14). Every route ``build_gateway_app`` registers has a row here (a test holds it so).
"""

from __future__ import annotations

from sie.core.pools import PoolSpec
from sie.engines.openai_params import ChatBody, CompletionBody, NativeBody
from sie.http.openapi import (
    HTML,
    JSON,
    MSGPACK,
    SSE,
    STATUS_TEXT,
    TEXT,
    YAML,
    ApiTable,
    Content,
    Operation,
    Param,
    Reply,
    Schema,
    WebSocketOp,
    errors,
    self_operations,
)
from sie.http.openapi_common import BODY, READ, WORK, ConfigReads, config_reads, ok
from sie.http.openapi_dropin import DROPIN_TAGS, dropin_operations
from sie.http.responses import (
    ChatCompletion,
    EmbeddingsResponse,
    EncodeResponse,
    ExtractResponse,
    GenerateResponse,
    ModelList,
    ModelObject,
    ScoreResponse,
    TextCompletion,
)
from sie.http.responses_admin import (
    ClusterStatus,
    GatewayHealth,
    ModelAckStatus,
    ModelNotFoundReply,
    PoolDeleted,
    PoolInfo,
    PoolList,
)
from sie.http.schemas import (
    EmbeddingsRequest,
    EncodeRequest,
    ExtractRequest,
    ScoreRequest,
)

__all__ = ["gateway_table"]

#: Admin routes: 401 missing token, 403 another token (or SIE_ADMIN_TOKEN unset).
ADMIN = (401, 403)

ROUTING = (
    Param("X-SIE-Pool", "header", "the pool to run on (docs/pools.md); unknown: 404"),
    Param("X-SIE-Machine-Profile", "header", "the machine profile to run on"),
)
MODEL = Param("model", "path", "a model id, or model:profile")
TIMING = (
    "X-SIE-Request-Id",
    "X-SIE-Worker",
    "X-Queue-Publish-Time",
    "X-Queue-Time",
    "X-Inference-Time",
    "X-Tokenization-Time",
    "X-Total-Time",
)
REQ_ID = ("X-SIE-Request-Id",)
CONFIG_DOC = {"type": "object", "description": "the model config, YAML (docs/api.md §9)"}
BUNDLE_DOC = {"type": "object", "description": "the bundle, YAML (docs/api.md §9)"}


def _ok(model: Schema, *media: str, headers: tuple[str, ...] = REQ_ID) -> Reply:
    return ok(model, *media, headers=headers)


def _inference(
    name: str, request: Schema, response: Schema, summary: str, section: str
) -> Operation:
    return Operation(
        "POST",
        f"/v1/{name}/{{model:path}}",
        summary,
        {200: _ok(response, JSON, MSGPACK, headers=TIMING)} | errors("sie", *READ, *BODY, *WORK),
        body=Content(request, (JSON, MSGPACK)),
        params=(MODEL, *ROUTING),
        tag="inference",
        description=f"docs/api.md {section}. Answers msgpack (numpy arrays in "
        "msgpack-numpy form) when Accept names application/msgpack.",
    )


def _generation(path: str, request: Schema, reply: Schema, summary: str) -> Operation:
    return Operation(
        "POST",
        path,
        summary,
        {
            200: Reply(
                "the completion; with stream: true an event stream of chunks, then data: [DONE]",
                (Content(reply), Content(None, (SSE,))),
                REQ_ID,
            )
        }
        | errors("openai", *READ, *BODY, *WORK),
        body=Content(request, (JSON,)),
        params=(MODEL, *ROUTING) if "{model" in path else ROUTING,
        tag="generation",
        description="docs/api.md §5. JSON bodies only (msgpack is 415).",
    )


def _pool_ops() -> tuple[Operation, ...]:
    name = Param(
        "name", "path", "a pool name: 1-63 of [A-Za-z0-9_-]", {"type": "string", "minLength": 1}
    )
    one = {200: _ok(PoolInfo)} | errors("sie", 400, 404)
    return (
        Operation(
            "GET",
            "/v1/pools",
            "List pools, default first",
            {200: _ok(PoolList)} | errors("sie", *READ),
            tag="pools",
        ),
        Operation(
            "POST",
            "/v1/pools",
            "Create (201) or renew (200, the same spec) a pool",
            {200: _ok(PoolInfo), 201: _ok(PoolInfo)} | errors("sie", *ADMIN, *BODY, 409),
            auth="admin",
            body=Content(PoolSpec, (JSON, MSGPACK)),
            tag="pools",
        ),
        Operation(
            "GET",
            "/v1/pools/{name}",
            "One pool",
            one | errors("sie", *READ),
            params=(name,),
            tag="pools",
        ),
        Operation(
            "DELETE",
            "/v1/pools/{name}",
            "Delete a pool (the default pool: 403)",
            {200: _ok(PoolDeleted)} | errors("sie", *ADMIN, 400, 404),
            auth="admin",
            params=(name,),
            tag="pools",
        ),
        Operation(
            "POST",
            "/v1/pools/{name}/renew",
            "Extend a pool's lease",
            one | errors("sie", *ADMIN),
            auth="admin",
            params=(name,),
            tag="pools",
        ),
    )


def _config_ops(reads: ConfigReads) -> tuple[Operation, ...]:
    return (
        reads.models,
        Operation(
            "GET",
            "/v1/configs/models/{model:path}",
            "A model's config (YAML), or with /status its worker acks (JSON)",
            {
                200: Reply(
                    "the YAML config, or for {id}/status the ack status",
                    (Content(CONFIG_DOC, (YAML,)), Content(ModelAckStatus)),
                    REQ_ID,
                )
            }
            | errors("sie", *READ, 404),
            params=(Param("model", "path", "a model id, or {id}/status"),),
            tag="configs",
            description="docs/api.md §8; architecture §6 for the status.",
        ),
        reads.bundles,
        reads.bundle,
        reads.resolve,
    )


def _operational(reads: ConfigReads) -> tuple[Operation, ...]:
    text = Content({"type": "string"}, (TEXT,))
    return (
        Operation(
            "GET",
            "/v1/models",
            "Served models: the OpenAI list and SIE's ModelInfo",
            {200: _ok(ModelList)} | errors("sie", *READ),
            tag="models",
            description="docs/api.md §7",
        ),
        Operation(
            "GET",
            "/v1/models/{model:path}",
            "One model: OpenAI's model object and its ModelInfo",
            {
                200: _ok(ModelObject),
                404: Reply(STATUS_TEXT[404], (Content(ModelNotFoundReply),), ("X-SIE-Error-Code",)),
            }
            | errors("sie", *READ),
            params=(MODEL,),
            tag="models",
            description="docs/api.md §7",
        ),
        Operation(
            "GET",
            "/healthz",
            "Liveness: ok",
            {200: Reply("ok", (text,))},
            auth="open",
            tag="health",
        ),
        Operation(
            "GET",
            "/readyz",
            "Readiness: ok; 503 draining during shutdown",
            {200: Reply("ok", (text,)), 503: Reply("draining", (text,))},
            auth="open",
            tag="health",
        ),
        Operation(
            "GET",
            "/health",
            "Workers, their models and capacity",
            {200: _ok(GatewayHealth, headers=())} | errors("sie", *READ),
            tag="health",
        ),
        reads.metrics,
        Operation(
            "GET",
            "/",
            "The operator's status page (?token= for auth)",
            {200: Reply("HTML", (Content({"type": "string"}, (HTML,)),))} | errors("sie", *READ),
            params=(Param("token", "query", "the bearer token, for a browser (auth on)"),),
            tag="health",
            description="docs/api.md §13",
        ),
        Operation(
            "GET",
            "/v1/cluster/status",
            "Workers, models, pools, lanes and capacity, once",
            {200: _ok(ClusterStatus)} | errors("sie", *READ),
            tag="health",
            description="docs/api.md §13",
        ),
    )


def gateway_table() -> ApiTable:
    """The gateway's routes (``sie.http.gateway.build_gateway_app``)."""
    reads = config_reads(
        "sie",
        READ,
        models_summary="Model configs this gateway serves",
        bundles_summary="Bundles and their connected workers",
        bundle_doc=BUNDLE_DOC,
        headers=REQ_ID,
    )
    return ApiTable(
        title="SIE gateway",
        description="Encode, score, extract, generate; models, pools, configs, health "
        "(docs/api.md). Errors: docs/api.md §11.",
        operations=(
            _inference("encode", EncodeRequest, EncodeResponse, "Encode items", "§2"),
            _inference("score", ScoreRequest, ScoreResponse, "Rank items against a query", "§3"),
            _inference("extract", ExtractRequest, ExtractResponse, "Extract entities", "§4"),
            Operation(
                "POST",
                "/v1/embeddings",
                "OpenAI embeddings",
                {200: _ok(EmbeddingsResponse, headers=TIMING)}
                | errors("openai", *READ, *BODY, *WORK),
                body=Content(EmbeddingsRequest, (JSON, MSGPACK)),
                params=ROUTING,
                tag="openai",
                description="docs/api.md §6",
            ),
            _generation("/v1/chat/completions", ChatBody, ChatCompletion, "OpenAI chat"),
            _generation("/v1/completions", CompletionBody, TextCompletion, "OpenAI completions"),
            _generation(
                "/v1/generate/{model:path}", NativeBody, GenerateResponse, "SIE-native generation"
            ),
            *_operational(reads),
            *_pool_ops(),
            *_config_ops(reads),
            *self_operations("sie", READ),
            *dropin_operations(),  # Cohere/Jina, TEI, /version, model in the body (§15)
        ),
        websockets=(
            WebSocketOp(
                "/ws/cluster-status",
                "The cluster status, on connect and on every change",
                ClusterStatus,
                description="docs/api.md §13; ?token= for auth; other origins refused",
            ),
        ),
        tags={
            "inference": "SIE-native encode, score, extract (docs/api.md §2-§4)",
            "openai": "OpenAI-compatible embeddings (docs/api.md §6)",
            "generation": "OpenAI-compatible and native generation (docs/api.md §5)",
            "models": "served models (docs/api.md §7)",
            "pools": "pools (docs/pools.md)",
            "configs": "the config read surface (docs/api.md §8)",
            "health": "probes, health, metrics, cluster status (docs/api.md §7, §13)",
            "meta": "this description (docs/api.md §14)",
            **DROPIN_TAGS,
        },
    )
