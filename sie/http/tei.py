"""Hugging Face Text Embeddings Inference (TEI) routes over SIE's functions
(docs/api.md §15). A TEI server serves one model; SIE serves many, so each route takes
an optional ``model`` in the body (``/info``: ``?model=``), else the gateway's
``SIE_DEFAULT_EMBED_MODEL`` / ``SIE_DEFAULT_SPARSE_MODEL`` / ``SIE_DEFAULT_RERANK_MODEL``
(400 naming the setting when unset).

    POST /embed         {inputs: str | [str], normalize=true, truncate?, truncation_direction?,
                        prompt_name?, dimensions?} -> [[float]]
    POST /embed_sparse  {inputs, truncate?, truncation_direction?, prompt_name?}
                        -> [[{index, value}]]  (non-zero weights, index ascending)
    POST /rerank        {query, texts: [str], raw_scores=false, return_text=false, truncate?,
                        truncation_direction?} -> [{index, score, text?}]  (best first)
    GET  /info          {model_id, model_type, max_input_length, max_batch_tokens,
                        max_client_batch_size, auto_truncate, version, ...}

How TEI's options map: ``truncate`` unset or true truncates to the model's
``max_sequence_length`` (SIE's default; TEI's ``--auto-truncate``); ``truncate: false``
is 400 naming ``inputs[i]`` when an input fills the model's window (SIE cannot tell an
input that exactly fills it from a longer one, so both are refused); so is
``truncation_direction: "Left"`` (SIE keeps the start of a text); ``/rerank`` refuses
``truncate: false`` (pairs are truncated to the window together, uncounted).
``prompt_name`` ``query`` encodes as a query (the profile's ``query_template``; SPLADE's
query side), ``document`` / ``passage`` as a document (the default); other names are
400. ``raw_scores: false`` asks cross-encoders for a sigmoid (TEI's default),
``true`` for the raw logit; bi-encoder and sparse scores are the same either way.
``dimensions`` truncates and re-normalises for matryoshka models only. A ``parameters``
object (the Hugging Face Inference API's wrapper, sent by ``huggingface_hub``'s
``InferenceClient``) is read as top-level fields.

Errors: TEI's ``{"error", "error_type"}`` with SIE's status, ``code`` and fields
(``sie.http.compat.tei_error``).
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from starlette.requests import Request
from starlette.responses import Response

from sie import __version__
from sie.core.errors import InvalidInput, PayloadTooLarge, SieError
from sie.core.registry import ModelEntry
from sie.core.validation import Text
from sie.http.compat import (
    abandonable,
    counted,
    model_for,
    ranking,
    read_request,
    renamed,
    scores_of,
    tei_error,
)
from sie.http.inference import routing_of
from sie.http.negotiation import FastJSONResponse
from sie.http.openai import MAX_COMPAT_RESPONSE_BODY
from sie.roles.gateway import Collected, GatewayRole

__all__ = [
    "TeiEmbedRequest",
    "TeiInfo",
    "TeiRank",
    "TeiRerankRequest",
    "TeiSparseRequest",
    "TeiSparseValue",
    "tei_embed",
    "tei_embed_sparse",
    "tei_info",
    "tei_rerank",
]

T = TypeVar("T", bound=BaseModel)
Direction = Literal["Left", "Right", "left", "right"]
PROMPTS = {"query": True, "document": False, "passage": False}


class _Tei(BaseModel):
    """TEI bodies: unknown fields ignored (docs/api.md §1), ``null`` as absent."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    model: StrictStr | None = None
    truncate: StrictBool | None = None
    truncation_direction: Direction | None = None
    parameters: dict[str, Any] | None = None


class _TeiInputs(_Tei):
    inputs: Text | list[Text]
    prompt_name: StrictStr | None = None


class TeiEmbedRequest(_TeiInputs):
    """``POST /embed``."""

    normalize: StrictBool = True
    dimensions: StrictInt | None = Field(default=None, gt=0)


class TeiSparseRequest(_TeiInputs):
    """``POST /embed_sparse``."""


class TeiRerankRequest(_Tei):
    """``POST /rerank``."""

    query: Text
    texts: list[Text] = Field(min_length=1)
    raw_scores: StrictBool = False
    return_text: StrictBool = False


class TeiSparseValue(BaseModel):
    index: int
    value: float


class TeiRank(BaseModel):
    index: int
    score: float
    text: str | None = None


class TeiInfo(BaseModel):
    """``GET /info``: TEI's fields, filled from the model's config and SIE's limits."""

    model_config = ConfigDict(extra="allow")
    model_id: str
    model_type: dict[str, Any]
    max_input_length: int | None
    max_batch_tokens: int
    max_client_batch_size: int
    auto_truncate: bool
    version: str


def _flatten(payload: Any) -> Any:
    """The Inference API's ``{"inputs", "parameters": {...}}`` as one flat body; token-id
    inputs refused with a clear message.

    Raises:
        InvalidInput: a key given both inside ``parameters`` and beside it; token ids;
            a list element that is not a string (naming ``inputs[i]``).
    """
    if not isinstance(payload, dict):
        return payload
    params = payload.get("parameters")
    if isinstance(params, dict):
        both = sorted(k for k in params if payload.get(k) is not None)
        if both:
            raise InvalidInput(
                f"parameters.{both[0]}: also given outside parameters; send it once",
                field=f"parameters.{both[0]}",
            )
        payload = {**{k: v for k, v in payload.items() if k != "parameters"}, **params}
    inputs = payload.get("inputs")
    if isinstance(inputs, list) and any(
        isinstance(x, int | list) and not isinstance(x, bool) for x in inputs
    ):
        raise InvalidInput(
            "inputs: token-id inputs are not supported; send a string or a list of strings",
            field="inputs",
        )
    if isinstance(inputs, list):  # name the element, not the list (as /v1/embeddings)
        for i, x in enumerate(inputs):
            if not isinstance(x, str):
                raise InvalidInput(f"inputs[{i}]: expected a string", field=f"inputs[{i}]")
    return payload


async def _read(request: Request, gateway: GatewayRole, schema: type[T]) -> T:
    return await read_request(request, gateway, schema, _flatten)


def _is_query(prompt_name: str | None) -> bool:
    if prompt_name is None:
        return False
    if prompt_name not in PROMPTS:
        raise InvalidInput(
            f"prompt_name: SIE knows the prompts {sorted(PROMPTS)} (query: the query side "
            f"of the model, the others: the document side); got {prompt_name[:64]!r}",
            field="prompt_name",
        )
    return PROMPTS[prompt_name]


def _check_truncation(
    req: _Tei, entry: ModelEntry, collected: Collected, field: str = "inputs"
) -> None:
    """400 when ``truncate: false`` or ``truncation_direction: Left`` and an input
    filled the model's window (its token count is reported after truncation)."""
    strict = req.truncate is False
    left = (req.truncation_direction or "right").lower() == "left"
    if not strict and not left:
        return
    window = entry.config.max_sequence_length
    name = "truncate" if strict else "truncation_direction"
    if window is None:
        raise InvalidInput(
            f"{name}: model {entry.model_id!r} declares no max_sequence_length, so SIE "
            "cannot tell whether an input was truncated; omit it",
            field=name,
        )
    for i, r in enumerate(collected.results):
        if (r.input_tokens or 0) >= window:
            fix = (
                "send truncate: true (or omit it) or a shorter text"
                if strict
                else "SIE truncates the end of a text; omit truncation_direction or send "
                "a shorter text"
            )
            raise InvalidInput(
                f"{field}[{i}]: has at least {window} tokens, the most model "
                f"{entry.model_id!r} reads (max_sequence_length); {fix}",
                field=f"{field}[{i}]",
                tokens=r.input_tokens,
                limit=window,
            )


async def _encode(
    request: Request, gateway: GatewayRole, req: _TeiInputs, kind: str, output: str
) -> tuple[ModelEntry, list[dict[str, Any]]] | Response:
    model = model_for(gateway, req.model, kind)
    request.state.model = model
    texts = [req.inputs] if isinstance(req.inputs, str) else list(req.inputs)
    request.state.items = len(texts)
    if not texts:
        raise InvalidInput("inputs: must not be empty", field="inputs")
    is_query = _is_query(req.prompt_name)
    entry, _ = gateway.registry.resolve(model)
    enc = entry.config.tasks.encode
    if enc is None or getattr(enc, output) is None:
        route = "/embed" if output == "dense" else "/embed_sparse"
        raise InvalidInput(
            f"model {model!r} does not produce {output} embeddings ({route}); it offers "
            f"{entry.config.outputs or 'no task'}",
            field="model",
        )
    options: dict[str, Any] = {}
    if isinstance(req, TeiEmbedRequest):
        options["normalize"] = req.normalize
    try:
        got = await abandonable(
            request,
            lambda: gateway.encode(
                model,
                [{"text": t} for t in texts],
                output_types=[output],
                is_query=is_query,
                options=options or None,
                routing=routing_of(request),
            ),
        )
    except SieError as exc:
        raise renamed(exc, "inputs") from None
    if not isinstance(got, Collected):
        return got  # the client left
    if (size := got.result_bytes()) > MAX_COMPAT_RESPONSE_BODY:
        raise PayloadTooLarge(
            f"the embeddings of these {len(texts)} inputs take {size} bytes, over the "
            f"{MAX_COMPAT_RESPONSE_BODY}-byte reply limit of the TEI routes; send fewer inputs",
            field="inputs",
        )
    _check_truncation(req, entry, got)
    return entry, [r.result()[output] for r in got.results]


async def tei_embed(request: Request) -> Response:
    """``POST /embed`` (docs/api.md §15): one dense vector per input."""

    async def run(gateway: GatewayRole) -> Response:
        req: TeiEmbedRequest = await _read(request, gateway, TeiEmbedRequest)
        got = await _encode(request, gateway, req, "embed", "dense")
        if isinstance(got, Response):
            return got
        entry, dense = got
        native = entry.config.tasks.encode.dense.dim  # type: ignore[union-attr]
        dims = req.dimensions
        if dims is not None and dims != native:
            matryoshka = entry.config.tasks.encode.dense.matryoshka  # type: ignore[union-attr]
            if not matryoshka or dims > native:
                raise InvalidInput(
                    f"dimensions: model {entry.model_id!r} has width {native}"
                    + (
                        f"; at most {native}"
                        if matryoshka
                        else " and does not support other dimensions"
                    ),
                    field="dimensions",
                )
        vectors = []
        for d in dense:
            vec = np.asarray(d["values"], dtype=np.float32)
            if dims is not None and dims < native:
                vec = vec[:dims]
                norm = float(np.linalg.norm(vec))
                vec = vec / norm if req.normalize and norm > 0 else vec
            vectors.append(vec.tolist())
        return FastJSONResponse(vectors)

    return await counted(request, "tei_embed", run, tei_error)


async def tei_embed_sparse(request: Request) -> Response:
    """``POST /embed_sparse`` (docs/api.md §15): per input, its non-zero
    ``{index, value}`` weights over the vocabulary, index ascending."""

    async def run(gateway: GatewayRole) -> Response:
        req: TeiSparseRequest = await _read(request, gateway, TeiSparseRequest)
        got = await _encode(request, gateway, req, "sparse", "sparse")
        if isinstance(got, Response):
            return got
        out = [
            [
                {"index": int(i), "value": float(v)}
                for i, v in zip(s["indices"], s["values"], strict=True)
            ]
            for s in got[1]
        ]
        return FastJSONResponse(out)

    return await counted(request, "tei_embed_sparse", run, tei_error)


async def tei_rerank(request: Request) -> Response:
    """``POST /rerank`` (docs/api.md §15): every text's score against ``query``, best
    first (equal scores in input order), as ``POST /v1/score`` ranks them."""

    async def run(gateway: GatewayRole) -> Response:
        req: TeiRerankRequest = await _read(request, gateway, TeiRerankRequest)
        model = model_for(gateway, req.model, "rerank")
        request.state.model = model
        request.state.items = len(req.texts)
        if req.truncate is False:
            raise InvalidInput(
                "truncate: /rerank truncates each (query, text) pair to the model's window "
                "and cannot refuse over-long pairs; omit truncate or send true",
                field="truncate",
            )
        if (req.truncation_direction or "right").lower() == "left":
            raise InvalidInput(
                "truncation_direction: SIE truncates the end of a text; omit it or send Right",
                field="truncation_direction",
            )
        try:
            got = await abandonable(
                request,
                lambda: gateway.score(
                    model,
                    {"text": req.query},
                    [{"text": t} for t in req.texts],
                    options={"activation": "none" if req.raw_scores else "sigmoid"},
                    routing=routing_of(request),
                ),
            )
        except SieError as exc:
            raise renamed(exc, "texts", "query") from None
        if not isinstance(got, Collected):
            return got  # the client left
        scores = scores_of(got, len(req.texts))
        ranks = []
        for i in ranking(scores):
            rank: dict[str, Any] = {"index": i, "score": scores[i]}
            if req.return_text:
                rank["text"] = req.texts[i]
            ranks.append(rank)
        return FastJSONResponse(ranks)

    return await counted(request, "tei_rerank", run, tei_error)


async def tei_info(request: Request) -> Response:
    """``GET /info[?model=]`` (docs/api.md §15): TEI's description of the served model
    (default: the first of the embed, sparse and rerank defaults that is set)."""

    async def run(gateway: GatewayRole) -> Response:
        s = gateway.settings
        model = (
            request.query_params.get("model")
            or s.default_embed_model
            or s.default_sparse_model
            or s.default_rerank_model
        )
        if not model:
            raise InvalidInput(
                "model: name one with ?model= or set SIE_DEFAULT_EMBED_MODEL, "
                "SIE_DEFAULT_SPARSE_MODEL or SIE_DEFAULT_RERANK_MODEL on the gateway "
                "(docs/api.md §15)",
                field="model",
            )
        request.state.model = model
        entry, _ = gateway.registry.resolve(model)
        cfg = entry.config
        enc = cfg.tasks.encode
        if enc is not None and enc.dense is not None:
            model_type: dict[str, Any] = {"embedding": {"pooling": "mean"}}
        elif enc is not None and enc.sparse is not None:
            model_type = {"embedding": {"pooling": "splade"}}
        elif cfg.tasks.score is not None:
            model_type = {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
        else:
            model_type = {"classifier": {"id2label": {}, "label2id": {}}}
        return FastJSONResponse(
            {
                "model_id": entry.model_id,
                "model_sha": cfg.hf_revision,
                "model_dtype": entry.profile.compute_precision or "float32",
                "model_type": model_type,
                "max_concurrent_requests": gateway.settings.max_lane_in_flight_items,
                "max_input_length": cfg.max_sequence_length,
                "max_batch_tokens": entry.profile.max_batch_tokens,
                "max_batch_requests": None,
                "max_client_batch_size": gateway.limits.max_items_per_request,
                "auto_truncate": True,
                "tokenization_workers": 0,  # the workers tokenise, not the gateway
                "version": __version__,
                "sha": None,
                "docker_label": None,
            }
        )

    return await counted(request, "tei_info", run, tei_error)
