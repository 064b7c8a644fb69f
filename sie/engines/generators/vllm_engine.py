"""Text generation on vLLM's in-process async engine (adapter
``sie.engines.generators.vllm_engine:VllmGenerator``; the ``vllm`` extra, GPU only).

Thin by design: vLLM schedules (continuous batching, paged KV cache, its own
``max_num_seqs``), samples and detokenises; this adapter maps the port onto vLLM's
public async API and back.

* ``load`` imports ``vllm`` (a missing install is ``ModelLoadFailed`` DEPENDENCY) and
  builds ``AsyncLLMEngine.from_engine_args(AsyncEngineArgs(...))`` (vLLM >= 0.10: the V1
  ``AsyncLLM``). ``model`` is the local weights directory (``resolve_weights``: the
  config's ``weights_path``, a packaged model, the local HF cache) or else the
  ``hf_id`` (vLLM fetches it, honouring ``HF_HUB_OFFLINE``). ``served_model_name`` is
  the ``sie_id`` (the ``model_name`` label of vLLM's metrics). Loadtime options:
  ``max_num_seqs``, ``gpu_memory_utilization``, ``max_model_len`` (default the config's
  ``max_sequence_length``), ``dtype`` (default the profile's ``compute_precision``, else
  vLLM's ``auto``), ``trust_remote_code``, ``enforce_eager``, and ``engine_args`` (a
  mapping passed to ``AsyncEngineArgs`` as is, for anything else).
* ``generate`` tokenises itself (the engine's tokenizer, fetched at load; chat through
  its chat template with the generation prompt, like the transformers engine, so
  prompt tokens agree) and submits ``{"prompt_token_ids": ids}`` with the
  ``SamplingParams`` of ``sie.engines.generators.vllm_sampling`` (every optional
  feature of ``sie.engines.generation.FEATURES``: penalties, ``logit_bias`` checked
  against the vocabulary, log probabilities, ``json_object`` through vLLM's structured
  outputs; docs/api.md §5.1); ``max_tokens`` null becomes the room left in the
  window. vLLM's outputs are cumulative (text, token ids, log probabilities): deltas
  are their growth.
  vLLM applies the stop strings and already holds back any text that could begin one;
  the text still passes through ``StopMatcher`` so that an engine streaming a stop
  prefix could not leak it (then the request is aborted in vLLM). Finish reasons:
  ``stop`` / ``length`` map as is; ``abort`` ends the stream without a final delta when
  ``abort`` asked for it, with ``ShuttingDown`` during ``unload``, and with
  ``InferenceError`` when vLLM aborted the request on its own (a stream never just stops). Usage: ``prompt_token_ids``
  and the completion's ``token_ids`` (EOS included, as vLLM counts it).
* ``abort`` calls ``engine.abort``; closing the iterator early does the same.
* ``state`` (cheap, thread-safe): the in-flight count is this adapter's own (every
  request of an in-process engine passes through it, so ``running + waiting`` equals
  it exactly and drops the moment a request ends or is aborted). The split into
  running and waiting and the KV usage come from vLLM's own Prometheus gauges
  (``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``) read from the
  process-wide ``prometheus_client`` registry, filtered by ``model_name``; they are
  recorded by vLLM after every engine step, so ``running`` is capped by the in-flight
  count (a stale gauge after an abort cannot show phantom requests) and the usage is 0
  with nothing in flight. When the registry has no series for this model (stats
  disabled, another engine registered last) it falls back to counting: a request that
  has produced output is running, the others wait, and the KV usage is the
  block-rounded tokens they hold over the capacity. Capacity is ``num_gpu_blocks *
  block_size`` from the engine's ``vllm_config``.

Tests inject a fake through the constructor (``vllm_module``: an object with
``AsyncEngineArgs``, ``SamplingParams`` and ``AsyncLLMEngine.from_engine_args``;
``registry``: the prometheus registry to read).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import math
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import anyio

from sie.core.config import ModelConfig, ResolvedProfile
from sie.core.errors import InferenceError, InvalidInput, ModelLoadFailed, ShuttingDown
from sie.engines.generation import (
    FEATURES,
    EngineState,
    FinishReason,
    GenerationDelta,
    GenerationRequest,
    StopMatcher,
    check_logit_bias,
    prompt_token_ids,
    validate_request,
)
from sie.engines.generators.inflight import InFlight
from sie.engines.generators.vllm_args import vllm_engine_args
from sie.engines.generators.vllm_gauges import default_registry, read_gauges
from sie.engines.generators.vllm_sampling import LogprobCursor, sampling_params

__all__ = ["VllmGenerator"]

log = logging.getLogger(__name__)


def _import_vllm() -> Any:
    """The real ``vllm`` module.

    Raises:
        ModelLoadFailed: (DEPENDENCY, permanent) vLLM is not installed or does not import.
    """
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise ModelLoadFailed(
            f"the vllm engine needs vLLM (pip install 'sie[vllm]', a GPU machine): {exc}",
            error_class="DEPENDENCY",
            permanent=True,
        ) from exc


@dataclass(eq=False)
class _Live:
    """One request in flight (written on its event loop, read by ``state``)."""

    loop: asyncio.AbstractEventLoop
    prompt_tokens: int
    generated: int = 0
    scheduled: bool = False  # vLLM produced output for it: it holds a running slot
    aborted: bool = False
    local_stop: bool = False


class VllmGenerator:
    """A ``GenerationEngine`` over vLLM's in-process async engine (module docstring).

    ``features``: every optional request feature (docs/api.md §5.1).

    Args:
        config / profile / device: as for every engine (no I/O here).
        vllm_module: replaces ``import vllm`` (tests pass a fake).
        registry: the prometheus registry vLLM records its gauges in (default the
            process-wide ``prometheus_client.REGISTRY``).
    """

    def __init__(
        self,
        config: ModelConfig,
        profile: ResolvedProfile,
        device: str = "cuda",
        *,
        vllm_module: Any = None,
        registry: Any = None,
    ) -> None:
        self.config = config
        self.profile = profile
        self.device = device
        self._vllm_module = vllm_module
        self._registry = registry
        self._vllm: Any = None
        self._engine: Any = None
        self._tokenizer: Any = None
        self._window = 0
        self._served_name = config.sie_id
        self.max_num_seqs: int | None = None
        self.kv_capacity_tokens: int | None = None
        self.block_size = 16
        self.engine_args: dict[str, Any] = {}
        self._inflight: InFlight[_Live] = InFlight(config.sie_id)
        self.features: frozenset[str] = frozenset(FEATURES)

    # ---------------------------------------------------------------- load / unload

    def load(self) -> None:
        """Start vLLM (heavy: profiles memory, may compile; run it off the event loop).

        Raises:
            ModelLoadFailed: vLLM missing (DEPENDENCY), a bad loadtime option (CONFIG),
                weights not found (NOT_FOUND), or vLLM failing to start (UNKNOWN).
        """
        if self._engine is not None:
            return
        vllm = self._vllm_module if self._vllm_module is not None else _import_vllm()
        args = vllm_engine_args(self.config, self.profile)
        sid = self.config.sie_id
        try:
            engine = vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(**args))
        except Exception as exc:  # vLLM raises many types (CUDA, config, OOM, ...)
            raise ModelLoadFailed(
                f"vLLM could not start {sid!r} from {args['model']!r}: {exc}",
                error_class="UNKNOWN",
                permanent=True,
            ) from exc
        cfg = getattr(engine, "vllm_config", None)
        model_cfg = getattr(cfg, "model_config", None)
        cache_cfg = getattr(cfg, "cache_config", None)
        sched_cfg = getattr(cfg, "scheduler_config", None)
        window = getattr(model_cfg, "max_model_len", None) or args.get("max_model_len")
        if not isinstance(window, int) or window <= 1:
            engine.shutdown()
            raise ModelLoadFailed(
                f"model {sid!r}: vLLM reports no context window; set loadtime.max_model_len",
                error_class="CONFIG",
                permanent=True,
            )
        blocks = getattr(cache_cfg, "num_gpu_blocks", None)
        block_size = getattr(cache_cfg, "block_size", None)
        self.block_size = block_size if isinstance(block_size, int) and block_size > 0 else 16
        self.kv_capacity_tokens = (
            blocks * self.block_size if isinstance(blocks, int) and blocks > 0 else None
        )
        seqs = getattr(sched_cfg, "max_num_seqs", None) or args.get("max_num_seqs")
        self.max_num_seqs = seqs if isinstance(seqs, int) and seqs > 0 else None
        self._window = window
        self._registry = self._registry if self._registry is not None else default_registry()
        self.engine_args = args
        self._vllm = vllm
        self._tokenizer = _tokenizer_now(engine)
        self._inflight.open()
        self._engine = engine
        log.info(
            "vLLM serving %s from %s: window %d, max_num_seqs %s, KV capacity %s tokens",
            sid,
            args["model"],
            window,
            self.max_num_seqs,
            self.kv_capacity_tokens,
        )

    def unload(self) -> None:
        """Abort what is in flight (its streams raise ``ShuttingDown``), shut vLLM down."""
        engine = self._engine
        lives = self._inflight.close()
        if engine is None:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[str]] = {}
        for rid, live in lives.items():
            by_loop.setdefault(live.loop, []).append(rid)
        for loop, rids in by_loop.items():
            if loop.is_closed():
                continue
            fut = asyncio.run_coroutine_threadsafe(_abort_all(engine, rids), loop)
            if _running_loop() is not loop:  # waiting on our own loop would deadlock
                try:
                    fut.result(timeout=5.0)
                except Exception as exc:  # a timeout, or the loop went away
                    log.warning("aborting in-flight requests of %s: %s", self.config.sie_id, exc)
        self._engine = None
        self._tokenizer = None
        try:
            engine.shutdown()
        except Exception:  # a failed shutdown must not stop the worker from moving on
            log.exception("vLLM shutdown of %s failed", self.config.sie_id)

    # ---------------------------------------------------------------- request path

    @property
    def window(self) -> int:
        """Tokens the model sees at most (prompt plus completion)."""
        return self._window

    async def get_tokenizer(self) -> Any:
        """The engine's tokenizer (``get_tokenizer``: awaited on vLLM versions where it
        is a coroutine)."""
        if self._tokenizer is None:
            engine = self._engine
            if engine is None:
                raise InferenceError(f"model {self.config.sie_id!r} is not loaded")
            tok = engine.get_tokenizer()
            if inspect.isawaitable(tok):
                tok = await tok
            self._tokenizer = tok
        return self._tokenizer

    def encode_prompt(self, tok: Any, req: GenerationRequest) -> list[int]:
        """The token ids vLLM reads for ``req`` (chat: the template plus the
        generation prompt, no extra special tokens; a prompt: the tokenizer's defaults).

        Raises:
            InvalidInput: no chat template, a template error, an empty or too long prompt.
        """
        return prompt_token_ids(tok, req, sie_id=self.config.sie_id, window=self._window)

    def sampling_params(self, req: GenerationRequest, n_prompt: int) -> Any:
        """vLLM ``SamplingParams`` for ``req`` (``vllm_sampling.sampling_params``)."""
        return sampling_params(self._vllm, req, self._window - n_prompt)

    def check_request(self, req: GenerationRequest) -> None:
        """Validate ``req`` before it is accepted: its fields, and (once the tokenizer
        is known, i.e. after the first request) the prompt against the window.

        Raises:
            InvalidInput: naming the field.
        """
        validate_request(req, self.features, "vllm")
        if self._tokenizer is not None:
            check_logit_bias(req.sampling, len(self._tokenizer))
            self.encode_prompt(self._tokenizer, req)

    async def generate(self, req: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        """Stream ``req``'s completion (see ``GenerationEngine.generate``)."""
        validate_request(req, self.features, "vllm")
        engine = self._engine
        if engine is None or self._inflight.closed:
            raise InferenceError(f"model {self.config.sie_id!r} is not loaded")
        tok = await self.get_tokenizer()
        check_logit_bias(req.sampling, len(tok))
        ids = await anyio.to_thread.run_sync(self.encode_prompt, tok, req)
        params = self.sampling_params(req, len(ids))
        k = req.sampling.logprobs
        cursor = LogprobCursor(k, tok) if k is not None else None
        eos = getattr(tok, "eos_token_id", None)
        rid = req.request_id
        live = _Live(loop=asyncio.get_running_loop(), prompt_tokens=len(ids))
        self._inflight.add(rid, live)
        stream = engine.generate({"prompt_token_ids": ids}, params, rid)
        matcher = StopMatcher(req.sampling.stop)
        final: GenerationDelta | None = None
        lps: list[dict[str, Any]] = []  # entries not yet sent

        def lps_out() -> list[dict[str, Any]] | None:
            nonlocal lps
            out, lps = lps, []
            return out if cursor is not None else None

        try:
            sent_chars = 0
            counted = 0  # completion tokens seen
            unsent = 0  # ... not yet reported in a delta
            try:
                async for out in stream:
                    comp = out.outputs[0]
                    text, token_ids, reason = comp.text, comp.token_ids, comp.finish_reason
                    live.scheduled = True
                    live.generated = len(token_ids)
                    if reason == "abort":  # by abort() / unload(), or by vLLM itself
                        break
                    new = text[sent_chars:] if len(text) > sent_chars else ""
                    sent_chars = max(sent_chars, len(text))
                    unsent += len(token_ids) - counted
                    counted = len(token_ids)
                    if cursor is not None:  # an EOS or stop token that ended it: no entry
                        lps += cursor.take(token_ids, comp.logprobs, _ends_on_eos(comp, eos))
                    emit = matcher.feed(new)
                    if matcher.stopped and reason is None:
                        live.local_stop = True  # vLLM streamed a stop it did not apply
                        reason = "stop"
                    if reason is None:
                        if emit:
                            yield GenerationDelta(text=emit, num_tokens=unsent, logprobs=lps_out())
                            unsent = 0
                        continue
                    if reason not in ("stop", "length"):
                        raise InferenceError(f"vLLM finished {rid!r} with {reason!r}")
                    finish: FinishReason = "stop" if reason == "stop" else "length"
                    if not matcher.stopped:
                        emit += matcher.flush()
                    prompt_ids = getattr(out, "prompt_token_ids", None)
                    final = GenerationDelta(
                        text=emit,
                        num_tokens=unsent,
                        finish_reason=finish,
                        prompt_tokens=len(prompt_ids) if prompt_ids else len(ids),
                        completion_tokens=counted,
                        logprobs=lps_out(),
                    )
                    if live.local_stop:
                        break
                    # vLLM's generator ends by itself after a finished output
            except (InvalidInput, InferenceError):
                raise
            except ValueError as exc:  # vLLM's request validation (VLLMValidationError)
                raise InvalidInput(f"vLLM rejected the request: {exc}") from exc
            except Exception as exc:
                if self._inflight.closed:
                    raise ShuttingDown(f"model {self.config.sie_id!r} was unloaded") from exc
                raise InferenceError(f"vLLM failed on {rid!r}: {exc}") from exc
            if final is None:
                if self._inflight.closed:
                    raise ShuttingDown(f"model {self.config.sie_id!r} was unloaded")
                if live.aborted:
                    return  # aborted by abort(): the stream ends without a final delta
                raise InferenceError(f"vLLM aborted or ended {rid!r} without finishing it")
            self._forget(rid, live)
            yield final
        finally:
            self._forget(rid, live)
            if final is None or live.local_stop:  # not finished inside vLLM: free the slot
                with anyio.CancelScope(shield=True):
                    await _close(stream)
                    if not live.aborted or live.local_stop:
                        try:
                            await engine.abort(rid)
                        except Exception as exc:
                            log.debug("vLLM abort of %s: %s", rid, exc)

    def _forget(self, rid: str, live: _Live | None = None) -> _Live | None:
        return self._inflight.forget(rid, live)

    async def abort(self, request_id: str) -> None:
        """Abort ``request_id`` in vLLM; it stops counting in ``state`` at once."""
        live = self._forget(request_id)
        engine = self._engine
        if live is None or engine is None:
            return
        live.aborted = True
        await engine.abort(request_id)

    # ---------------------------------------------------------------- state

    def state(self) -> EngineState:
        """Running, waiting, KV usage and capacity (module docstring: vLLM's gauges
        bounded by this adapter's in-flight count, else counting)."""
        lives = self._inflight.values()
        inflight = len(lives)
        cap = self.kv_capacity_tokens
        gauges = read_gauges(self._registry, self._served_name)
        kv: float | None
        if gauges is not None:
            running = min(gauges.running, inflight)
            kv = gauges.kv_usage if inflight else 0.0
        else:
            started = [x for x in lives if x.scheduled]
            running = min(len(started), self.max_num_seqs or len(started))
            if cap:
                bs = self.block_size
                held = sum(math.ceil((x.prompt_tokens + x.generated) / bs) * bs for x in started)
                kv = min(1.0, held / cap)
            else:
                kv = 0.0 if not inflight else None
        return EngineState(
            running=running,
            waiting=inflight - running,
            kv_usage=kv,
            kv_capacity_tokens=cap,
            max_num_seqs=self.max_num_seqs,
        )


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _abort_all(engine: Any, rids: Iterable[str]) -> None:
    for rid in rids:
        try:
            await engine.abort(rid)
        except Exception as exc:
            log.debug("vLLM abort of %s: %s", rid, exc)


async def _close(stream: Any) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception as exc:
        log.debug("closing a vLLM output stream: %s", exc)


def _tokenizer_now(engine: Any) -> Any:
    """The engine's tokenizer, when it can be had without an event loop (``load`` runs
    on a thread of its own), so ``check_request`` sees the window and the vocabulary
    from the first request; else None (``get_tokenizer`` fetches it on first use)."""
    try:
        tok = engine.get_tokenizer()
        if inspect.iscoroutine(tok):
            if _running_loop() is not None:
                tok.close()
                return None
            tok = asyncio.run(tok)
    except Exception as exc:  # a missing or failing accessor: fetched on first use
        log.debug("vLLM tokenizer at load: %s", exc)
        return None
    return None if inspect.isawaitable(tok) else tok


def _ends_on_eos(comp: Any, eos: Any) -> bool:
    """vLLM finished ``comp`` on its EOS (``stop_reason`` None) or on a stop token id
    (``stop_reason`` that id, e.g. a generation config's other EOS): that last token
    carries no text."""
    ids = comp.token_ids
    if comp.finish_reason != "stop" or not ids:
        return False
    sr = getattr(comp, "stop_reason", None)
    return (sr is None and ids[-1] == eos) or (isinstance(sr, int) and ids[-1] == sr)
