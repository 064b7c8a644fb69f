"""Text generation proxied to an external OpenAI-compatible server, e.g. a vLLM fleet
run elsewhere (adapter ``sie.engines.generators.openai_upstream:OpenAIUpstreamGenerator``).

Loadtime options:

* ``base_url`` (required): the server root, e.g. ``http://vllm:8000`` (a trailing
  ``/v1`` is accepted: requests go to ``<root>/v1/...`` either way). It must lie under
  an entry of the operator's ``SIE_UPSTREAM_BASE_URLS`` (``ConfigTrust.upstream_allowed``).
* ``api_key`` or ``api_key_env`` (the name of a variable holding it): sent as
  ``Authorization: Bearer``; optional. ``api_key_env`` must be one of the operator's
  ``SIE_UPSTREAM_API_KEY_ENVS``; its value comes from the injected ``ConfigTrust``
  (captured from the environment at the edge), never read from the process environment here.
* ``upstream_model``: the ``model`` sent upstream (default: ``hf_id``, else ``sie_id``).
* ``metrics_url``: the server's Prometheus page (default ``<root>/metrics``; ``false``
  disables scraping; an explicit URL must also be on the allowlist, and gets the API key
  only on the ``base_url``'s own origin); ``metrics_interval_s``: seconds between
  scrapes (2).
* ``max_num_seqs``: the server's ``--max-num-seqs`` (vLLM does not export it), copied
  into ``state()`` for the admission cap; optional.
* ``timeout_s``: seconds to wait for the upstream at each step (connect, headers, each
  streamed chunk; 600, so a long prefill is not cut off).

Request path: ``generate`` posts ``messages`` to ``/v1/chat/completions`` or ``prompt``
to ``/v1/completions`` with ``stream: true`` and ``stream_options.include_usage`` on
one shared ``httpx.AsyncClient`` (per event loop; the worker has one) and parses the
server-sent events (``data:`` lines, ``[DONE]``). Each content chunk counts as one
completion token (vLLM streams one chunk per engine step); the final delta carries the
upstream's ``usage`` and the remainder, so the deltas add up to ``completion_tokens``.
Stop strings are sent upstream **and** the text passes through ``StopMatcher``: if the
upstream streams a stop (or a prefix that then completes one) it is never emitted, the
stream is closed (the upstream aborts the request) and the finish is ``stop``, with
token counts estimated from the chunks (``prompt_tokens`` unknown: None).

Errors: an upstream 400/413/422 (or such an error event mid-stream) is
``InvalidInput`` with the upstream's message; 408/504 and read timeouts are
``GatewayTimeout``; 429/503 and unreachable servers are ``UpstreamUnavailable`` (503,
retry); any other status (401/403: bad credentials, 404: unknown ``upstream_model``,
5xx), a dropped connection or a stream ending without a finish is ``UpstreamError``
(502). During ``unload`` in-flight streams end with ``ShuttingDown``.

Abort: ``abort(request_id)`` (or closing the iterator) closes that request's upstream
response, which closes its connection; the upstream server sees the disconnect and
aborts the request (vLLM frees its slot).

State: ``state()`` is the latest reading of a background scraper, an
``EngineObserver`` polling ``metrics_url`` every ``metrics_interval_s`` on its own
``httpx.AsyncClient`` (never the inference client), parsed by
``parse_engine_metrics``. The observer runs on an event loop in a thread of its own
(an anyio blocking portal), started by ``load`` and stopped by ``unload``: ``load`` is
synchronous and runs off the worker's loop, ``state()`` must be callable from any
thread, and a scraper with its own loop and client is never delayed by inference
traffic (nor delays it). ``load`` returns after the first read (the observer's startup
self-check, bounded by its per-read timeout; a failure is logged at ERROR and is not
fatal). **Fail open**: while no healthy reading exists (never read, or 3 consecutive
failed scrapes) ``state()`` reports zeros (running 0, waiting 0, KV usage 0.0, capacity
None) and ``state_known`` is False; the admission gate then admits, as
admission-gate.md requires of an unreadable engine.

``observer_factory`` injects another observer (tests). ``trust`` is the operator's
policy (docs/security.md "Trust model"); without one nothing is allowed: every
``base_url`` is refused at load (``ModelLoadFailed`` CONFIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from anyio.from_thread import start_blocking_portal

from sie.core.admission import AdmissionConfig
from sie.core.config import ModelConfig, ResolvedProfile
from sie.core.errors import (
    GatewayTimeout,
    InferenceError,
    ShuttingDown,
    SieError,
    UpstreamError,
    UpstreamUnavailable,
)
from sie.core.trust import ConfigTrust
from sie.engines.generation import (
    EngineState,
    FinishReason,
    GenerationDelta,
    GenerationRequest,
    StopMatcher,
    validate_request,
)
from sie.engines.generators.inflight import InFlight
from sie.engines.generators.openai_wire import (
    DONE,
    error_message,
    event_error,
    finish_reason,
    next_line,
    parse_event,
    same_origin,
    status_error,
    usage_tokens,
)
from sie.engines.generators.upstream_options import read_upstream_options
from sie.engines.runtime.observer import EngineObserver

__all__ = ["OpenAIUpstreamGenerator"]

log = logging.getLogger(__name__)

_ABORTED = object()  # what an upstream step returns when the request was aborted


@dataclass(eq=False)
class _Stream:
    """One proxied request (touched only on its event loop)."""

    loop: asyncio.AbstractEventLoop
    done: anyio.Event
    aborted: bool = False
    shutting_down: bool = False
    response: httpx.Response | None = None
    scope: anyio.CancelScope | None = None  # the upstream step in progress, if any

    def stop(self, shutting_down: bool = False) -> None:
        self.aborted = True
        self.shutting_down = self.shutting_down or shutting_down
        if self.scope is not None:
            self.scope.cancel()


class OpenAIUpstreamGenerator:
    """A ``GenerationEngine`` proxying an OpenAI-compatible server (module docstring).

    Args:
        config / profile / device: as for every engine (``device`` is unused).
        observer_factory: builds the metrics observer (default ``EngineObserver``);
            called as ``factory(url, model=, cfg=, client_factory=, max_num_seqs=)``.
        trust: the operator's upstream allowlist and API keys (default: none allowed).
    """

    def __init__(
        self,
        config: ModelConfig,
        profile: ResolvedProfile,
        device: str = "cpu",
        *,
        observer_factory: Callable[..., Any] | None = None,
        trust: ConfigTrust | None = None,
    ) -> None:
        self.config = config
        self._trust = trust if trust is not None else ConfigTrust()
        self.profile = profile
        self.device = device
        self._observer_factory = observer_factory
        self.base_url = ""
        self.api_root = ""
        self.upstream_model = config.hf_id or config.sie_id
        self.metrics_url: str | None = None
        self.metrics_interval_s = 2.0
        self.max_num_seqs: int | None = None
        self.timeout_s = 600.0
        self._headers: dict[str, str] = {}
        self.observer: Any = None
        self._portal_cm: contextlib.AbstractContextManager[Any] | None = None
        self._observer_future: Future[Any] | None = None
        self._lock = threading.Lock()  # guards the inference client
        self._inflight: InFlight[_Stream] = InFlight(config.sie_id)
        self._http: httpx.AsyncClient | None = None
        self._http_loop: asyncio.AbstractEventLoop | None = None
        self._loaded = False

    # ---------------------------------------------------------------- options

    def _read_options(self) -> None:
        o = read_upstream_options(self.config, self.profile, self._trust)
        self.base_url, self.api_root, self._headers = o.base_url, o.api_root, dict(o.headers)
        self.upstream_model, self.metrics_url = o.upstream_model, o.metrics_url
        self.max_num_seqs, self.timeout_s = o.max_num_seqs, o.timeout_s
        self.metrics_interval_s = o.metrics_interval_s

    # ---------------------------------------------------------------- load / unload

    def load(self) -> None:
        """Read the options and start the metrics scraper (its first read included).

        Raises:
            ModelLoadFailed: (CONFIG) a bad loadtime option.
        """
        if self._loaded:
            return
        self._read_options()
        self._inflight.open()
        if self.metrics_url is not None:
            self._start_scraper(self.metrics_url)
        self._loaded = True
        log.info(
            "model %s proxied to %s (upstream model %r), metrics %s",
            self.config.sie_id,
            self.api_root,
            self.upstream_model,
            self.metrics_url or "off",
        )

    def _start_scraper(self, url: str) -> None:
        factory = self._observer_factory or EngineObserver
        # the server's own credentials go only to its own origin's metrics page
        headers = self._headers if same_origin(url, self.base_url) else {}
        observer = factory(
            url,
            model=self.config.sie_id,
            cfg=AdmissionConfig(poll_interval_s=self.metrics_interval_s),
            client_factory=lambda: httpx.AsyncClient(headers=headers),
            max_num_seqs=self.max_num_seqs,
        )
        cm = start_blocking_portal()
        portal = cm.__enter__()
        try:
            future, _ = portal.start_task(observer.run)
        except BaseException:
            cm.__exit__(None, None, None)
            raise
        self.observer, self._portal_cm, self._observer_future = observer, cm, future

    def unload(self) -> None:
        """Stop the scraper, end in-flight streams (``ShuttingDown``), drop the client."""
        lives = self._inflight.close().values()
        with self._lock:
            client, loop = self._http, self._http_loop
            self._http = self._http_loop = None
        for live in lives:
            if not live.loop.is_closed():
                live.loop.call_soon_threadsafe(live.stop, True)
        if client is not None and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop stopped meanwhile
                asyncio.run_coroutine_threadsafe(client.aclose(), loop)
        future, cm = self._observer_future, self._portal_cm
        self._observer_future = self._portal_cm = None
        if future is not None:
            future.cancel()
        if cm is not None:
            try:
                cm.__exit__(None, None, None)
            except Exception:
                log.exception("stopping the metrics scraper of %s", self.config.sie_id)
        self.observer = None
        self._loaded = False

    # ---------------------------------------------------------------- state

    @property
    def state_known(self) -> bool:
        """Whether ``state()`` is a healthy reading (False: zeros, fail open)."""
        obs = self.observer
        return obs is not None and obs.current() is not None

    def state(self) -> EngineState:
        """The latest scraped reading; zeros while none is healthy (module docstring)."""
        obs = self.observer
        reading = obs.current() if obs is not None else None
        if reading is None:
            return EngineState(
                running=0,
                waiting=0,
                kv_usage=0.0,
                kv_capacity_tokens=None,
                max_num_seqs=self.max_num_seqs,
            )
        state: EngineState = reading.state
        return state

    # ---------------------------------------------------------------- request path

    def _client(self) -> httpx.AsyncClient:
        """The inference client of the running event loop (one per loop: connections
        belong to the loop that opened them)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._http is None or self._http_loop is not loop:
                self._http = httpx.AsyncClient(
                    headers=self._headers,
                    timeout=httpx.Timeout(self.timeout_s, connect=min(10.0, self.timeout_s)),
                    limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
                )
                self._http_loop = loop
            return self._http

    def request_body(self, req: GenerationRequest) -> tuple[str, dict[str, Any]]:
        """The upstream URL and JSON body for ``req``."""
        sp = req.sampling
        body: dict[str, Any] = {
            "model": self.upstream_model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": sp.temperature,
            "top_p": sp.top_p,
        }
        if sp.max_tokens is not None:
            body["max_tokens"] = sp.max_tokens
        if sp.seed is not None:
            body["seed"] = sp.seed
        if sp.stop:
            body["stop"] = list(sp.stop)
        if req.messages is not None:
            body["messages"] = req.messages
            return self.api_root + "/chat/completions", body
        body["prompt"] = req.prompt
        return self.api_root + "/completions", body

    async def _step(self, live: _Stream, aw: Awaitable[Any]) -> Any:
        """Await one upstream step, abortable: ``_ABORTED`` when ``live`` was stopped.

        Raises:
            SieError: the mapped transport error.
        """
        if live.aborted:
            if inspect.iscoroutine(aw):
                aw.close()
            return _ABORTED
        with anyio.CancelScope() as scope:
            live.scope = scope
            try:
                return await aw
            except httpx.HTTPError as exc:
                raise self._transport_error(exc) from exc
            finally:
                live.scope = None
        return _ABORTED  # our scope was cancelled: abort() or unload()

    def check_request(self, req: GenerationRequest) -> None:
        """Validate ``req``'s fields (the prompt against the window is the upstream's
        to judge: its 400 becomes ``InvalidInput``). No optional feature is proxied
        (docs/api.md §5.1): such a request is refused naming the parameter.

        Raises:
            InvalidInput: naming the field.
        """
        validate_request(req, frozenset(), "openai_upstream")

    async def generate(self, req: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        """Stream ``req``'s completion from the upstream (see ``GenerationEngine.generate``)."""
        validate_request(req, frozenset(), "openai_upstream")
        if not self._loaded or self._inflight.closed:
            raise InferenceError(f"model {self.config.sie_id!r} is not loaded")
        rid = req.request_id
        chat = req.messages is not None
        url, body = self.request_body(req)
        live = _Stream(loop=asyncio.get_running_loop(), done=anyio.Event())
        self._inflight.add(rid, live)
        client = self._client()
        matcher = StopMatcher(req.sampling.stop)
        finished = False
        try:
            request = client.build_request("POST", url, json=body)
            response = await self._step(live, client.send(request, stream=True))
            if response is _ABORTED:
                self._raise_if_shutting_down(live)
                return
            live.response = response
            if response.status_code != 200:
                raw = await self._step(live, response.aread())
                if raw is _ABORTED:
                    self._raise_if_shutting_down(live)
                    return
                raise self._status_error(response.status_code, error_message(raw))
            lines = response.aiter_lines()
            emitted = 0  # completion tokens reported in deltas
            pending = 0  # ... counted (one per content chunk), not yet reported
            finish: str | None = None
            usage: dict[str, Any] | None = None
            stopped_here: str | None = None  # text before a stop the upstream streamed
            while stopped_here is None:
                line = await self._step(live, next_line(lines))
                if line is _ABORTED:
                    self._raise_if_shutting_down(live)
                    return
                if line is None:
                    break  # the stream ended (a missing [DONE] is tolerated)
                event = parse_event(line)
                if event is DONE:
                    break
                if not isinstance(event, dict):
                    continue
                err = self._event_error(event)
                if err is not None:
                    raise err
                if isinstance(event.get("usage"), dict):
                    usage = event["usage"]
                for choice in event.get("choices") or ():
                    if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                        continue
                    piece = (
                        (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                    )
                    if isinstance(piece, str) and piece:
                        pending += 1
                        out = matcher.feed(piece)
                        if matcher.stopped:
                            stopped_here = out
                            break
                        if out:
                            yield GenerationDelta(text=out, num_tokens=pending)
                            emitted, pending = emitted + pending, 0
                    if choice.get("finish_reason"):
                        finish = str(choice["finish_reason"])
            if stopped_here is not None:  # the upstream streamed a stop: cut it here
                finished = True
                yield GenerationDelta(
                    text=stopped_here,
                    num_tokens=pending,
                    finish_reason="stop",
                    prompt_tokens=None,
                    completion_tokens=emitted + pending,
                )
                return
            if finish is None:
                raise UpstreamError(
                    f"upstream {self.api_root} ended the stream of {rid!r} without a finish"
                )
            reason = self._finish_reason(finish)
            prompt_tokens, completion_tokens = usage_tokens(usage, emitted + pending)
            finished = True
            yield GenerationDelta(
                text=matcher.flush(),
                num_tokens=max(0, completion_tokens - emitted),
                finish_reason=reason,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
            )
        finally:
            self._inflight.forget(rid, live)
            if live.response is not None:
                with anyio.CancelScope(shield=True):
                    await live.response.aclose()  # unfinished: the upstream aborts it
            live.done.set()
            if not finished:
                log.debug("upstream request %s ended early", rid)

    def _raise_if_shutting_down(self, live: _Stream) -> None:
        if live.shutting_down:
            raise ShuttingDown(f"model {self.config.sie_id!r} was unloaded")

    async def abort(self, request_id: str) -> None:
        """Close ``request_id``'s upstream stream (the upstream then aborts it); returns
        once it is closed (a no-op for unknown ids)."""
        live = self._inflight.get(request_id)
        if live is None:
            return
        if live.loop is not asyncio.get_running_loop():
            live.loop.call_soon_threadsafe(live.stop)  # another loop: cannot wait on it
            return
        reading = live.scope is not None
        live.stop()
        if reading:  # the generator is inside an upstream step: it closes the stream
            with anyio.move_on_after(5.0):
                await live.done.wait()
        elif live.response is not None:  # the consumer is between deltas: close it now
            with anyio.CancelScope(shield=True):
                await live.response.aclose()

    # ---------------------------------------------------------------- error mapping

    def _finish_reason(self, finish: str) -> FinishReason:
        return finish_reason(self.api_root, finish)

    def _status_error(self, status: int, message: str) -> SieError:
        return status_error(self.api_root, status, message, self.upstream_model)

    def _event_error(self, event: dict[str, Any]) -> SieError | None:
        return event_error(self.api_root, event, self.upstream_model)

    def _transport_error(self, exc: httpx.HTTPError) -> SieError:
        if self._inflight.closed:
            return ShuttingDown(f"model {self.config.sie_id!r} was unloaded")
        where = f"upstream {self.api_root}"
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
            return UpstreamUnavailable(f"{where} is unreachable: {type(exc).__name__}: {exc}")
        if isinstance(exc, httpx.TimeoutException):
            return GatewayTimeout(f"{where} sent nothing for {self.timeout_s:g} s")
        return UpstreamError(f"{where} connection failed: {type(exc).__name__}: {exc}")
