"""OpenAI-compatible generation routes (architecture §2; admission-gate.md).

    POST /v1/chat/completions   {model, messages, ...}  -> chat.completion(.chunk)
    POST /v1/completions        {model, prompt, ...}    -> text_completion
    POST /v1/generate/{model}   {prompt | messages, ...} -> SIE-native {model, text, ...}

The gateway reads only the top-level ``model`` and ``stream`` with a streaming JSON
scan (ijson: no ``messages`` tree is built) after capping the body at
``max_generate_body_bytes`` (413 before any parsing); the worker parses the rest. Errors use
the OpenAI envelope ``{"error": {message, type, param, code}}``.

Every OpenAI parameter is honoured or refused with a 400 naming it (docs/api.md §5.1:
the worker parses the body strictly, ``sie.engines.openai_params``, and refuses what its
engine cannot do before accepting, so a refusal is a plain 400, never a broken stream).
The response shapes, log probabilities included, are ``sie.http.generation_format``'s.
``user`` / ``safety_identifier`` are recorded as the request span's ``enduser.id``.

``stream: true`` answers ``text/event-stream``: ``data: {json}`` per delta (the first
carries the role), a last chunk with ``finish_reason``, a usage chunk when
``stream_options.include_usage``, then ``data: [DONE]``. A failure after the stream
started is an ``error`` event before the stream closes, never a silent stop. A request
the admission gate parks gets 200 and its event stream at once, with a ``: keep-alive``
comment every ``keepalive_s`` while it waits. A client that disconnects, from either
kind of request, aborts the generation in the engine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import ijson
from opentelemetry import trace
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from sie.core.errors import GatewayTimeout, InvalidInput, SieError, UnsupportedMediaType
from sie.core.nesting import DEFAULT_MAX_DEPTH, too_deep
from sie.http.disconnect import CLIENT_CLOSED_REQUEST
from sie.http.errors import openai_error
from sie.http.generation_format import GenerationFormat
from sie.http.negotiation import check_charset, decode_off_loop, is_msgpack, read_body
from sie.roles.gateway import GatewayRole
from sie.roles.gateway.generation import chunk_error

__all__ = ["RoutingFields", "chat_completions", "completions", "generate", "scan_routing_fields"]


#: Bytes the token walk feeds its C parser at once: long strings cost the square of
#: the chunk count, and one chunk of brackets is at most this many events in memory.
SCAN_CHUNK_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class RoutingFields:
    """What the gateway reads of a generation body: ``model``, ``stream``,
    ``stream_options.include_usage`` / ``include_obfuscation`` and the end-user id
    (``user``, else ``safety_identifier``)."""

    model: str | None = None
    stream: bool = False
    include_usage: bool = False
    include_obfuscation: bool = False
    user: str | None = None


def scan_routing_fields(body: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> RoutingFields:
    """The ``RoutingFields`` of the top level of a JSON body, by a streaming token walk
    (nested values are skipped, never built; the worker validates every field).

    Linear in the body and bounded in memory: the walk keeps only its depth and the
    current top-level key, and stops at ``max_depth`` (docs/security.md "Limits").

    Raises:
        InvalidInput: malformed JSON, not an object, nested deeper than ``max_depth``
            (field ``body``), a lone surrogate or invalid UTF-8 (field: the top-level
            key it lies under), or ``model`` / ``stream`` of the wrong type.
    """
    model: str | None = None
    stream = include_usage = include_obfuscation = False
    users: dict[str, str] = {}
    depth = 0
    key: str | None = None  # the top-level key whose value is being read
    sub: str | None = None  # the key inside stream_options
    try:
        for event, value in ijson.basic_parse(body, buf_size=SCAN_CHUNK_BYTES):
            if event in ("start_map", "start_array"):
                if depth == 0 and event == "start_array":
                    raise InvalidInput("body: expected a JSON object", field="body")
                depth += 1
                if depth > max_depth:
                    raise too_deep(max_depth)
                continue
            if event in ("end_map", "end_array"):
                depth -= 1
                continue
            if event == "map_key":
                if depth == 1:
                    key = value
                elif depth == 2 and key == "stream_options":
                    sub = value
                continue
            if depth == 0:
                raise InvalidInput("body: expected a JSON object", field="body")
            if depth == 1 and key == "model":
                if event != "string":
                    raise InvalidInput("model: expected a string", field="model")
                model = value
            elif depth == 1 and key == "stream":
                if event != "boolean":
                    raise InvalidInput("stream: expected true or false", field="stream")
                stream = value
            elif depth == 2 and key == "stream_options" and sub == "include_usage":
                include_usage = event == "boolean" and value
            elif depth == 2 and key == "stream_options" and sub == "include_obfuscation":
                include_obfuscation = event == "boolean" and value
            elif depth == 1 and key in ("user", "safety_identifier") and event == "string":
                users[key] = value
    except ijson.JSONError as exc:  # its first line says what; later ones quote the body
        raw = exc.args[0] if exc.args else ""
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        reason = text.strip().split("\n", 1)[0][:100]
        raise InvalidInput(f"malformed JSON body: {reason}", field="body") from exc
    except UnicodeError as exc:  # e.g. "\udc00": JSON escapes can name a lone surrogate
        where = key if depth and key else "body"
        raise InvalidInput(
            f"{where}: not valid Unicode (a lone surrogate or invalid UTF-8)", field=where
        ) from exc
    user = users.get("user") or users.get("safety_identifier")
    return RoutingFields(model, stream, include_usage, include_obfuscation, user)


def _sse(data: Any) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


class GenerationResponse:
    """An ASGI response that runs the generation, answers JSON or an event stream,
    and aborts the generation when the client disconnects."""

    def __init__(
        self,
        gateway: GatewayRole,
        route: str,
        model: str,
        body: bytes,
        *,
        stream: bool,
        include_usage: bool,
        request_id: str,
        include_obfuscation: bool = False,
        pool: str | None,
        machine_profile: str | None,
    ) -> None:
        self.gateway = gateway
        self.route = route
        self.model = model
        self.body = body
        self.stream = stream
        self.include_usage = include_usage
        self.request_id = request_id
        self.pool = pool
        self.machine_profile = machine_profile
        self.fmt = GenerationFormat(
            route,
            model,
            request_id,
            include_usage=stream and include_usage,
            obfuscate=stream and include_obfuscation,
        )
        self.worker_id: str | None = None
        self.trace_headers: dict[str, str] = {}
        self.t0 = time.monotonic()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = str(CLIENT_CLOSED_REQUEST)  # until something else is known
        try:
            status = await self._respond(scope, receive, send)
        finally:
            record_request(self.gateway, self.route, self.model, status, self.t0)

    async def _respond(self, scope: Scope, receive: Receive, send: Send) -> str:
        """Answer; returns the status for the request metrics."""
        started = False
        headers_sent = False
        status = str(CLIENT_CLOSED_REQUEST)

        async def start(status: int, content_type: bytes, extra: list[Any] | None = None) -> None:
            nonlocal headers_sent
            headers = [(b"content-type", content_type), *(extra or [])]
            if content_type.startswith(b"text/event-stream"):
                headers += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            headers_sent = True

        async def write(data: bytes) -> None:
            nonlocal started
            if not headers_sent:
                await start(200, b"text/event-stream; charset=utf-8", self._worker_header())
            started = True
            await send({"type": "http.response.body", "body": data, "more_body": True})

        async def keepalive() -> None:
            await write(b": keep-alive\n\n")

        def parked() -> None:
            tg.start_soon(_ensure_stream_started)

        async def _ensure_stream_started() -> None:
            if self.stream and not headers_sent:
                await start(200, b"text/event-stream; charset=utf-8")

        async def watch_disconnect() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    tg.cancel_scope.cancel()  # leaving open() publishes work_cancel
                    return

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_disconnect)
            try:
                body = await self._run(write, keepalive if self.stream else None, parked)
                if body is not None:
                    length = (b"content-length", str(len(body)).encode())
                    await start(200, b"application/json", [length, *self._worker_header()])
                    await send({"type": "http.response.body", "body": body, "more_body": False})
                    tg.cancel_scope.cancel()
                    return "200"
                status = "200"
            except SieError as exc:
                status = str(exc.status)
                if headers_sent:  # a stream never just stops: an error event, then close
                    err = {"error": _openai_error_body(exc)}
                    await send(
                        {
                            "type": "http.response.body",
                            "body": f"event: error\n{_sse(err).decode()}".encode(),
                            "more_body": True,
                        }
                    )
                else:
                    resp = openai_error(exc)
                    await resp(scope, receive, send)
                    tg.cancel_scope.cancel()
                    return status
            if headers_sent:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            tg.cancel_scope.cancel()
        return status

    def _worker_header(self) -> list[tuple[bytes, bytes]]:
        return [(b"x-sie-worker", self.worker_id.encode())] if self.worker_id else []

    async def _run(
        self,
        write: Callable[[bytes], Any],
        keepalive: Callable[[], Any] | None,
        on_park: Callable[[], None],
    ) -> bytes | None:
        """Run the generation: stream events through ``write``, or return the JSON body.

        Raises:
            SieError: the request's failure (before or after the stream started).
        """
        gw = self.gateway
        async with gw.generation.open(
            self.model,
            self.route,
            self.body,
            pool=self.pool,
            machine_profile=self.machine_profile,
            request_id=self.request_id,
            on_keepalive=keepalive,
            on_park=on_park,
            trace_headers=self.trace_headers,
        ) as gen:
            self.worker_id = gen.worker_id
            parts: list[str] = []
            logprobs: list[Any] | None = None  # log-probability entries, when asked for
            finish: str | None = None
            prompt = completion = 0
            if self.stream:
                await write(_sse(self.fmt.delta(None, None, first=True)))
            entries = gw.registry.snapshot.entries
            model = self.model if self.model in entries else "_unknown"  # bounded labels
            last: float | None = None  # when the last text arrived
            try:
                with anyio.fail_after(None if self.stream else gw.settings.request_timeout_s):
                    async for chunk in gen.chunks:
                        if chunk.error_code is not None:
                            raise chunk_error(chunk)
                        lps = chunk.logprobs if isinstance(chunk.logprobs, list) else None
                        if chunk.text:
                            now = time.monotonic()
                            if last is None:
                                gw.metrics.generation_ttft.labels(model).observe(now - self.t0)
                            else:
                                gw.metrics.generation_itl.labels(model).observe(now - last)
                            last = now
                        if self.stream and (chunk.text or lps):
                            await write(_sse(self.fmt.delta(chunk.text, None, entries=lps)))
                        elif not self.stream:
                            parts.append(chunk.text)
                            if lps is not None:
                                logprobs = [] if logprobs is None else logprobs
                                logprobs.extend(lps)
                        if chunk.done:
                            finish = chunk.finish_reason
                            prompt = chunk.prompt_tokens or 0
                            completion = chunk.completion_tokens or 0
                            gw.metrics.generation_prompt_tokens.labels(model).inc(prompt)
                            gw.metrics.generation_tokens.labels(model).inc(completion)
            except TimeoutError:
                raise GatewayTimeout(
                    f"generation did not finish within {gw.settings.request_timeout_s:g}s; "
                    "use stream: true for long outputs",
                    request_id=self.request_id,
                ) from None
        if not self.stream:
            whole = self.fmt.whole("".join(parts), finish, prompt, completion, logprobs)
            return json.dumps(whole, ensure_ascii=False, separators=(",", ":")).encode()
        await write(_sse(self.fmt.delta(None, finish)))
        if self.include_usage:
            await write(_sse(self.fmt.usage_chunk(prompt, completion)))
        await write(b"data: [DONE]\n\n")
        return None


def _openai_error_body(exc: SieError) -> dict[str, Any]:
    return {
        "message": exc.message,
        "type": "invalid_request_error" if exc.status < 500 else "server_error",
        "param": exc.fields.get("field"),
        "code": exc.code.lower(),
    }


#: The ``endpoint`` label of each generation route in the request metrics.
ENDPOINTS = {"chat": "chat_completions", "completions": "completions", "native": "generate"}


def record_request(gateway: GatewayRole, route: str, model: str, status: str, t0: float) -> None:
    """Count one generation request in ``sie_requests_total`` and
    ``sie_request_duration_seconds`` (a model the registry does not know is ``_unknown``)."""
    known = model if model in gateway.registry.snapshot.entries else "_unknown"
    endpoint = ENDPOINTS[route]
    gateway.metrics.requests.labels(endpoint, known, status).inc()
    gateway.metrics.request_duration.labels(endpoint, known).observe(time.monotonic() - t0)


async def _handle(request: Request, route: str, path_model: str | None = None) -> Any:
    gateway: GatewayRole = request.app.state.gateway
    started = time.monotonic()
    try:
        content_type = request.headers.get("content-type")
        if is_msgpack(content_type):  # 415 before reading: these routes read JSON
            raise UnsupportedMediaType(
                "generation routes read JSON bodies: send Content-Type: application/json",
                field="Content-Type",
            )
        check_charset(content_type)  # 415 before reading
        body = await read_body(request, gateway.limits.max_generate_body_bytes)  # 413 first
        fields = await decode_off_loop(scan_routing_fields, body)
        model = fields.model if path_model is None else path_model
        if fields.user:  # OpenAI's end-user id: recorded on the request's span
            trace.get_current_span().set_attribute("enduser.id", fields.user[:256])
        request.state.model, request.state.items = model, 1  # the access line
        if not model:
            raise InvalidInput("model: required", field="model")
    except SieError as exc:  # the OpenAI envelope on these routes (architecture §2)
        record_request(gateway, route, "", str(exc.status), started)
        return openai_error(exc)
    response = GenerationResponse(
        gateway,
        route,
        model,
        body,
        stream=fields.stream,
        include_usage=fields.include_usage,
        include_obfuscation=fields.include_obfuscation,
        request_id=request.state.request_id,
        pool=request.headers.get("x-sie-pool"),
        machine_profile=request.headers.get("x-sie-machine-profile"),
    )
    response.trace_headers = {
        k: v for k in ("traceparent", "tracestate") if (v := request.headers.get(k))
    }
    return response


async def chat_completions(request: Request) -> Any:
    """``POST /v1/chat/completions`` (OpenAI)."""
    return await _handle(request, "chat")


async def completions(request: Request) -> Any:
    """``POST /v1/completions`` (OpenAI)."""
    return await _handle(request, "completions")


async def generate(request: Request) -> Any:
    """``POST /v1/generate/{model}`` (SIE-native; OpenAI error envelope)."""
    return await _handle(request, "native", request.path_params["model"])
