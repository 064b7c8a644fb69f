"""What each SDK method sends and how its answer is read, shared by ``SIEClient`` and
``SIEAsyncClient`` (docs/sdk.md). A method builds a ``Call``; the client runs it
(with retries when the call has a ``RetryPolicy``) and hands the answer to
``Call.parse``. Nothing here does I/O.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from sie.client.errors import PoolError, RequestError, SIEError, StatusError
from sie.client.retry import RetryPolicy
from sie.client.shapes import (
    encode_body,
    extract_body,
    merge_options,
    parse_encode,
    parse_extract,
    parse_score,
    score_body,
    timing_of,
)
from sie.client.types import CapacityInfo, ModelInfo
from sie.client.wire import JSON, MSGPACK, base_headers, pack, routing_headers, split_gpu, unpack

__all__ = ["DEFAULT_TIMEOUT_S", "Call", "CallBuilder", "config_url_for", "filter_capacity"]

DEFAULT_TIMEOUT_S = 30.0
#: Seconds between lease renewals of a pool this client created (at most).
POOL_RENEW_INTERVAL_S = 60.0


@dataclass
class Call:
    """One HTTP exchange. ``url``: absolute, or a path under the client's base URL;
    ``policy``: retries (None: one attempt); ``parse``: the answer → the result;
    ``ok``: extra statuses that are answers, not errors (e.g. 404 on ``get_pool``)."""

    method: str
    url: str
    parse: Callable[[httpx.Response], Any]
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    policy: RetryPolicy | None = None
    ok: tuple[int, ...] = ()
    on_error: Callable[[SIEError], SIEError] | None = None


def config_url_for(base_url: str) -> str:
    """The config role's URL beside a gateway at ``base_url``: the same host, the next
    port (as ``sie serve`` lays them out: docs/sdk.md "Config")."""
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return urlunsplit((parts.scheme or "http", f"{host}:{port + 1}", "", "", ""))


def filter_capacity(health: Mapping[str, Any], gpu: str | None) -> CapacityInfo:
    """``GET /health`` → ``CapacityInfo``, its workers limited to ``gpu``'s machine
    profile (the part after ``/`` in ``pool/profile``) when given.

    Raises:
        RequestError: ``not_gateway`` (400) when the server is not a gateway.
    """
    if health.get("type") != "gateway":
        raise RequestError(
            "get_capacity needs a gateway (GET /health did not say type: gateway)",
            code="not_gateway",
            status_code=400,
        )
    _, profile = split_gpu(gpu)
    workers = [
        w
        for w in health.get("workers", [])
        if profile is None or str(w.get("machine_profile", "")).lower() == profile.lower()
    ]
    loaded = {
        m.get("name") for w in workers for m in w.get("models", []) if m.get("state") == "loaded"
    }
    cluster = health.get("cluster", {})
    return CapacityInfo(
        status=str(health.get("status", "")),
        configured_gpu_types=list(health.get("configured_gpu_types", [])),
        live_gpu_types=list(health.get("live_gpu_types", [])),
        worker_count=len(workers),
        gpu_count=sum(1 for w in workers if w.get("ready")),
        models_loaded=len(loaded),
        total_qps=float(cluster.get("total_qps", 0.0)),
        workers=workers,
    )


def _json(resp: httpx.Response) -> Any:
    return resp.json()


def _path(model: str) -> str:
    return quote(model, safe="/:@")


def _batch(items: Any) -> tuple[list[Any], bool]:
    """``items`` as a list, and whether it was one item (an ``Item`` or a str)."""
    single = isinstance(items, Mapping | str)
    return ([items] if single else list(items)), single


def _results(
    single: bool, parse: Callable[[httpx.Response], list[Any]]
) -> Callable[[httpx.Response], Any]:
    """``parse``, answering the one result when one item was sent."""
    return lambda resp: parse(resp)[0] if single else parse(resp)


class CallBuilder:
    """The request side of both clients: settings, headers and one ``Call`` per
    method. ``base_url`` is the gateway; ``config_url`` the config role (default:
    ``config_url_for(base_url)``); ``admin_key`` authorises pool and config writes
    (default: ``api_key``)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float,
        api_key: str | None,
        gpu: str | None,
        options: Mapping[str, Any] | None,
        pool: Mapping[str, Any] | None,
        config_url: str | None,
        admin_key: str | None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.api_key = api_key
        self.admin_key = admin_key or api_key
        self.gpu = gpu
        self.options = dict(options or {})
        self.config_url = (config_url or config_url_for(self.base_url)).rstrip("/")
        self.lazy_pool: dict[str, Any] | None = dict(pool) if pool else None
        if pool is not None:
            warnings.warn(
                "SIEClient(pool=...) is deprecated: create_pool(), then gpu='pool/profile'",
                DeprecationWarning,
                stacklevel=3,
            )
        self.default_headers = base_headers(api_key)
        self.last_pool: str | None = None

    # -- helpers ---------------------------------------------------------------------
    def _gpu(self, gpu: str | None) -> str | None:
        gpu = gpu if gpu is not None else self.gpu
        if self.lazy_pool and not split_gpu(gpu)[0]:
            profile = split_gpu(gpu)[1]
            return f"{self.lazy_pool['name']}/{profile or ''}"
        return gpu

    def _policy(self, operation: str, model: str, gpu: str | None, **kw: Any) -> RetryPolicy:
        return RetryPolicy(
            operation=operation, model=model, timeout_s=self.timeout_s, gpu=gpu, **kw
        )

    def _msgpack_call(
        self, op: str, model: str, body: dict[str, Any], gpu: str | None, parse: Any, **retry: Any
    ) -> Call:
        gpu = self._gpu(gpu)
        headers = {"Content-Type": MSGPACK, "Accept": MSGPACK, **routing_headers(gpu)}
        return Call(
            "POST",
            f"/v1/{op}/{_path(model)}",
            parse,
            content=pack(body),
            headers=headers,
            policy=self._policy(op, model, gpu, **retry),
        )

    # -- encode, score, extract ----------------------------------------------------------
    def encode_call(
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
    ) -> Call:
        batch, single = _batch(items)
        body = encode_body(
            batch,
            output_types=output_types,
            instruction=instruction,
            output_dtype=output_dtype,
            is_query=is_query,
            options=merge_options(self.options, options),
        )

        return self._msgpack_call(
            "encode",
            model,
            body,
            gpu,
            _results(single, lambda r: parse_encode(unpack(r.content), timing_of(r.headers))),
            wait_for_capacity=wait_for_capacity,
            provision_timeout_s=provision_timeout_s,
            max_oom_retries=max_oom_retries,
        )

    def score_call(
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
    ) -> Call:
        body = score_body(
            query,
            list(items),
            instruction=instruction,
            options=merge_options(self.options, options),
            top_k=top_k,
        )
        return self._msgpack_call(
            "score",
            model,
            body,
            gpu,
            lambda resp: parse_score(unpack(resp.content)),
            wait_for_capacity=wait_for_capacity,
            provision_timeout_s=provision_timeout_s,
            max_oom_retries=max_oom_retries,
        )

    def extract_call(
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
    ) -> Call:
        batch, single = _batch(items)
        body = extract_body(
            batch,
            labels=labels,
            output_schema=output_schema,
            instruction=instruction,
            options=merge_options(self.options, options),
        )

        return self._msgpack_call(
            "extract",
            model,
            body,
            gpu,
            _results(single, lambda r: parse_extract(unpack(r.content))),
            wait_for_capacity=wait_for_capacity,
            provision_timeout_s=provision_timeout_s,
            max_oom_retries=max_oom_retries,
        )

    # -- generation ------------------------------------------------------------------
    def generation_call(
        self,
        route: str,
        model: str,
        body: dict[str, Any],
        *,
        gpu: str | None,
        wait_for_capacity: bool,
        provision_timeout_s: float | None,
    ) -> Call:
        """``route``: ``chat`` (``/v1/chat/completions``), ``completions`` or ``native``
        (``/v1/generate/{model}``). JSON in and out (the generation routes read JSON)."""
        gpu = self._gpu(gpu)
        url = {
            "chat": "/v1/chat/completions",
            "completions": "/v1/completions",
            "native": f"/v1/generate/{_path(model)}",
        }[route]
        payload = {k: v for k, v in body.items() if v is not None}
        if route != "native":
            payload["model"] = model
        headers = {"Content-Type": JSON, "Accept": f"{JSON}, text/event-stream"}
        return Call(
            "POST",
            url,
            _json,
            content=json.dumps(payload).encode(),
            headers={**headers, **routing_headers(gpu)},
            policy=self._policy(
                "generate",
                model,
                gpu,
                wait_for_capacity=wait_for_capacity,
                provision_timeout_s=provision_timeout_s,
                max_oom_retries=3,
            ),
        )

    # -- models, capacity ------------------------------------------------------------
    def list_models_call(self) -> Call:
        return Call(
            "GET", "/v1/models", lambda r: list(r.json()["models"]), headers={"Accept": JSON}
        )

    def get_model_call(self, model: str) -> Call:
        return Call(
            "GET",
            f"/v1/models/{_path(model)}",
            lambda r: cast(ModelInfo, dict(r.json())),
            headers={"Accept": JSON},
        )

    def capacity_call(self, gpu: str | None) -> Call:
        gpu = gpu if gpu is not None else self.gpu
        return Call(
            "GET", "/health", lambda r: filter_capacity(r.json(), gpu), headers={"Accept": JSON}
        )

    # -- pools -------------------------------------------------------------------------
    def _admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_key}"} if self.admin_key else {}

    def _pool_error(self, name: str) -> Callable[[SIEError], SIEError]:
        def wrap(err: SIEError) -> SIEError:
            if isinstance(err, StatusError):
                return PoolError(
                    err.message,
                    pool_name=name,
                    code=err.code,
                    status_code=err.status_code,
                    details=err.details,
                )
            return err

        return wrap

    def create_pool_call(self, spec: Mapping[str, Any]) -> Call:
        name = str(spec.get("name", ""))
        body = {k: v for k, v in spec.items() if v is not None}
        return Call(
            "POST",
            "/v1/pools",
            _json,
            content=json.dumps(body).encode(),
            headers={"Content-Type": JSON, "Accept": JSON, **self._admin()},
            on_error=self._pool_error(name),
        )

    def get_pool_call(self, name: str) -> Call:
        return Call(
            "GET",
            f"/v1/pools/{quote(name, safe='')}",
            lambda r: None if r.status_code == 404 else r.json(),
            headers={"Accept": JSON},
            ok=(404,),
        )

    def list_pools_call(self) -> Call:
        return Call("GET", "/v1/pools", lambda r: list(r.json()["pools"]), headers={"Accept": JSON})

    def renew_pool_call(self, name: str) -> Call:
        return Call(
            "POST",
            f"/v1/pools/{quote(name, safe='')}/renew",
            _json,
            headers={"Accept": JSON, **self._admin()},
            on_error=self._pool_error(name),
        )

    def delete_pool_call(self, name: str) -> Call:
        return Call(
            "DELETE",
            f"/v1/pools/{quote(name, safe='')}",
            lambda r: r.status_code != 404,
            headers={"Accept": JSON, **self._admin()},
            ok=(404,),
            on_error=self._pool_error(name),
        )

    def pool_name(self, name: str | None) -> str:
        """``name``, else the pool this client created last.

        Raises:
            PoolError: neither.
        """
        found = name or self.last_pool or (self.lazy_pool or {}).get("name")
        if not found:
            raise PoolError("no pool named and none created by this client", pool_name="")
        return str(found)

    # -- config --------------------------------------------------------------------------
    def apply_config_call(self, config: Any, *, idempotency_key: str | None = None) -> Call:
        """``config``: YAML text, a path to a YAML file, or a mapping (sent as JSON,
        which is YAML)."""
        if isinstance(config, Mapping):
            text = json.dumps(config)
        elif isinstance(config, Path):
            text = config.read_text()
        else:
            text = str(config)
        headers = {"Content-Type": "application/yaml", "Accept": JSON, **self._admin()}
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        return Call(
            "POST",
            f"{self.config_url}/v1/configs/models",
            _json,
            content=text.encode(),
            headers=headers,
        )

    def config_status_call(self, model: str) -> Call:
        return Call(
            "GET", f"/v1/configs/models/{_path(model)}/status", _json, headers={"Accept": JSON}
        )

    def health_call(self) -> Call:
        return Call("GET", "/health", _json, headers={"Accept": JSON})

    def ws_url(self, path: str) -> str:
        parts = urlsplit(self.base_url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + path, "", ""))

    def pool_spec(
        self,
        name: str,
        gpus: Mapping[str, int],
        *,
        bundle: str | None = None,
        minimum_worker_count: int | None = None,
        ttl_seconds: int | None = None,
        gpu_caps: Mapping[str, int] | None = None,
        queue_pool: str | None = None,
        pinned_models: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "name": name,
            "gpus": dict(gpus),
            "bundle": bundle,
            "minimum_worker_count": minimum_worker_count,
            "ttl_seconds": ttl_seconds,
            "gpu_caps": dict(gpu_caps) if gpu_caps else None,
            "queue_pool": queue_pool,
            "pinned_models": list(pinned_models) if pinned_models else None,
        }
        return {k: v for k, v in spec.items() if v is not None}


def renew_interval(ttl_seconds: int | None) -> float | None:
    """Seconds between renewals of a pool with this lease (None: no lease, no renewal)."""
    if not ttl_seconds:
        return None
    return max(1.0, min(POOL_RENEW_INTERVAL_S, ttl_seconds / 3))
