"""Generation calls of both clients (docs/sdk.md "Generation"; docs/api.md §5):
``chat`` (``/v1/chat/completions``), ``complete`` (``/v1/completions``) and
``generate`` (``/v1/generate/{model}``), whole or streamed.

A whole answer is the route's JSON dict. ``stream=True`` returns an iterator (an
async iterator on ``SIEAsyncClient``) of the stream's chunk dicts, ending at the
server's ``[DONE]``; the request is sent when iteration starts. Retries (Retry-After,
the time budget) apply until the stream opens, never after a chunk arrived. A failure
after the stream opened raises the error of its ``error`` event.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from sie.client.calls import Call, CallBuilder

__all__ = ["AsyncGenerationMixin", "GenerationMixin", "generation_body"]


def generation_body(
    fields: Mapping[str, Any],
    *,
    stream: bool,
    include_usage: bool,
    max_tokens: int | None,
    temperature: float | None,
    top_p: float | None,
    seed: int | None,
    stop: str | Sequence[str] | None,
    params: Mapping[str, Any],
) -> dict[str, Any]:
    """The JSON body: ``fields`` (messages / prompt), the sampling fields that were
    given, ``params`` as they are, and ``stream`` / ``stream_options``."""
    body: dict[str, Any] = {
        **fields,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "seed": seed,
        "stop": list(stop) if isinstance(stop, list | tuple) else stop,
        **params,
    }
    if stream:
        body["stream"] = True
        if include_usage:
            body["stream_options"] = {"include_usage": True}
    return {k: v for k, v in body.items() if v is not None}


#: The public method → its route (``CallBuilder.generation_call``).
_ROUTES = {"chat": "chat", "complete": "completions", "generate": "native"}
_SAMPLING = ("max_tokens", "temperature", "top_p", "seed", "stop")


class _Builds:
    _b: CallBuilder

    def _gen_call(self, method: str, args: Mapping[str, Any]) -> Call:
        """The ``Call`` of ``chat`` / ``complete`` / ``generate`` from its arguments
        (the method's ``locals()``)."""
        if method == "chat":
            fields: dict[str, Any] = {"messages": list(args["messages"])}
        elif method == "complete":
            fields = {"prompt": args["prompt"]}
        else:
            messages = args["messages"]
            fields = {
                "prompt": args["prompt"],
                "messages": list(messages) if messages is not None else None,
            }
        body = generation_body(
            fields,
            stream=args["stream"],
            include_usage=args["include_usage"],
            params=args["params"],
            **{k: args[k] for k in _SAMPLING},
        )
        return self._b.generation_call(
            _ROUTES[method],
            args["model"],
            body,
            gpu=args["gpu"],
            wait_for_capacity=args["wait_for_capacity"],
            provision_timeout_s=args["provision_timeout_s"],
        )


class GenerationMixin(_Builds):
    """``SIEClient``'s generation methods (it provides ``_run`` and ``_stream``)."""

    _run: Callable[[Call], Any]  # provided by the client
    _stream: Callable[[Call], Any]

    def _go(self, method: str, args: Mapping[str, Any]) -> Any:
        call = self._gen_call(method, args)
        return self._stream(call) if args["stream"] else self._run(call)

    def chat(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        stream: bool = False,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        include_usage: bool = False,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        **params: Any,
    ) -> Any:
        """``POST /v1/chat/completions``: the ``chat.completion`` dict, or streamed
        ``chat.completion.chunk`` dicts. ``params``: other OpenAI fields, sent as
        given (the server refuses what it does not honour, naming it).

        Raises:
            RequestError (400 naming the field, 404 unknown model),
            ModelLoadFailedError, ProvisioningError, ServerError, SIEConnectionError.
        """
        return self._go("chat", locals())

    def complete(
        self,
        model: str,
        prompt: str,
        *,
        stream: bool = False,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        include_usage: bool = False,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        **params: Any,
    ) -> Any:
        """``POST /v1/completions``: the ``text_completion`` dict or its stream. As
        ``chat``."""
        return self._go("complete", locals())

    def generate(
        self,
        model: str,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        stream: bool = False,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        include_usage: bool = False,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        **params: Any,
    ) -> Any:
        """``POST /v1/generate/{model}`` (SIE-native; ``prompt`` or ``messages``):
        ``{"model", "text", "finish_reason", "usage"}``, or streamed ``{"model",
        "text", "finish_reason"}`` deltas. As ``chat``."""
        return self._go("generate", locals())


class AsyncGenerationMixin(_Builds):
    """``SIEAsyncClient``'s generation methods: as ``GenerationMixin``, awaited;
    ``stream=True`` gives an async iterator."""

    _run: Callable[[Call], Awaitable[Any]]  # provided by the client
    _stream: Callable[[Call], Any]

    async def _go(self, method: str, args: Mapping[str, Any]) -> Any:
        call = self._gen_call(method, args)
        return self._stream(call) if args["stream"] else await self._run(call)

    async def chat(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        stream: bool = False,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        include_usage: bool = False,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        **params: Any,
    ) -> Any:
        """As ``SIEClient.chat``."""
        return await self._go("chat", locals())

    async def complete(
        self,
        model: str,
        prompt: str,
        *,
        stream: bool = False,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        include_usage: bool = False,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        **params: Any,
    ) -> Any:
        """As ``SIEClient.complete``."""
        return await self._go("complete", locals())

    async def generate(
        self,
        model: str,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        stream: bool = False,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        include_usage: bool = False,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        **params: Any,
    ) -> Any:
        """As ``SIEClient.generate``."""
        return await self._go("generate", locals())
