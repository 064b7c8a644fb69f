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
from sie.client.errors import (
    ProvisioningError,
    SIEConnectionError,
    SIEError,
    error_from_response,
)
from sie.client.generation import AsyncGenerationMixin
from sie.client.pools import AsyncPoolsMixin
from sie.client.sse import DONE, SSEReader
from sie.client.types import (
    CapacityInfo,
    EncodeResult,
    ExtractResult,
    ModelInfo,
    ScoreResult,
)
from sie.client.wire import check_version_skew
from sie.client.ws import aiter_messages

__all__ = ["SIEAsyncClient"]

log = logging.getLogger("sie.client")

#: Connections kept per client (and per host) unless ``max_connections`` says otherwise.
DEFAULT_MAX_CONNECTIONS = 100


def _settings() -> Any:
    from sie.settings import client_settings

    return client_settings()


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
        env = _settings()
        self._b = CallBuilder(
            base_url or env.gateway_url,
            timeout_s=timeout_s,
            api_key=api_key if api_key is not None else env.inference_token(),
            gpu=gpu,
            options=options,
            pool=pool,
            config_url=config_url or env.config_service_url,
            admin_key=admin_key if admin_key is not None else env.admin_token_value(),
        )
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

    # -- transport -----------------------------------------------------------------------
    async def _send(self, call: Call) -> httpx.Response:
        policy = call.policy
        while True:
            timeout = policy.attempt_timeout() if policy else self._b.timeout_s
            try:
                resp = await self._http.request(
                    call.method,
                    call.url,
                    content=call.content,
                    headers=call.headers,
                    timeout=timeout,
                )
            except httpx.TransportError as exc:
                if policy is None:
                    raise SIEConnectionError(f"{call.method} {call.url}: {exc!r}") from exc
                await anyio.sleep(policy.after_transport_error(exc))
                continue
            status = resp.status_code
            if status in call.ok or (status < 400 and not (status == 202 and policy)):
                check_version_skew(resp.headers)
                return resp
            try:
                if policy is None:
                    raise error_from_response(status, resp.headers, resp.content)
                delay = policy.after_response(status, resp.headers, resp.content)
            except SIEError as err:
                raise (call.on_error(err) if call.on_error else err) from None
            await anyio.sleep(delay)

    async def _run(self, call: Call) -> Any:
        if self._slots is None:
            resp = await self._send(call)
        else:
            async with self._slots:
                resp = await self._send(call)
        try:
            return call.parse(resp)
        except (ValueError, KeyError, TypeError) as exc:
            raise SIEError(f"{call.method} {call.url}: unexpected answer: {exc}") from exc

    async def _stream(self, call: Call) -> AsyncIterator[dict[str, Any]]:
        policy = call.policy
        assert policy is not None
        while True:
            timeout = policy.attempt_timeout()
            request = self._http.build_request(
                call.method, call.url, content=call.content, headers=call.headers, timeout=timeout
            )
            try:
                resp = await self._http.send(request, stream=True)
            except httpx.TransportError as exc:
                await anyio.sleep(policy.after_transport_error(exc))
                continue
            if resp.status_code >= 400:
                body = await resp.aread()
                await resp.aclose()
                await anyio.sleep(policy.after_response(resp.status_code, resp.headers, body))
                continue
            break
        check_version_skew(resp.headers)
        try:
            if "text/event-stream" not in resp.headers.get("content-type", ""):
                await resp.aread()
                yield resp.json()
                return
            reader = SSEReader()
            async for line in resp.aiter_lines():
                got = reader.feed(line)
                if got is DONE:
                    return
                if got is not None:
                    yield got
            last = reader.close()
            if last is not None and last is not DONE:
                yield last
        except httpx.TransportError as exc:
            raise SIEConnectionError(f"stream broke: {exc!r}") from exc
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
        await self._ensure_lazy_pool()
        return await self._run(  # type: ignore[no-any-return]
            self._b.encode_call(
                model,
                items,
                output_types=output_types,
                instruction=instruction,
                output_dtype=output_dtype,
                is_query=is_query,
                options=options,
                gpu=gpu,
                wait_for_capacity=wait_for_capacity,
                provision_timeout_s=provision_timeout_s,
                max_oom_retries=max_oom_retries,
            )
        )

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
        await self._ensure_lazy_pool()
        return await self._run(  # type: ignore[no-any-return]
            self._b.score_call(
                model,
                query,
                items,
                instruction=instruction,
                options=options,
                gpu=gpu,
                wait_for_capacity=wait_for_capacity,
                provision_timeout_s=provision_timeout_s,
                max_oom_retries=max_oom_retries,
                top_k=top_k,
            )
        )

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
        await self._ensure_lazy_pool()
        return await self._run(  # type: ignore[no-any-return]
            self._b.extract_call(
                model,
                items,
                labels=labels,
                output_schema=output_schema,
                instruction=instruction,
                options=options,
                gpu=gpu,
                wait_for_capacity=wait_for_capacity,
                provision_timeout_s=provision_timeout_s,
                max_oom_retries=max_oom_retries,
            )
        )

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
