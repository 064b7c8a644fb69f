"""Generation on a worker (architecture §2 OpenAI surfaces, §8.2 worker-direct
dispatch, §15.1): parse the request body the gateway forwarded untouched, run it on
the model's generation engine, and stream ``GenerationChunk``s to the request's inbox.

The gateway reads only ``model`` (and ``stream``) from the body; everything else is
parsed and validated here, so a bad field is reported as the first chunk: ``seq`` 0
is either the acceptance (empty text) or the error (``done`` with ``error_code`` and
the field). Then one chunk per engine delta, in order, the last with ``done``,
``finish_reason`` and the token counts; an engine failure mid-stream ends the stream
with an error chunk, never silently.

Routes (``WorkItem.item["route"]``): ``chat`` (``/v1/chat/completions``: ``messages``),
``completions`` (``/v1/completions``: ``prompt``) and ``native``
(``/v1/generate/{model}``: ``prompt`` or ``messages``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from sie.core.errors import InvalidInput, SieError
from sie.core.validation import Text, validate
from sie.core.wire import GenerationChunk, WorkItem
from sie.engines.base import Engine
from sie.engines.generation import (
    GenerationRequest,
    SamplingParams,
    is_generator,
    validate_request,
)

__all__ = ["parse_generation", "run_generation"]

Number = Annotated[float, Field(allow_inf_nan=False)]


class _Part(BaseModel):
    """A content part (OpenAI); only text parts can be read by a text model."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: Text


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Text | list[_Part]

    def flat(self) -> dict[str, str]:
        """``{"role", "content"}`` with text parts joined (as OpenAI-compatible servers do)."""
        if isinstance(self.content, str):
            return {"role": self.role, "content": self.content}
        return {"role": self.role, "content": "\n".join(p.text for p in self.content)}


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: StrictBool = False


class _Body(BaseModel):
    """What every generation route accepts (OpenAI semantics). Unknown fields are
    ignored, as by OpenAI-compatible servers."""

    model_config = ConfigDict(extra="ignore")

    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    temperature: Annotated[Number, Field(le=2.0)] = 1.0  # OpenAI's range is 0..2
    top_p: Number = 1.0
    seed: StrictInt | None = None
    stop: Text | Annotated[list[Text], Field(max_length=4)] | None = None  # OpenAI: up to 4
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: _StreamOptions | None = None


class _Chat(_Body):
    messages: list[_Message] = Field(min_length=1)


class _Completion(_Body):
    prompt: Text | list[Text]


class _Native(_Body):
    prompt: Text | None = None
    messages: list[_Message] | None = None


_SCHEMAS: dict[str, type[_Body]] = {"chat": _Chat, "completions": _Completion, "native": _Native}


def parse_generation(route: str, body: bytes, request_id: str) -> GenerationRequest:
    """The ``GenerationRequest`` a route's JSON body asks for.

    Raises:
        InvalidInput: malformed JSON, a bad field (named: ``messages[0].content``,
            ``max_tokens``, ``n``, ...), ``n`` other than 1, or ``max_tokens`` 0.
    """
    schema = _SCHEMAS.get(route)
    if schema is None:
        raise InvalidInput(f"unknown generation route {route!r}", field="route")
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidInput(f"malformed JSON body: {exc}", field="body") from exc
    req = validate(schema, payload)
    if req.n != 1:
        raise InvalidInput(f"n: only n=1 is supported, got {req.n}", field="n")
    max_tokens = req.max_completion_tokens if req.max_tokens is None else req.max_tokens
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    if isinstance(req, _Chat):
        messages = [m.flat() for m in req.messages]
    elif isinstance(req, _Completion):
        if isinstance(req.prompt, list):
            if len(req.prompt) != 1:
                raise InvalidInput("prompt: exactly one prompt per request (n=1)", field="prompt")
            prompt = req.prompt[0]
        else:
            prompt = req.prompt
    else:
        assert isinstance(req, _Native)
        prompt = req.prompt
        messages = [m.flat() for m in req.messages] if req.messages is not None else None
    out = GenerationRequest(
        request_id=request_id,
        prompt=prompt,
        messages=messages,
        sampling=SamplingParams(
            max_tokens=max_tokens,
            temperature=float(req.temperature),
            top_p=float(req.top_p),
            seed=req.seed,
            stop=stop,
        ),
    )
    validate_request(out)
    return out


async def run_generation(
    engine: Engine,
    item: WorkItem,
    publish: Callable[[GenerationChunk], Awaitable[None]],
    worker_id: str,
) -> None:
    """Parse ``item``, run it on ``engine`` and publish its chunks (see module doc).

    Cancellation (``work_cancel``, a dead gateway) closes the engine's iterator,
    which aborts the request and frees its slot.
    """
    rid = item.request_id

    def fail(seq: int, exc: SieError) -> GenerationChunk:
        field = exc.fields.get("field")
        return GenerationChunk(
            request_id=rid,
            seq=seq,
            done=True,
            error=exc.message,
            error_code=exc.code,
            error_field=field if isinstance(field, str) else None,
            worker_id=worker_id,
        )

    data = item.item if isinstance(item.item, dict) else {}
    body, route = data.get("body"), data.get("route")
    try:
        if not isinstance(body, bytes) or not isinstance(route, str):
            raise InvalidInput("generation work item without a body", field="body")
        if not is_generator(engine):
            raise InvalidInput(f"model {item.model_id!r} does not generate text", field="model")
        req = parse_generation(route, body, rid)
        # e.g. a prompt over the window: a 400 before acceptance, not a broken stream
        await anyio.to_thread.run_sync(engine.check_request, req)
    except SieError as exc:
        await publish(fail(0, exc))
        return
    await publish(GenerationChunk(request_id=rid, seq=0, worker_id=worker_id))
    seq = 0
    try:
        async for delta in engine.generate(req):
            seq += 1
            await publish(
                GenerationChunk(
                    request_id=rid,
                    seq=seq,
                    text=delta.text,
                    done=delta.finish_reason is not None,
                    finish_reason=delta.finish_reason,
                    prompt_tokens=delta.prompt_tokens,
                    completion_tokens=delta.completion_tokens,
                    worker_id=worker_id,
                )
            )
    except SieError as exc:
        await publish(fail(seq + 1, exc))
    except Exception as exc:  # an engine bug must end the stream with an error, not hang it
        await publish(fail(seq + 1, SieError(f"generation failed: {exc}")))
