"""The continuous-batching scheduler of the transformers generation engine
(``sie.engines.generators.transformers_gen``, whose module docstring describes the
policy): one background thread owns the model and every tensor; it admits queued
sequences into free slots under the KV budget, runs one prefill chunk for the oldest
prefilling sequence, then one decode step for every decode batch, samples per
sequence and streams detokenised text through each sequence's ``deliver``.

Thread-safety: ``submit``, ``abort_now``, ``abort_seq``, ``state`` and ``stop`` may be
called from any thread; everything else runs on the scheduler thread.
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass
from typing import Any

from sie.core.admission import EngineState
from sie.core.errors import InferenceError, ShuttingDown
from sie.engines.generation import FinishReason, GenerationDelta
from sie.engines.generators.inflight import InFlight
from sie.engines.generators.json_mode import token_bytes
from sie.engines.generators.kv_batch import DecodeBatch, SeqState
from sie.engines.generators.sampling import adjust, choose, logprob_entries
from sie.engines.runtime.threads import cpu_cores

__all__ = ["CLOSE", "LoadedLM", "Scheduler"]

log = logging.getLogger(__name__)

#: What a sequence's ``deliver`` receives last: close the request's stream.
CLOSE = object()


@dataclass(frozen=True)
class LoadedLM:
    """A loaded causal LM as the scheduler runs it.

    ``cache_cls``: the KV cache class (``DynamicCache``); ``cache_kw``: the forward
    argument that takes it; ``window``: tokens the model sees at most; ``eos``: token
    ids that end a completion; ``batched``: rows share one padded decode batch.
    """

    torch: Any
    model: Any
    tokenizer: Any
    cache_cls: Any
    cache_kw: str
    window: int
    eos: frozenset[int]
    batched: bool
    device: str


class Scheduler:
    """Runs sequences of one model on a background thread (module docstring).

    Args:
        lm: the loaded model.
        sie_id: the model id (for errors and the thread name).
        max_num_seqs: sequences running at once.
        kv_capacity_tokens: KV tokens held at most by running sequences.
        prefill_chunk_tokens: prompt tokens per prefill step.
    """

    def __init__(
        self,
        lm: LoadedLM,
        *,
        sie_id: str,
        max_num_seqs: int,
        kv_capacity_tokens: int,
        prefill_chunk_tokens: int,
    ) -> None:
        self._sie_id = sie_id
        self._torch, self._model, self._tokenizer = lm.torch, lm.model, lm.tokenizer
        self._cache_cls, self._cache_kw = lm.cache_cls, lm.cache_kw
        self._window, self._eos, self._batched = lm.window, lm.eos, lm.batched
        self.device = lm.device
        self.max_num_seqs = max_num_seqs
        self.kv_capacity_tokens = kv_capacity_tokens
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self._cond = threading.Condition()
        self._queue: collections.deque[SeqState] = collections.deque()
        self._prefilling: list[SeqState] = []
        self._batches: list[DecodeBatch] = []
        self._inflight: InFlight[SeqState] = InFlight(sie_id)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._token_bytes: list[bytes] | None = None

    def start(self) -> None:
        """Start the scheduler thread."""
        self._thread = threading.Thread(
            target=self._run, name=f"sie-gen-{self._sie_id}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and end every sequence with ``ShuttingDown``; idempotent."""
        thread = self._thread
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if thread is not None:
            thread.join()
        self._thread = None
        err = ShuttingDown(f"model {self._sie_id!r} was unloaded")
        with self._cond:
            seqs = [*self._queue, *self._prefilling, *(s for b in self._batches for s in b.seqs)]
            self._queue.clear()
            self._prefilling = []
            self._batches = []
            self._inflight.close()
        for s in seqs:
            s.deliver(err)
            s.deliver(CLOSE)
            s.removed.set()

    def submit(self, seq: SeqState) -> None:
        """Queue ``seq``.

        Raises:
            InferenceError: the scheduler stopped (the model is not loaded).
            InvalidInput: its ``request_id`` is already in flight.
        """
        with self._cond:
            if self._stopping or self._thread is None:
                raise InferenceError(f"model {self._sie_id!r} is not loaded")
            self._inflight.add(seq.request_id, seq)
            self._queue.append(seq)
            self._cond.notify_all()

    def abort_now(self, request_id: str) -> SeqState | None:
        """Abort the in-flight request ``request_id``; returns its sequence, if known."""
        seq = self._inflight.get(request_id)
        if seq is not None:
            self.abort_seq(seq)
        return seq

    def abort_seq(self, seq: SeqState) -> None:
        """Mark ``seq`` aborted: a queued one leaves at once, a running one at the
        engine's next step (``removed`` is set then)."""
        with self._cond:
            if seq.aborted or seq.removed.is_set():
                return
            seq.aborted = True
            if seq in self._queue:
                self._queue.remove(seq)
                self._remove_locked(seq)
                seq.deliver(CLOSE)
                seq.removed.set()
            self._cond.notify_all()

    def state(self) -> EngineState:
        """Running and waiting sequences, and the share of the KV budget they hold."""
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
            log.exception("generation loop of %s crashed", self._sie_id)
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
        self._inflight.forget(seq.request_id, seq)

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
                s.deliver(CLOSE)
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
        seq.deliver(CLOSE)
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
        """The next token of ``seq`` (``sie.engines.generators.sampling``); records its
        log-probability entry when the request asked for them."""
        torch = self._torch
        sp = seq.sampling
        raw = logits.float().cpu()
        row = adjust(torch, raw, sp, seq.text_ids)
        table = self._table() if seq.json is not None or sp.logprobs is not None else None
        tid, state = choose(torch, row, sp, seq.generator, seq.json, table, self._eos)
        if state is not None:
            seq.json = state
        if sp.logprobs is not None and table is not None:
            seq.entry = logprob_entries(torch, raw, tid, sp.logprobs, table)
        return tid

    def _table(self) -> list[bytes]:
        """Each token id's bytes (``json_mode.token_bytes``; built on first use)."""
        if self._token_bytes is None:
            self._token_bytes = token_bytes(self._tokenizer)
        return self._token_bytes

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
            if seq.entry is not None:
                seq.unsent_logprobs.append(seq.entry)
                seq.entry = None
            text = seq.stop.feed(self._detok(seq))
            if seq.stop.stopped:
                reason = "stop"
            elif seq.json is not None and seq.json.complete:  # the object closed: done
                reason = "stop"
                text += seq.stop.feed(self._detok(seq, final=True))
                text += seq.stop.flush()
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
                delta = GenerationDelta(
                    text=text, num_tokens=seq.unsent_tokens, logprobs=self._logprobs(seq)
                )
                if not seq.deliver(delta):
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
                logprobs=self._logprobs(seq),
            )
        )
        seq.deliver(CLOSE)
        seq.removed.set()
        return True

    @staticmethod
    def _logprobs(seq: SeqState) -> list[dict[str, Any]] | None:
        """The entries of the tokens a delta accounts for (None: not asked for)."""
        if seq.sampling.logprobs is None:
            return None
        out, seq.unsent_logprobs = seq.unsent_logprobs, []
        return out
