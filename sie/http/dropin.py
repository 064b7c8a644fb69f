"""Drop-in routes: what users of other servers call, served by SIE (docs/api.md §15).

    POST /v1/rerank, /v2/rerank         Cohere / Jina rerank (sie.http.rerank)
    POST /embed, /embed_sparse, /rerank Hugging Face TEI (sie.http.tei)
    GET  /info                          TEI's model description (sie.http.tei)
    GET  /version                       {version, git_sha, api: {...}}
    POST /v1/encode, /v1/score,         the native functions with the model in the body
         /v1/extract                    ({"model": ..., ...}) instead of the path

``dropin_routes()`` lists them for the gateway's app; ``dropin_refusal`` gives a refusal
made before a route runs (auth, body limits) the envelope of the server the path
imitates.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message

from sie import __version__
from sie.core.errors import InvalidInput, SieError, WireError
from sie.core.nesting import DEFAULT_MAX_DEPTH, check_depth
from sie.core.wire import unpackb
from sie.http.compat import cohere_error, tei_error
from sie.http.inference import encode, extract, score
from sie.http.negotiation import check_charset, decode_json, decode_off_loop, is_msgpack, read_body
from sie.http.rerank import rerank_v1, rerank_v2
from sie.http.tei import tei_embed, tei_embed_sparse, tei_info, tei_rerank
from sie.roles.gateway import GatewayRole

__all__ = [
    "API",
    "COHERE_PATHS",
    "TEI_PATHS",
    "VersionInfo",
    "dropin_refusal",
    "dropin_routes",
    "git_sha",
    "version",
]

COHERE_PATHS = frozenset({"/v1/rerank", "/v2/rerank"})
TEI_PATHS = frozenset({"/embed", "/embed_sparse", "/rerank", "/info"})

#: The API surfaces this gateway answers, for ``GET /version``.
API: dict[str, Any] = {
    "sie": "v1",
    "openai": "v1",
    "cohere_rerank": ["v1", "v2"],
    "jina_rerank": "v1",
    "tei": ["embed", "embed_sparse", "rerank", "info"],
}


class VersionInfo(BaseModel):
    """``GET /version``: ``git_sha`` is the checkout's commit when SIE runs from a git
    checkout, else null."""

    version: str
    git_sha: str | None
    api: dict[str, Any]


def _read_ref(git: Path, ref: str) -> str | None:
    loose = git / ref
    if loose.is_file():
        return loose.read_text().strip() or None
    packed = git / "packed-refs"
    if packed.is_file():
        for line in packed.read_text().splitlines():
            sha, _, name = line.partition(" ")
            if name.strip() == ref:
                return sha
    return None


@cache
def git_sha(root: Path | None = None) -> str | None:
    """The commit of the git checkout SIE runs from (read from ``.git``, no git
    process), or None (an installed wheel, an unreadable checkout)."""
    base = root or Path(__file__).resolve().parents[2]
    git = base / ".git"
    try:
        if git.is_file():  # a worktree: "gitdir: <path>"
            git = (base / git.read_text().partition(":")[2].strip()).resolve()
        head = (git / "HEAD").read_text().strip()
        if head.startswith("ref:"):
            return _read_ref(git, head[4:].strip())
        return head or None
    except OSError:
        return None


async def version(request: Request) -> Response:
    """``GET /version`` (docs/api.md §15)."""
    return JSONResponse({"version": __version__, "git_sha": git_sha(), "api": API})


async def _model_from_body(request: Request) -> tuple[str, bytes]:
    """The raw body and the ``model`` it names (JSON or msgpack).

    Raises:
        InvalidInput: no ``model`` string in the body (400 naming ``model``).
        WireError, PayloadTooLarge, UnsupportedMediaType: as ``read_payload``.
    """
    gateway: GatewayRole = request.app.state.gateway
    msgpack = is_msgpack(request.headers.get("content-type"))
    if not msgpack:
        check_charset(request.headers.get("content-type"))
    body = await read_body(request, gateway.limits.max_body_bytes)
    if not body:
        raise WireError("request body is empty", field="body")

    def decode(raw: bytes) -> Any:
        if not msgpack:
            return decode_json(raw)
        try:
            value = unpackb(raw)
        except WireError as exc:  # named as read_payload names it
            exc.fields.setdefault("field", "body")
            raise
        check_depth(value, DEFAULT_MAX_DEPTH)
        return value

    payload = await decode_off_loop(decode, body)
    model = payload.get("model") if isinstance(payload, dict) else None
    if not isinstance(model, str) or not model:
        raise InvalidInput(
            "model: required (a string) when the path names no model; send "
            '{"model": ...} in the body or use the /{model} path (docs/api.md §15)',
            field="model",
        )
    return model, body


def _with_body_model(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` (a ``/v1/{function}/{model}`` route) for ``/v1/{function}`` with the
    model in the body: the body is read once, then replayed to ``handler`` as if the
    model were in the path (the body is decoded twice)."""

    async def route(request: Request) -> Response:
        model, body = await _model_from_body(request)
        replayed = False

        async def receive() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await request.receive()  # the disconnect, when it comes

        scope = {**request.scope, "path_params": {**request.path_params, "model": model}}
        return await handler(Request(scope, receive))

    route.__doc__ = f"{handler.__doc__} (model in the body)"
    return route


def dropin_routes() -> list[Route]:
    """The drop-in routes (docs/api.md §15), for ``build_gateway_app``."""
    return [
        Route("/v1/rerank", rerank_v1, methods=["POST"]),
        Route("/v2/rerank", rerank_v2, methods=["POST"]),
        Route("/embed", tei_embed, methods=["POST"]),
        Route("/embed_sparse", tei_embed_sparse, methods=["POST"]),
        Route("/rerank", tei_rerank, methods=["POST"]),
        Route("/info", tei_info, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/v1/encode", _with_body_model(encode), methods=["POST"]),
        Route("/v1/score", _with_body_model(score), methods=["POST"]),
        Route("/v1/extract", _with_body_model(extract), methods=["POST"]),
    ]


def dropin_refusal(path: str, err: SieError) -> Response | None:
    """A refusal made before a route runs (auth, body limits), in the envelope of the
    server ``path`` imitates; None for other paths."""
    if path in TEI_PATHS:
        return tei_error(err)
    if path in COHERE_PATHS:
        return cohere_error(err)
    return None
