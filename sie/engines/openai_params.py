"""The OpenAI request bodies of the generation routes, parsed strictly (docs/api.md §5.1).

Every parameter of OpenAI's documented ``/v1/chat/completions`` and ``/v1/completions``
bodies is either honoured or refused with a 400 naming it; none is accepted and
ignored. A parameter SIE does not know at all is refused the same way (``unknown
parameter``), so a client never silently gets less than it asked for. ``null`` means
"not sent" for every optional parameter, as in OpenAI's API.

- Honoured here or by every engine: ``model``, ``messages`` (text content; a message's
  ``name`` goes to the chat template, as vLLM passes it), ``prompt`` (one string),
  ``max_tokens`` / ``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``,
  ``stop``, ``n`` = 1, ``best_of`` = 1, ``stream``, ``stream_options``
  (``include_usage``, ``include_obfuscation``; only with ``stream: true``), ``echo``
  (the prompt before the completion), ``user`` / ``safety_identifier`` (recorded as
  the request span's ``enduser.id``), ``service_tier`` ``auto`` / ``default``,
  ``store: false``, ``modalities: ["text"]``, ``tool_choice`` / ``function_call``
  ``"none"``.
- Honoured by engines that implement the feature (``sie.engines.generation.FEATURES``;
  the transformers and vLLM engines do, the upstream proxy refuses them):
  ``logprobs`` / ``top_logprobs``, ``logit_bias``, ``presence_penalty`` /
  ``frequency_penalty``, ``response_format`` ``{"type": "json_object"}``.
- Refused (400 naming the parameter): any other value of the parameters in
  ``REFUSED`` (tools and functions, audio, predictions, prompt caching, reasoning,
  storage, web search, ...), ``response_format`` ``json_schema``, token-id prompts,
  ``suffix``, ``echo`` with ``logprobs``, ``top_logprobs`` without ``logprobs``.

``parse_generation(route, body, request_id)`` is what a worker runs on the body the
gateway forwarded untouched (``sie.roles.worker.generation``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    Tag,
)

from sie.core.echo import echo
from sie.core.errors import InvalidInput
from sie.core.validation import Text, validate
from sie.engines.generation import GenerationRequest, SamplingParams, validate_request

__all__ = [
    "REFUSED",
    "ChatBody",
    "CompletionBody",
    "NativeBody",
    "ParsedGeneration",
    "parse_generation",
]

#: A JSON number (an int or a float; no strings, booleans, NaN or infinities).
Number = Annotated[float, Field(allow_inf_nan=False, strict=True)]

#: Parameters SIE cannot honour, each with the values that mean "not used" (allowed)
#: and why any other value is refused (docs/api.md §5.1).
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "tools": ((), "tool calling is not supported"),
    "tool_choice": (("none",), "tool calling is not supported (only 'none')"),
    "parallel_tool_calls": ((), "tool calling is not supported"),
    "functions": ((), "function calling is not supported"),
    "function_call": (("none",), "function calling is not supported (only 'none')"),
    "audio": ((), "audio output is not supported"),
    "modalities": ((["text"],), 'only text output is supported (["text"])'),
    "prediction": ((), "predicted outputs are not supported"),
    "moderation": ((), "moderation is not supported"),
    "metadata": (({},), "SIE stores no completions to attach metadata to"),
    "store": ((False,), "SIE stores no completions (only false)"),
    "prompt_cache_key": ((), "there is no prompt cache to key"),
    "prompt_cache_options": ((), "there is no prompt cache to configure"),
    "prompt_cache_retention": ((), "there is no prompt cache to retain"),
    "reasoning_effort": (("none",), "the models served do not reason (only 'none')"),
    "verbosity": ((), "verbosity control is not supported"),
    "web_search_options": ((), "web search is not supported"),
    "service_tier": (("auto", "default"), "there is one service tier ('auto' or 'default')"),
    "suffix": ((), "inserting text before a suffix is not supported"),
}

#: Fields of a chat message SIE cannot honour when set (not null).
_REFUSED_MESSAGE_FIELDS = {
    "tool_calls": "tool calling is not supported",
    "tool_call_id": "tool calling is not supported",
    "function_call": "function calling is not supported",
    "audio": "audio is not supported",
    "refusal": "refusals cannot be sent back to the model",
    "annotations": "annotations cannot be sent back to the model",
}


class _Strict(BaseModel):
    """Unknown fields are refused (named), never ignored."""

    model_config = ConfigDict(extra="forbid")


class _Part(_Strict):
    """A content part: only text parts can be read by a text model."""

    type: Literal["text"]
    text: Text


#: A message's content: a string, or a list of parts (errors then name the part).
_Content = Annotated[
    Annotated[Text, Tag("str")] | Annotated[list[_Part], Tag("list")],
    Discriminator(lambda v: "list" if isinstance(v, list) else "str"),
]


class _Message(_Strict):
    role: Literal["system", "user", "assistant", "developer", "tool", "function"]
    content: _Content
    name: Text | None = None
    tool_calls: Any = None
    tool_call_id: Any = None
    function_call: Any = None
    audio: Any = None
    refusal: Any = None
    annotations: Any = None

    def flat(self) -> dict[str, str]:
        """``{"role", "content"(, "name")}`` with text parts joined (as OpenAI-compatible
        servers do)."""
        content = (
            self.content
            if isinstance(self.content, str)
            else "\n".join(p.text for p in self.content)
        )
        out = {"role": self.role, "content": content}
        if self.name is not None:
            out["name"] = self.name
        return out


class _StreamOptions(_Strict):
    include_usage: StrictBool | None = None
    include_obfuscation: StrictBool | None = None


class _ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Any = None


class _Body(_Strict):
    """What every generation route accepts (OpenAI semantics)."""

    max_tokens: StrictInt | None = None
    temperature: Annotated[Number, Field(ge=0.0, le=2.0)] | None = None  # OpenAI: 0..2
    top_p: Number | None = None
    seed: StrictInt | None = None
    stop: Text | Annotated[list[Text], Field(max_length=4)] | None = None  # OpenAI: up to 4
    n: StrictInt | None = None
    stream: StrictBool | None = None
    stream_options: _StreamOptions | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    logit_bias: dict[StrictStr, Any] | None = None  # checked by _logit_bias (names it)
    user: Text | None = None
    response_format: _ResponseFormat | None = None


class ChatBody(_Body):
    """``POST /v1/chat/completions``."""

    model: StrictStr  # read by the gateway
    messages: list[_Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = None
    safety_identifier: Text | None = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    moderation: Any = None
    metadata: Any = None
    store: Any = None
    prompt_cache_key: Any = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    service_tier: Any = None


class CompletionBody(_Body):
    """``POST /v1/completions``."""

    model: StrictStr  # read by the gateway
    prompt: Text | list[Text] | list[StrictInt] | list[list[StrictInt]]
    logprobs: StrictInt | None = None
    echo: StrictBool | None = None
    best_of: StrictInt | None = None
    suffix: Any = None


class NativeBody(_Body):
    """``POST /v1/generate/{model}``: ``prompt`` or ``messages`` (the path names the
    model)."""

    prompt: Text | None = None
    messages: list[_Message] | None = None
    max_completion_tokens: StrictInt | None = None


_SCHEMAS: dict[str, type[_Body]] = {
    "chat": ChatBody,
    "completions": CompletionBody,
    "native": NativeBody,
}


@dataclass(frozen=True)
class ParsedGeneration:
    """A parsed body: the engine's request, and ``echo`` (the prompt text to send before
    the completion, ``echo: true`` on ``/v1/completions``; else None)."""

    request: GenerationRequest
    echo: str | None = None


def _refuse(name: str, why: str) -> InvalidInput:
    return InvalidInput(f"{name}: {why}; see docs/api.md §5.1", field=name)


def _check_unknown(schema: type[_Body], payload: dict[str, Any], route: str) -> None:
    unknown = [k for k in payload if k not in schema.model_fields]
    if unknown:
        path = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
        # the client's key, shortened and with lone surrogates escaped: it travels
        # back in the error chunk, which must encode
        name = echo(str(unknown[0])).encode("utf-8", "backslashreplace").decode("utf-8")
        raise _refuse(
            name,
            f"unknown parameter for {path.get(route, '/v1/generate')} (SIE refuses "
            "parameters it does not implement instead of ignoring them)",
        )


def _check_refused(req: _Body) -> None:
    for name, (allowed, why) in REFUSED.items():
        value = getattr(req, name, None)
        if value is not None and not any(value == a and type(value) is type(a) for a in allowed):
            raise _refuse(name, why)
    if isinstance(req, ChatBody | NativeBody):
        for i, m in enumerate(req.messages or []):
            if m.role in ("tool", "function"):
                raise _refuse(f"messages[{i}].role", f"{m.role!r} messages need tool calling")
            for fname, why in _REFUSED_MESSAGE_FIELDS.items():
                if getattr(m, fname) is not None:
                    raise _refuse(f"messages[{i}].{fname}", why)


def _logit_bias(raw: dict[str, Any] | None) -> dict[int, float]:
    """``{"<token id>": bias}`` as ids -> floats (ids against the vocabulary: the engine).

    Raises:
        InvalidInput: naming ``logit_bias``: a key that is not a token id, a bias that is
            not a number in [-100, 100].
    """
    out: dict[int, float] = {}
    for key, bias in (raw or {}).items():
        if not (key.isascii() and key.isdigit()) or len(key) > 12:
            raise _refuse("logit_bias", f"key {key[:40]!r} is not a token id")
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise _refuse("logit_bias", f"token {key}: the bias must be a number")
        if not -100.0 <= bias <= 100.0:  # NaN fails too; an int may be too big for a float
            digits = str(bias)
            shown = (
                f"{bias:g}" if isinstance(bias, float) else digits[:16] + "..." * (len(digits) > 16)
            )
            raise _refuse("logit_bias", f"token {key}: bias {shown} is outside [-100, 100]")
        out[int(key)] = float(bias)
    return out


def _logprobs(req: _Body) -> int | None:
    """``SamplingParams.logprobs`` from the route's fields."""
    if isinstance(req, ChatBody):
        top = req.top_logprobs
        if top is not None and not req.logprobs:
            raise _refuse("top_logprobs", "needs logprobs: true")
        if top is not None and not 0 <= top <= 20:
            raise _refuse("top_logprobs", f"must be 0..20, got {top}")
        return (top or 0) if req.logprobs else None
    if isinstance(req, CompletionBody) and req.logprobs is not None:
        if not 0 <= req.logprobs <= 20:
            raise _refuse("logprobs", f"must be 0..20, got {req.logprobs}")
        return req.logprobs
    return None


def _max_tokens(req: _Body) -> int | None:
    mct = getattr(req, "max_completion_tokens", None)
    if req.max_tokens is not None and mct is not None and mct != req.max_tokens:
        raise _refuse(
            "max_completion_tokens", f"disagrees with max_tokens ({mct} vs {req.max_tokens})"
        )
    return req.max_tokens if req.max_tokens is not None else mct


def _prompt(req: CompletionBody) -> str:
    p = req.prompt
    if isinstance(p, str):
        return p
    if not p:
        raise InvalidInput("prompt: must not be empty", field="prompt")
    if not all(isinstance(x, str) for x in p):
        raise _refuse(
            "prompt", "token-id prompts are not supported (the ids of which tokenizer?); send text"
        )
    if len(p) != 1:
        raise _refuse("prompt", "exactly one prompt per request (n=1)")
    first = p[0]
    assert isinstance(first, str)
    return first


def parse_generation(route: str, body: bytes, request_id: str) -> ParsedGeneration:
    """The ``GenerationRequest`` a route's JSON body asks for (module docstring).

    Raises:
        InvalidInput: malformed JSON, an unknown or refused parameter, a bad value
            (named: ``messages[0].content``, ``logit_bias``, ``n``, ...).
    """
    schema = _SCHEMAS.get(route)
    if schema is None:
        raise InvalidInput(f"unknown generation route {route!r}", field="route")
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidInput(f"malformed JSON body: {exc}", field="body") from exc
    if not isinstance(payload, dict):
        raise InvalidInput("body: expected a JSON object", field="body")
    _check_unknown(schema, payload, route)
    req = validate(schema, payload)
    _check_refused(req)
    if req.n not in (None, 1):
        raise _refuse("n", f"only n=1 is supported, got {req.n}")
    if isinstance(req, CompletionBody) and req.best_of not in (None, 1):
        raise _refuse("best_of", f"only best_of=1 is supported, got {req.best_of}")
    if req.stream_options is not None and not req.stream:
        raise _refuse("stream_options", "only allowed with stream: true")
    rf = req.response_format.type if req.response_format is not None else "text"
    if rf == "json_schema":
        raise _refuse(
            "response_format",
            "json_schema is not supported; json_object constrains the output to a JSON object",
        )
    if req.response_format is not None and req.response_format.json_schema is not None:
        raise _refuse("response_format.json_schema", "only with type json_schema")
    logprobs = _logprobs(req)
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    echo: str | None = None
    if isinstance(req, ChatBody):
        messages = [m.flat() for m in req.messages]
    elif isinstance(req, CompletionBody):
        prompt = _prompt(req)
        if req.echo:
            if logprobs is not None:
                raise _refuse("echo", "echo with logprobs (prompt logprobs) is not supported")
            echo = prompt
    else:
        assert isinstance(req, NativeBody)
        prompt = req.prompt
        messages = [m.flat() for m in req.messages] if req.messages is not None else None
    out = GenerationRequest(
        request_id=request_id,
        prompt=prompt,
        messages=messages,
        sampling=SamplingParams(
            max_tokens=_max_tokens(req),
            temperature=1.0 if req.temperature is None else float(req.temperature),
            top_p=1.0 if req.top_p is None else float(req.top_p),
            seed=req.seed,
            stop=stop,
            presence_penalty=float(req.presence_penalty or 0.0),
            frequency_penalty=float(req.frequency_penalty or 0.0),
            logit_bias=_logit_bias(req.logit_bias),
            logprobs=logprobs,
            response_format="json_object" if rf == "json_object" else "text",
        ),
    )
    validate_request(out)
    return ParsedGeneration(out, echo)
