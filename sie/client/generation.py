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


class _Builds:
    _b: CallBuilder

    def _gen_call(
        self,
        route: str,
        model: str,
        fields: Mapping[str, Any],
        stream: bool,
        include_usage: bool,
        sampling: dict[str, Any],
        gpu: str | None,
        wait_for_capacity: bool,
        provision_timeout_s: float | None,
        params: Mapping[str, Any],
    ) -> Call:
        body = generation_body(
            fields, stream=stream, include_usage=include_usage, params=params, **sampling
        )
        return self._b.generation_call(
            route,
            model,
            body,
            gpu=gpu,
            wait_for_capacity=wait_for_capacity,
            provision_timeout_s=provision_timeout_s,
        )


class GenerationMixin(_Builds):
    """``SIEClient``'s generation methods (it provides ``_run`` and ``_stream``)."""

    _run: Callable[[Call], Any]  # provided by the client
    _stream: Callable[[Call], Any]

    def _go(self, call: Call, stream: bool) -> Any:
        return self._stream(call) if stream else self._run(call)

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
        sampling = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed,
            "stop": stop,
        }
        call = self._gen_call(
            "chat",
            model,
            {"messages": list(messages)},
            stream,
            include_usage,
            sampling,
            gpu,
            wait_for_capacity,
            provision_timeout_s,
            params,
        )
        return self._go(call, stream)

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
        sampling = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed,
            "stop": stop,
        }
        call = self._gen_call(
            "completions",
            model,
            {"prompt": prompt},
            stream,
            include_usage,
            sampling,
            gpu,
            wait_for_capacity,
            provision_timeout_s,
            params,
        )
        return self._go(call, stream)

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
        sampling = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed,
            "stop": stop,
        }
        fields = {"prompt": prompt, "messages": list(messages) if messages is not None else None}
        call = self._gen_call(
            "native",
            model,
            fields,
            stream,
            include_usage,
            sampling,
            gpu,
            wait_for_capacity,
            provision_timeout_s,
            params,
        )
        return self._go(call, stream)


class AsyncGenerationMixin(_Builds):
    """``SIEAsyncClient``'s generation methods: as ``GenerationMixin``, awaited;
    ``stream=True`` gives an async iterator."""

    _run: Callable[[Call], Awaitable[Any]]  # provided by the client
    _stream: Callable[[Call], Any]

    async def _go(self, call: Call, stream: bool) -> Any:
        return self._stream(call) if stream else await self._run(call)

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
        sampling = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed,
            "stop": stop,
        }
        call = self._gen_call(
            "chat",
            model,
            {"messages": list(messages)},
            stream,
            include_usage,
            sampling,
            gpu,
            wait_for_capacity,
            provision_timeout_s,
            params,
        )
        return await self._go(call, stream)

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
        sampling = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed,
            "stop": stop,
        }
        call = self._gen_call(
            "completions",
            model,
            {"prompt": prompt},
            stream,
            include_usage,
            sampling,
            gpu,
            wait_for_capacity,
            provision_timeout_s,
            params,
        )
        return await self._go(call, stream)

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
        sampling = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed,
            "stop": stop,
        }
        fields = {"prompt": prompt, "messages": list(messages) if messages is not None else None}
        call = self._gen_call(
            "native",
            model,
            fields,
            stream,
            include_usage,
            sampling,
            gpu,
            wait_for_capacity,
            provision_timeout_s,
            params,
        )
        return await self._go(call, stream)
