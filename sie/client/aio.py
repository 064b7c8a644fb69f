"""``SIEAsyncClient``: the SDK on ``httpx.AsyncClient`` (docs/sdk.md). Every method is
the ``SIEClient`` one, awaited; streams and ``watch`` are async iterators.

    async with SIEAsyncClient("http://localhost:8080", max_concurrency=8) as c:
        results = await c.encode(MODEL, [{"text": t} for t in texts])
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import warnings
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import anyio
import httpx

from sie.client.calls import DEFAULT_TIMEOUT_S, Call, CallBuilder
from sie.client.errors import ProvisioningError
from sie.client.exchange import (
    broken_stream,
    builder_args,
    forward,
    is_event_stream,
    parse_answer,
    request_for,
    retry_delay,
    settled,
    transport_delay,
)
from sie.client.generation import AsyncGenerationMixin
from sie.client.pools import AsyncPoolsMixin
from sie.client.sse import SSEReader
from sie.client.types import (
    CapacityInfo,
    EncodeResult,
    ExtractResult,
    ModelInfo,
    ScoreResult,
)
from sie.client.ws import aiter_messages

__all__ = ["SIEAsyncClient"]

log = logging.getLogger("sie.client")

#: Connections kept per client (and per host) unless ``max_connections`` says otherwise.
DEFAULT_MAX_CONNECTIONS = 100


class SIEAsyncClient(AsyncGenerationMixin, AsyncPoolsMixin):
    """Async client of an SIE gateway. Arguments as ``SIEClient``, plus
    ``max_connections`` (connection pool size, default 100) and ``max_concurrency``
    (calls in flight at once; default unbounded). Use ``async with`` or ``await
    close()``: an unclosed client warns (``ResourceWarning``)."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        api_key: str | None = None,
        gpu: str | None = None,
        options: Mapping[str, Any] | None = None,
        pool: Mapping[str, Any] | None = None,
        max_connections: int | None = None,
        max_concurrency: int | None = None,
        config_url: str | None = None,
        admin_key: str | None = None,
    ) -> None:
        self._b = CallBuilder(**builder_args(locals()))
        conns = max_connections or DEFAULT_MAX_CONNECTIONS
        self._http = httpx.AsyncClient(
            base_url=self._b.base_url,
            timeout=timeout_s,
            headers=self._b.default_headers,
            limits=httpx.Limits(max_connections=conns, keepalive_expiry=90.0),
        )
        self._slots = anyio.Semaphore(max_concurrency) if max_concurrency else None
        self._pool_renewers: dict[str, asyncio.Task[None]] = {}
        self._lazy_created = False
        self._closed = False

    @property
    def base_url(self) -> str:
        return self._b.base_url

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            warnings.warn(
                "SIEAsyncClient was not closed: use `async with` or `await client.close()`",
                ResourceWarning,
                stacklevel=2,
            )

    # -- transport (the decisions: sie.client.exchange) ----------------------------------
    async def _open(self, call: Call, *, stream: bool = False) -> httpx.Response:
        while True:
            request = request_for(self._http, call, self._b.timeout_s)
            try:
                resp = await self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                await anyio.sleep(transport_delay(call, exc))
                continue
            if settled(call, resp.status_code, resp.headers, stream=stream):
                return resp
            body = await resp.aread()
            await resp.aclose()
            await anyio.sleep(retry_delay(call, resp.status_code, resp.headers, body))

    async def _run(self, call: Call) -> Any:
        if self._slots is None:
            resp = await self._open(call)
        else:
            async with self._slots:
                resp = await self._open(call)
        return parse_answer(call, resp)

    async def _stream(self, call: Call) -> AsyncIterator[dict[str, Any]]:
        assert call.policy is not None
        resp = await self._open(call, stream=True)
        try:
            if not is_event_stream(resp):
                await resp.aread()
                yield resp.json()
                return
            reader = SSEReader()
            async for line in resp.aiter_lines():
                for chunk in reader.chunks(line):
                    yield chunk
                if reader.done:
                    return
            for chunk in reader.rest():
                yield chunk
        except httpx.TransportError as exc:
            raise broken_stream(exc) from exc
        finally:
            await resp.aclose()

    async def _ensure_lazy_pool(self) -> None:
        if self._b.lazy_pool and not self._lazy_created:
            await self.create_pool(**self._b.lazy_pool)
            self._lazy_created = True

    # -- encode, score, extract ----------------------------------------------------------
    async def encode(
        self,
        model: str,
        items: Any,
        *,
        output_types: Sequence[str] | None = None,
        instruction: str | None = None,
        output_dtype: str | None = None,
        is_query: bool | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        max_oom_retries: int = 3,
    ) -> EncodeResult | list[EncodeResult]:
        """As ``SIEClient.encode`` (docs/sdk.md "Calls")."""
        args = forward(locals())
        await self._ensure_lazy_pool()
        return await self._run(self._b.encode_call(**args))  # type: ignore[no-any-return]

    async def score(
        self,
        model: str,
        query: Any,
        items: Sequence[Any],
        *,
        instruction: str | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        max_oom_retries: int = 3,
        top_k: int | None = None,
    ) -> ScoreResult:
        """As ``SIEClient.score``."""
        args = forward(locals())
        await self._ensure_lazy_pool()
        return await self._run(self._b.score_call(**args))  # type: ignore[no-any-return]

    async def extract(
        self,
        model: str,
        items: Any,
        *,
        labels: Sequence[str] | None = None,
        output_schema: Mapping[str, Any] | None = None,
        instruction: str | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        max_oom_retries: int = 3,
    ) -> ExtractResult | list[ExtractResult]:
        """As ``SIEClient.extract``."""
        args = forward(locals())
        await self._ensure_lazy_pool()
        return await self._run(self._b.extract_call(**args))  # type: ignore[no-any-return]

    # -- models, capacity, watch ---------------------------------------------------------
    async def list_models(self) -> list[ModelInfo]:
        """As ``SIEClient.list_models``."""
        return await self._run(self._b.list_models_call())  # type: ignore[no-any-return]

    async def get_model(self, model: str) -> ModelInfo:
        """As ``SIEClient.get_model``."""
        return await self._run(self._b.get_model_call(model))  # type: ignore[no-any-return]

    async def get_capacity(self, *, gpu: str | None = None) -> CapacityInfo:
        """As ``SIEClient.get_capacity``."""
        return await self._run(self._b.capacity_call(gpu))  # type: ignore[no-any-return]

    async def wait_for_capacity(
        self,
        gpu: str,
        *,
        model: str | None = None,
        timeout_s: float | None = None,
        poll_interval_s: float = 5.0,
    ) -> CapacityInfo:
        """As ``SIEClient.wait_for_capacity``."""
        budget = 900.0 if timeout_s is None else timeout_s
        if model is not None:
            await self.encode(model, {"text": "warmup"}, gpu=gpu, provision_timeout_s=budget)
            return await self.get_capacity(gpu=gpu)
        deadline = time.monotonic() + budget
        while True:
            cap = await self.get_capacity(gpu=gpu)
            if cap.get("gpu_count", 0) > 0:
                return cap
            if time.monotonic() + poll_interval_s > deadline:
                raise ProvisioningError(f"no worker serves {gpu!r} after {budget:g} s", gpu=gpu)
            await anyio.sleep(poll_interval_s)

    async def watch(self, *, mode: str = "auto") -> AsyncIterator[dict[str, Any]]:
        """As ``SIEClient.watch``: an async iterator of cluster status documents."""
        if mode not in ("auto", "cluster"):
            raise ValueError("watch(mode=...) is 'auto' or 'cluster'")
        if mode == "auto":
            await self.get_capacity()
        headers = {k: v for k, v in self._http.headers.items() if k.lower() == "authorization"}
        idle = max(self._b.timeout_s, 45.0)
        async for message in aiter_messages(self._b.ws_url("/ws/cluster-status"), headers, idle):
            yield message

    # -- config --------------------------------------------------------------------------
    async def apply_config(
        self, config: Any, *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """As ``SIEClient.apply_config``."""
        return await self._run(  # type: ignore[no-any-return]
            self._b.apply_config_call(config, idempotency_key=idempotency_key)
        )

    async def config_status(self, model: str) -> dict[str, Any]:
        """As ``SIEClient.config_status``."""
        return await self._run(self._b.config_status_call(model))  # type: ignore[no-any-return]

    # -- lifecycle -----------------------------------------------------------------------
    async def close(self) -> None:
        """Cancel lease renewals and close the connections."""
        self._stop_renewers()
        self._closed = True
        with contextlib.suppress(RuntimeError):
            await self._http.aclose()

    async def __aenter__(self) -> SIEAsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
