"""``SIEClient``: the blocking SDK client on ``httpx.Client`` (docs/sdk.md).

from sie.client import SIEClient

with SIEClient("http://localhost:8080") as c:
    vec = c.encode("sentence-transformers/all-MiniLM-L6-v2", {"text": "hi"})["dense"]
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

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
from sie.client.generation import GenerationMixin
from sie.client.pools import PoolsMixin
from sie.client.sse import SSEReader
from sie.client.types import (
    CapacityInfo,
    EncodeResult,
    ExtractResult,
    ModelInfo,
    ScoreResult,
)
from sie.client.ws import iter_messages

__all__ = ["SIEClient"]

log = logging.getLogger("sie.client")


class SIEClient(GenerationMixin, PoolsMixin):
    """Blocking client of an SIE gateway (docs/sdk.md).

    Args:
        base_url: the gateway (default: ``SIE_GATEWAY_URL``, else
            ``http://127.0.0.1:8080``).
        timeout_s: the timeout of one HTTP attempt in seconds (a call's retries are
            bounded by its ``provision_timeout_s``, default 900 s).
        api_key: bearer token (default: ``SIE_AUTH_TOKEN``, else the first of
            ``SIE_AUTH_TOKENS``).
        gpu: default routing, ``"profile"`` or ``"pool/profile"`` (docs/pools.md).
        options: default runtime options, under each call's ``options``.
        pool: deprecated: a ``PoolSpec`` created on first use and routed to.
        config_url: the config role (default: ``SIE_CONFIG_SERVICE_URL``, else the
            gateway's host on the next port).
        admin_key: token for pool and config writes (default: ``SIE_ADMIN_TOKEN``,
            else ``api_key``).
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        api_key: str | None = None,
        gpu: str | None = None,
        options: Mapping[str, Any] | None = None,
        pool: Mapping[str, Any] | None = None,
        config_url: str | None = None,
        admin_key: str | None = None,
    ) -> None:
        self._b = CallBuilder(**builder_args(locals()))
        self._http = httpx.Client(
            base_url=self._b.base_url, timeout=timeout_s, headers=self._b.default_headers
        )
        self._pool_renewers: dict[str, threading.Event] = {}
        self._lazy_created = False

    @property
    def base_url(self) -> str:
        return self._b.base_url

    # -- transport (the decisions: sie.client.exchange) ----------------------------------
    def _open(self, call: Call, *, stream: bool = False) -> httpx.Response:
        while True:
            request = request_for(self._http, call, self._b.timeout_s)
            try:
                resp = self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                time.sleep(transport_delay(call, exc))
                continue
            if settled(call, resp.status_code, resp.headers, stream=stream):
                return resp
            body = resp.read()
            resp.close()
            time.sleep(retry_delay(call, resp.status_code, resp.headers, body))

    def _run(self, call: Call) -> Any:
        return parse_answer(call, self._open(call))

    def _stream(self, call: Call) -> Iterator[dict[str, Any]]:
        assert call.policy is not None
        resp = self._open(call, stream=True)
        try:
            if not is_event_stream(resp):
                resp.read()
                yield resp.json()
                return
            reader = SSEReader()
            for line in resp.iter_lines():
                yield from reader.chunks(line)
                if reader.done:
                    return
            yield from reader.rest()
        except httpx.TransportError as exc:
            raise broken_stream(exc) from exc
        finally:
            resp.close()

    def _ensure_lazy_pool(self) -> None:
        if self._b.lazy_pool and not self._lazy_created:
            self.create_pool(**self._b.lazy_pool)
            self._lazy_created = True

    # -- encode, score, extract --------------------------------------------------------
    def encode(
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
        """Embed ``items`` (an ``Item``/str, or a list of them: one result or a list,
        in order). docs/sdk.md "encode"; docs/api.md §2.

        Raises:
            RequestError (4xx), ModelLoadFailedError (502), ResourceExhaustedError,
            ModelLoadingError, ProvisioningError, ServerError, SIEConnectionError.
        """
        args = forward(locals())
        self._ensure_lazy_pool()
        return self._run(self._b.encode_call(**args))  # type: ignore[no-any-return]

    def score(
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
        """Rank ``items`` against ``query``, best first (docs/api.md §3). Errors as
        ``encode``."""
        args = forward(locals())
        self._ensure_lazy_pool()
        return self._run(self._b.score_call(**args))  # type: ignore[no-any-return]

    def extract(
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
        """Entities (and relations, classifications, objects) per item (docs/api.md §4).
        One item in, one result out. Errors as ``encode``."""
        args = forward(locals())
        self._ensure_lazy_pool()
        return self._run(self._b.extract_call(**args))  # type: ignore[no-any-return]

    # -- models, capacity, watch ---------------------------------------------------------
    def list_models(self) -> list[ModelInfo]:
        """Every served model id with its state (``GET /v1/models``; docs/api.md §7)."""
        return self._run(self._b.list_models_call())  # type: ignore[no-any-return]

    def get_model(self, model: str) -> ModelInfo:
        """One ``ModelInfo``. Raises ``RequestError`` (404 ``MODEL_NOT_FOUND``)."""
        return self._run(self._b.get_model_call(model))  # type: ignore[no-any-return]

    def get_capacity(self, *, gpu: str | None = None) -> CapacityInfo:
        """Workers and machine profiles the gateway sees now (``GET /health``),
        limited to ``gpu``'s machine profile when given. Raises ``RequestError``
        (``not_gateway``) against anything but a gateway."""
        return self._run(self._b.capacity_call(gpu))  # type: ignore[no-any-return]

    def wait_for_capacity(
        self,
        gpu: str,
        *,
        model: str | None = None,
        timeout_s: float | None = None,
        poll_interval_s: float = 5.0,
    ) -> CapacityInfo:
        """Block until a worker serves ``gpu``: with ``model``, by encoding one warm-up
        text there (which also loads it); else by polling ``get_capacity``.

        Raises:
            ProvisioningError: nothing served within ``timeout_s`` (default 900 s).
        """
        budget = 900.0 if timeout_s is None else timeout_s
        if model is not None:
            self.encode(model, {"text": "warmup"}, gpu=gpu, provision_timeout_s=budget)
            return self.get_capacity(gpu=gpu)
        deadline = time.monotonic() + budget
        while True:
            cap = self.get_capacity(gpu=gpu)
            if cap.get("gpu_count", 0) > 0:
                return cap
            if time.monotonic() + poll_interval_s > deadline:
                raise ProvisioningError(f"no worker serves {gpu!r} after {budget:g} s", gpu=gpu)
            time.sleep(poll_interval_s)

    def watch(self, *, mode: str = "auto") -> Iterator[dict[str, Any]]:
        """Cluster status documents from ``/ws/cluster-status`` (docs/api.md §13): the
        current one, then one per change (at least every 15 s). ``mode``: ``auto`` or
        ``cluster`` (a gateway is the only server with this stream).

        Raises:
            RequestError: ``not_gateway`` or a refused handshake; SIEConnectionError.
        """
        if mode not in ("auto", "cluster"):
            raise ValueError("watch(mode=...) is 'auto' or 'cluster'")
        if mode == "auto":
            self.get_capacity()  # raises not_gateway
        headers = {k: v for k, v in self._http.headers.items() if k.lower() == "authorization"}
        idle = max(self._b.timeout_s, 45.0)
        return iter_messages(self._b.ws_url("/ws/cluster-status"), headers, idle)

    # -- config --------------------------------------------------------------------------
    def apply_config(self, config: Any, *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Write a model config to the config role (``POST /v1/configs/models``,
        docs/api.md §8): YAML text, a ``pathlib.Path`` or a mapping. Returns
        ``{"model_id", "created_profiles", ..., "epoch"}``; raises ``RequestError``
        (``CONTENT_CONFLICT`` 409, ``VALIDATION_ERROR`` 422, ...)."""
        return self._run(self._b.apply_config_call(config, idempotency_key=idempotency_key))  # type: ignore[no-any-return]

    def config_status(self, model: str) -> dict[str, Any]:
        """Which workers applied ``model``'s config (``GET
        /v1/configs/models/{id}/status`` on the gateway; docs/api.md §8)."""
        return self._run(self._b.config_status_call(model))  # type: ignore[no-any-return]

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Stop lease renewals and close the connections."""
        self._stop_renewers()
        self._http.close()

    def __enter__(self) -> SIEClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
