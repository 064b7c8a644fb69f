"""A fake of vLLM for machines without a GPU: the in-process async engine and its
OpenAI-compatible server, deterministic and scripted.

- ``FakeTokenizer``: a word-level tokenizer with the Hugging Face methods the engines
  call (``encode``, ``decode``, ``__call__``, ``apply_chat_template`` with a ChatML
  template, ``eos_token_id``); ``decode(encode(text)) == text`` for any text.
- ``FakeAsyncLLM``: exactly the subset of vLLM's ``AsyncLLM`` that
  ``sie.engines.generators.vllm_engine.VllmGenerator`` uses: ``generate(prompt, sampling_params,
  request_id)`` (an async generator of cumulative ``RequestOutput``s: text, token ids,
  ``finish_reason``, and with ``logprobs`` per position ``{token_id: Logprob}`` holding
  the sampled token and the top ``logprobs`` by rank), ``abort(request_id)`` (a final output with ``finish_reason
  "abort"``, as vLLM >= 0.10 produces), ``get_tokenizer()``, ``vllm_config`` and
  ``shutdown()``. A scheduler thread plays vLLM's engine core: ``max_num_seqs`` running
  slots and a block-granular KV cache, one token per running request per step. Stop
  strings follow vLLM: streamed text holds back ``len(longest stop) - 1`` characters,
  the final text is cut before the stop, the token that completed it is counted. EOS is
  a completion token without text. The fake model's logits at each step: the scripted
  token 10, twenty other words 5, 4.75, 4.5, ..., every other id of the 32000-token
  vocabulary 0; ``logit_bias`` is added before the greedy choice (so +100 forces a
  token and -100 bans the scripted one, which falls to the best alternative); log
  probabilities are of the raw logits (vLLM's default). Structured outputs
  ``json_object`` script ``{"answer": <the first 8 words of the plain continuation>}``.
  Penalties are validated as vLLM does and have no effect on the scripted words.
  Validation errors are ``ValueError`` with vLLM's wording (out-of-vocabulary
  ``logit_bias`` ids, ``logprobs`` over ``max_logprobs`` 20, penalties outside [-2, 2]).
- ``FakeVllm``: stands in for the ``vllm`` module (``AsyncEngineArgs``,
  ``SamplingParams``, ``sampling_params.StructuredOutputsParams`` (vLLM >= 0.11; with
  ``legacy_guided=True`` the older ``GuidedDecodingParams`` instead),
  ``AsyncLLMEngine.from_engine_args``), injected into
  ``VllmGenerator(..., vllm_module=FakeVllm())``; it can publish the engine's gauges to
  a ``CollectorRegistry`` under vLLM's metric names, as vLLM does in-process.
- ``FakeVllmServer``: a Starlette app with vLLM's OpenAI-compatible
  ``/v1/completions`` and ``/v1/chat/completions`` (streaming and not,
  ``stream_options.include_usage``), ``/v1/models`` and ``/metrics`` (vLLM's
  exposition: running, waiting, KV usage, ``cache_config_info``) reflecting the live
  engine; faults can be injected. ``serve(server)`` runs it with hypercorn on a free
  loopback port in a thread of its own, so tests on any event loop can call it.

Scripted greedy answers (temperature 0): the chat "What is the capital of France?" ->
"The capital of France is Paris." then EOS; the completion "The capital of France is"
-> " Paris. It is ..."; a prompt ending "N," in a "Count from A to B:" list counts on to
B; any other prompt gets words chosen by a hash of the prompt (48 words, ".", EOS).
Sampling (temperature > 0) draws words from a generator seeded by (prompt, seed).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import random
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from types import SimpleNamespace
from typing import Any

import anyio
from anyio.from_thread import start_blocking_portal
from hypercorn.asyncio import serve as hypercorn_serve
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.loopback import loopback_config

__all__ = [
    "COUNTING",
    "FRANCE",
    "FRANCE_ANSWER",
    "VOCAB_SIZE",
    "AsyncEngineArgs",
    "CompletionOutput",
    "FakeAsyncLLM",
    "FakeTokenizer",
    "FakeVllm",
    "FakeVllmServer",
    "Fault",
    "GuidedDecodingParams",
    "Logprob",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputsParams",
    "serve",
]

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
FRANCE_ANSWER = "The capital of France is Paris."
COUNTING = "Count from 1 to 500: 1, 2, 3, 4,"
_COMPLETIONS = {
    "The capital of France is": " Paris. It is known for the Eiffel Tower, the Louvre"
    " and its cafes.",
}
_CHATS = {FRANCE[0]["content"]: FRANCE_ANSWER}
_WORDS = (
    "river stone light garden quiet blue north window song paper green winter bridge "
    "cloud road silver morning forest lantern harbor meadow candle orchard valley "
    "thunder amber copper echo falcon glacier island jasmine kettle lemon marble "
    "nectar ocean pepper quartz raven saffron tulip umber velvet willow yarrow zephyr"
).split()


# ---------------------------------------------------------------- tokenizer

_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_PIECE = re.compile(r"<\|[a-z_]+\|>|\s*\w+|\s*(?!<\|[a-z_]+\|>)[^\s\w]|\s+")


#: The fake vocabulary's size (ids never seen as a piece decode as `` t<id>``).
VOCAB_SIZE = 32000


class _Vocab:
    """Piece <-> id, grown on first sight; shared by every FakeTokenizer of the process
    (the fake server and the tests agree on ids)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ids: dict[str, int] = {s: i for i, s in enumerate(_SPECIALS)}
        self.pieces: list[str] = list(_SPECIALS)

    def id_of(self, piece: str) -> int:
        with self._lock:
            got = self.ids.get(piece)
            if got is None:
                assert len(self.pieces) < VOCAB_SIZE, "the fake vocabulary is full"
                got = self.ids[piece] = len(self.pieces)
                self.pieces.append(piece)
            return got

    def piece(self, tid: int) -> str:
        return self.pieces[tid] if tid < len(self.pieces) else f" t{tid}"


_VOCAB = _Vocab()


class FakeTokenizer:
    """Word-level: a piece is a special token, optional whitespace plus a word, optional
    whitespace plus one punctuation character, or trailing whitespace."""

    chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    eos_token = "<|im_end|>"
    eos_token_id = _SPECIALS.index("<|im_end|>")
    all_special_ids = list(range(len(_SPECIALS)))

    def tokenize(self, text: str) -> list[str]:
        pieces = _PIECE.findall(text)
        assert "".join(pieces) == text, "tokenizer lost characters"
        return pieces

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [_VOCAB.id_of(p) for p in self.tokenize(text)]

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens=add_special_tokens)}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        return "".join(_VOCAB.piece(i) for i in ids if i not in skip)

    def __len__(self) -> int:
        return VOCAB_SIZE

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = False,
        tokenize: bool = True,
        **_: Any,
    ) -> str | list[int]:
        out = []
        for m in messages:
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            out.append(f"<|im_start|>{m['role']}\n{content or ''}<|im_end|>\n")
        if add_generation_prompt:
            out.append("<|im_start|>assistant\n")
        text = "".join(out)
        return self.encode(text, add_special_tokens=False) if tokenize else text


# ---------------------------------------------------------------- vLLM's value types


@dataclass
class StructuredOutputsParams:
    """vLLM's ``StructuredOutputsParams`` (exactly one constraint; the fake plays
    ``json_object`` only)."""

    json: Any = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        count = sum(
            v is not None
            for v in (self.json, self.regex, self.choice, self.grammar, self.json_object)
        )
        if count != 1:
            raise ValueError("You must use one kind of structured outputs constraint")


@dataclass
class GuidedDecodingParams(StructuredOutputsParams):
    """vLLM < 0.11's name for the same parameters (``guided_decoding=``)."""


@dataclass(kw_only=True)
class SamplingParams:
    """vLLM's ``SamplingParams``, the fields sie uses (unknown keywords: TypeError),
    checked as vLLM's ``_verify_args`` checks them (``ValueError``)."""

    n: int = 1
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] | str | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    logprobs: int | None = None
    structured_outputs: StructuredOutputsParams | None = None
    guided_decoding: GuidedDecodingParams | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}.")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.logprobs is not None and self.logprobs != -1 and self.logprobs < 0:
            raise ValueError(f"logprobs must be non-negative or -1, got {self.logprobs}.")
        if any(not s for s in self.stops):
            raise ValueError("stop cannot contain an empty string.")
        if self.logit_bias is not None:
            self.logit_bias = {
                int(t): min(100.0, max(-100.0, b)) for t, b in self.logit_bias.items()
            }

    @property
    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]

    @property
    def json_object(self) -> bool:
        so = self.structured_outputs or self.guided_decoding
        return so is not None and bool(so.json_object)


@dataclass
class Logprob:
    """vLLM's ``Logprob``: one token's log probability, rank and text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


#: vLLM's default ``max_logprobs``.
MAX_LOGPROBS = 20


#: AsyncEngineArgs fields the fake accepts (all real vLLM engine arguments).
_ENGINE_ARGS = frozenset(
    {
        "model",
        "tokenizer",
        "served_model_name",
        "revision",
        "dtype",
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "gpu_memory_utilization",
        "trust_remote_code",
        "seed",
        "disable_log_stats",
        "enforce_eager",
        "tensor_parallel_size",
        "enable_prefix_caching",
        "block_size",
        "kv_cache_dtype",
        "quantization",
    }
)


class AsyncEngineArgs:
    """vLLM's ``AsyncEngineArgs``: keeps its keyword arguments (unknown ones: TypeError)."""

    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - _ENGINE_ARGS
        if unknown:
            raise TypeError(f"AsyncEngineArgs got unexpected arguments {sorted(unknown)}")
        if "model" not in kwargs:
            raise TypeError("AsyncEngineArgs needs model")
        self.kwargs = kwargs


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: Any = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: Any
    outputs: list[CompletionOutput]
    finished: bool


@dataclass
class RecordedRequest:
    """What ``generate`` was called with (tests assert the mapping on it)."""

    prompt: Any
    params: SamplingParams
    request_id: str


# ---------------------------------------------------------------- the engine


@dataclass(eq=False)
class _Req:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int
    script: list[int]
    deliver: Callable[[object], None]
    out_ids: list[int] = field(default_factory=list)
    text: str = ""
    finished: bool = False
    logprobs: list[dict[int, Logprob]] | None = None  # per position, when asked for


def _alternatives(prompt_ids: list[int], n: int, avoid: int) -> list[int]:
    """Twenty distinct word ids, other than ``avoid``, for step ``n`` of a prompt."""
    digest = hashlib.sha256(f"{prompt_ids}\0{n}".encode()).digest()
    start = int.from_bytes(digest[:4], "big")
    out: list[int] = []
    for i in range(len(_WORDS)):
        tid = _VOCAB.id_of(" " + _WORDS[(start + i) % len(_WORDS)])
        if tid != avoid and tid not in out:
            out.append(tid)
        if len(out) == 20:
            break
    return out


def _continuation(prompt: str) -> str:
    """The greedy continuation of a prompt (chat renders included), without EOS."""
    chat = re.search(
        r"<\|im_start\|>user\n(.*?)<\|im_end\|>\n<\|im_start\|>assistant\n$", prompt, re.S
    )
    if chat is not None:
        content = chat.group(1)
        return _CHATS.get(content) or _words(content, None, leading_space=False)
    if prompt in _COMPLETIONS:
        return _COMPLETIONS[prompt]
    count = re.search(r"Count from \d+ to (\d+):.*?(\d+),\s*$", prompt, re.S)
    if count is not None:
        last, end = int(count.group(2)), int(count.group(1))
        return "".join(f" {k}," for k in range(last + 1, end))[:-1] + f" {end}."
    return _words(prompt, None)


def _words(prompt: str, rng: random.Random | None, leading_space: bool = True) -> str:
    words = []
    for i in range(48):
        if rng is None:
            digest = hashlib.sha256(f"{prompt}\0{i}".encode()).digest()
            words.append(_WORDS[int.from_bytes(digest[:4], "big") % len(_WORDS)])
        else:
            words.append(rng.choice(_WORDS))
    text = " ".join(words) + "."
    return " " + text if leading_space else text[0].upper() + text[1:]


class FakeAsyncLLM:
    """vLLM's in-process async engine, scripted (module docstring).

    Args:
        model: the served model name (the ``model_name`` metric label).
        max_num_seqs: running slots; further requests wait.
        num_gpu_blocks / block_size: the KV cache (capacity = their product, tokens).
        max_model_len: the model window (prompt plus completion).
        step_s: seconds one engine step (one token for every running request) takes.
        honour_stop: False plays an engine that ignores stop strings (streams them).

    Attributes:
        requests: every ``generate`` call, in order.
        aborted: request ids aborted (by ``abort`` or by a consumer that went away).
        metrics_override: values that replace the live ones in ``stats`` (keys
            ``running``, ``waiting``, ``kv_usage``).
    """

    def __init__(
        self,
        *,
        model: str = "fake/model",
        max_num_seqs: int = 4,
        num_gpu_blocks: int = 256,
        block_size: int = 16,
        max_model_len: int = 2048,
        step_s: float = 0.002,
        honour_stop: bool = True,
    ) -> None:
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.step_s = step_s
        self.honour_stop = honour_stop
        self.tokenizer = FakeTokenizer()
        self.vllm_config = SimpleNamespace(
            model_config=SimpleNamespace(max_model_len=max_model_len, served_model_name=model),
            cache_config=SimpleNamespace(num_gpu_blocks=num_gpu_blocks, block_size=block_size),
            scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        )
        self.requests: list[RecordedRequest] = []
        self.aborted: list[str] = []
        self.metrics_override: dict[str, float] = {}
        self.steps = 0
        self._cond = threading.Condition()
        self._waiting: deque[_Req] = deque()
        self._running: list[_Req] = []
        self._by_id: dict[str, _Req] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="fake-vllm-core", daemon=True)
        self._thread.start()

    # -- the public surface (what VllmGenerator calls) ------------------------------

    async def get_tokenizer(self) -> FakeTokenizer:
        return self.tokenizer

    async def generate(
        self, prompt: Any, sampling_params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            ids = list(prompt["prompt_token_ids"])
        elif isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            raise TypeError(f"unsupported prompt {prompt!r}")
        if not ids or len(ids) >= self.max_model_len:
            raise ValueError(
                f"The prompt (length {len(ids)}) is longer than the maximum model length "
                f"of {self.max_model_len}."
            )
        sp = sampling_params
        max_tokens = sp.max_tokens if sp.max_tokens is not None else self.max_model_len - len(ids)
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}.")
        bad = sorted(t for t in (sp.logit_bias or {}) if not 0 <= t < VOCAB_SIZE)
        if bad:
            raise ValueError(
                f"token_id(s) {bad} in logit_bias contain out-of-vocab token ids. "
                f"Vocabulary size: {VOCAB_SIZE}"
            )
        if sp.logprobs is not None and sp.logprobs > MAX_LOGPROBS:
            raise ValueError(
                f"Requested sample logprobs of {sp.logprobs}, which is greater than max "
                f"allowed: {MAX_LOGPROBS}"
            )
        text = self.tokenizer.decode(ids)
        if sp.temperature > 0:
            seed = sp.seed if sp.seed is not None else random.SystemRandom().getrandbits(64)
            cont = _words(text, random.Random(f"{text}\0{seed}"))
        else:
            cont = _continuation(text)
        if sp.json_object:
            cont = json.dumps({"answer": " ".join(cont.split()[:8])})
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()

        def deliver(item: object) -> None:
            with contextlib.suppress(RuntimeError):  # the consumer's loop is closed
                loop.call_soon_threadsafe(queue.put_nowait, item)

        req = _Req(
            request_id=request_id,
            prompt_ids=ids,
            params=sp,
            max_tokens=max_tokens,
            script=self.tokenizer.encode(cont, add_special_tokens=False),
            deliver=deliver,
            logprobs=[] if sp.logprobs is not None else None,
        )
        with self._cond:
            if self._stopping:
                raise RuntimeError("EngineDeadError: the engine was shut down")
            if request_id in self._by_id:
                raise ValueError(f"request id {request_id} already running")
            self.requests.append(RecordedRequest(prompt, sp, request_id))
            self._by_id[request_id] = req
            self._waiting.append(req)
            self._cond.notify_all()
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                assert isinstance(item, RequestOutput)
                finished = item.finished
                yield item
        finally:
            if not finished:  # cancelled or closed by the consumer: vLLM aborts
                self._abort(request_id)

    async def abort(self, request_id: str) -> None:
        self._abort(request_id)

    def shutdown(self) -> None:
        with self._cond:
            self._stopping = True
            reqs = [*self._waiting, *self._running]
            self._waiting.clear()
            self._running.clear()
            self._by_id.clear()
            self._cond.notify_all()
        for r in reqs:
            r.deliver(RuntimeError("EngineDeadError: the engine was shut down"))
        self._thread.join(timeout=5)

    # -- stats --------------------------------------------------------------------

    def stats(self) -> SimpleNamespace:
        """Running, waiting and KV usage now (with ``metrics_override`` applied)."""
        with self._cond:
            running, waiting = len(self._running), len(self._waiting)
            used = sum(self._blocks(r) for r in self._running)
        kv = min(1.0, used / self.num_gpu_blocks)
        o = self.metrics_override
        return SimpleNamespace(
            running=int(o.get("running", running)),
            waiting=int(o.get("waiting", waiting)),
            kv_usage=float(o.get("kv_usage", kv)),
        )

    def collector(self) -> _Collector:
        """A prometheus collector of this engine's gauges under vLLM's names."""
        return _Collector(self)

    # -- the engine core ------------------------------------------------------------

    def _blocks(self, r: _Req) -> int:
        return math.ceil((len(r.prompt_ids) + len(r.out_ids)) / self.block_size)

    def _abort(self, request_id: str) -> None:
        with self._cond:
            r = self._by_id.pop(request_id, None)
            if r is None:
                return
            if r in self._waiting:
                self._waiting.remove(r)
            if r in self._running:
                self._running.remove(r)
            r.finished = True
            self.aborted.append(request_id)
            self._cond.notify_all()
        r.deliver(self._output(r, "abort", None, r.text))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not (self._waiting or self._running):
                    self._cond.wait()
                if self._stopping:
                    return
                used = sum(self._blocks(r) for r in self._running)
                while self._waiting and len(self._running) < self.max_num_seqs:
                    need = self._blocks(self._waiting[0]) + 1
                    if self._running and used + need > self.num_gpu_blocks:
                        break
                    self._running.append(self._waiting.popleft())
                    used += need
                batch = list(self._running)
            time.sleep(self.step_s)  # the forward pass
            with self._cond:
                self.steps += 1
                outs = [(r, self._advance_locked(r)) for r in batch if not r.finished]
            for r, out in outs:
                r.deliver(out)

    def _advance_locked(self, r: _Req) -> RequestOutput:
        eos = self.tokenizer.eos_token_id
        n = len(r.out_ids)
        tok = self._choose(r, r.script[n] if n < len(r.script) else eos, n)
        r.out_ids.append(tok)
        stops = r.params.stops if self.honour_stop else []
        reason: str | None = None
        stop_reason: str | None = None
        if tok == eos:
            reason = "stop"
        else:
            r.text += _VOCAB.piece(tok)
            hits = [(r.text.find(s), s) for s in stops if s in r.text]
            if hits:
                cut, stop_reason = min(hits)
                r.text = r.text[:cut]
                reason = "stop"
        if reason is None and (
            len(r.out_ids) >= r.max_tokens
            or len(r.prompt_ids) + len(r.out_ids) >= self.max_model_len
        ):
            reason = "length"
        if reason is not None:
            r.finished = True
            self._by_id.pop(r.request_id, None)
            self._running.remove(r)
            visible = r.text
        else:
            hold = max((len(s) for s in stops), default=1) - 1
            visible = r.text[: len(r.text) - hold] if hold else r.text
        return self._output(r, reason, stop_reason, visible)

    def _choose(self, r: _Req, scripted: int, n: int) -> int:
        """The fake model's step (module docstring): raw logits, ``logit_bias``, the
        greedy pick, and the position's log probabilities when asked for."""
        alts = _alternatives(r.prompt_ids, n, scripted)
        raw = {scripted: 10.0, **{t: 5.0 - 0.25 * i for i, t in enumerate(alts)}}
        biased = dict(raw)
        for t, b in (r.params.logit_bias or {}).items():
            biased[t] = biased.get(t, 0.0) + b
        best = max(biased, key=lambda t: (biased[t], t == scripted))
        if r.logprobs is not None:
            log_z = math.log(sum(math.exp(v) for v in raw.values()) + VOCAB_SIZE - len(raw))
            ranked = sorted(raw, key=lambda t: -raw[t])
            k = r.params.logprobs or 0
            step = {
                t: Logprob(raw[t] - log_z, i + 1, self.tokenizer.decode([t], True))
                for i, t in enumerate(ranked[:k])
            }
            if best not in step:
                rank = ranked.index(best) + 1 if best in raw else len(raw) + 1
                step[best] = Logprob(
                    raw.get(best, 0.0) - log_z, rank, self.tokenizer.decode([best], True)
                )
            r.logprobs.append(step)
        return best

    @staticmethod
    def _output(r: _Req, reason: str | None, stop_reason: str | None, text: str) -> RequestOutput:
        return RequestOutput(
            request_id=r.request_id,
            prompt=None,
            prompt_token_ids=list(r.prompt_ids),
            prompt_logprobs=None,
            outputs=[
                CompletionOutput(
                    index=0,
                    text=text,
                    token_ids=list(r.out_ids),
                    logprobs=list(r.logprobs) if r.logprobs is not None else None,
                    finish_reason=reason,
                    stop_reason=stop_reason,
                )
            ],
            finished=reason is not None,
        )


class _Collector:
    """vLLM's gauges for one fake engine (labels ``model_name`` and ``engine``)."""

    def __init__(self, engine: FakeAsyncLLM) -> None:
        self.engine = engine

    def collect(self) -> Iterator[GaugeMetricFamily]:
        e = self.engine
        st = e.stats()
        labels, values = ["model_name", "engine"], [e.model, "0"]
        for name, value in (
            ("vllm:num_requests_running", st.running),
            ("vllm:num_requests_waiting", st.waiting),
            ("vllm:kv_cache_usage_perc", st.kv_usage),
        ):
            g = GaugeMetricFamily(name, f"fake {name}", labels=labels)
            g.add_metric(values, value)
            yield g
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "fake cache config",
            labels=["block_size", "engine", "num_gpu_blocks"],
        )
        info.add_metric([str(e.block_size), "0", str(e.num_gpu_blocks)], 1.0)
        yield info


class _EngineFactory:
    def __init__(self, owner: FakeVllm) -> None:
        self._owner = owner

    def from_engine_args(self, engine_args: AsyncEngineArgs) -> FakeAsyncLLM:
        return self._owner.build(engine_args)


class FakeVllm:
    """Stands in for the ``vllm`` module (the names ``VllmGenerator`` uses).

    Args:
        registry: where each engine built publishes its gauges (as vLLM does in the
            process-wide prometheus registry); None publishes nothing.
        legacy_guided: expose vLLM < 0.11's ``GuidedDecodingParams`` instead of
            ``StructuredOutputsParams`` under ``sampling_params``.
        engine_kw: ``FakeAsyncLLM`` keywords (``max_num_seqs`` and ``max_model_len``
            come from the engine arguments when given there).

    Attributes:
        engine_args: the keyword arguments of the last ``AsyncEngineArgs`` built from.
        engines: every engine built.
    """

    SamplingParams = SamplingParams
    AsyncEngineArgs = AsyncEngineArgs

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        legacy_guided: bool = False,
        **engine_kw: Any,
    ) -> None:
        self.sampling_params = SimpleNamespace(
            **(
                {"GuidedDecodingParams": GuidedDecodingParams}
                if legacy_guided
                else {"StructuredOutputsParams": StructuredOutputsParams}
            )
        )
        self.registry = registry
        self.engine_kw = engine_kw
        self.engine_args: dict[str, Any] = {}
        self.engines: list[FakeAsyncLLM] = []
        self.AsyncLLMEngine = _EngineFactory(self)

    def build(self, engine_args: AsyncEngineArgs) -> FakeAsyncLLM:
        kw = dict(self.engine_kw)
        a = engine_args.kwargs
        self.engine_args = dict(a)
        for name in ("max_num_seqs", "max_model_len"):
            if a.get(name) is not None:
                kw[name] = a[name]
        served = a.get("served_model_name") or a["model"]
        kw.setdefault("model", served if isinstance(served, str) else served[0])
        engine = FakeAsyncLLM(**kw)
        if self.registry is not None:
            self.registry.register(engine.collector())
        self.engines.append(engine)
        return engine


# ---------------------------------------------------------------- the OpenAI server


@dataclass
class Fault:
    """A failure the fake server plays for the next generation request.

    ``status``: answer this HTTP status with vLLM's error body before streaming.
    ``cut_after``: stream this many content chunks, then drop the connection.
    ``error_after``: stream this many content chunks, then an error event
    (``error_status`` as its code) and ``[DONE]``.
    """

    status: int | None = None
    message: str = "injected failure"
    cut_after: int | None = None
    error_after: int | None = None
    error_status: int = 500


class _Cut(Exception):
    """Raised inside a streaming body: hypercorn drops the connection mid-stream."""


def _error_body(status: int, message: str) -> dict[str, Any]:
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


class FakeVllmServer:
    """vLLM's OpenAI-compatible server over a ``FakeAsyncLLM`` (module docstring).

    Attributes:
        base_url: ``http://127.0.0.1:<port>`` once served.
        bodies: JSON bodies of the generation requests received.
        headers: their headers (lower-cased names).
        faults: played in order, one per generation request.
        metrics_status / metrics_text: what ``/metrics`` answers (default: 200 and the
            live exposition); scrapes counts its calls.
        streams_open: streaming responses in progress.
    """

    def __init__(self, engine: FakeAsyncLLM) -> None:
        self.engine = engine
        self.base_url = ""
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.faults: list[Fault] = []
        self.metrics_status = 200
        self.metrics_text: str | None = None
        self.scrapes = 0
        self.streams_open = 0
        self._registry = CollectorRegistry(auto_describe=True)
        self._registry.register(engine.collector())
        self.app = Starlette(
            routes=[
                Route("/v1/completions", partial(self._generate, chat=False), methods=["POST"]),
                Route("/v1/chat/completions", partial(self._generate, chat=True), methods=["POST"]),
                Route("/v1/models", self._models),
                Route("/metrics", self._metrics),
            ]
        )

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.engine.model}]})

    async def _metrics(self, request: Request) -> Response:
        self.scrapes += 1
        if self.metrics_status != 200:
            return PlainTextResponse("metrics unavailable", status_code=self.metrics_status)
        if self.metrics_text is not None:
            return PlainTextResponse(self.metrics_text)
        return Response(generate_latest(self._registry), media_type="text/plain; version=0.0.4")

    def _fail(self, status: int, message: str) -> Response:
        return JSONResponse(_error_body(status, message), status_code=status)

    async def _generate(self, request: Request, *, chat: bool) -> Response:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        fault = self.faults.pop(0) if self.faults else None
        if fault is not None and fault.status is not None:
            return self._fail(fault.status, fault.message)
        if body.get("model") != self.engine.model:
            return self._fail(404, f"The model `{body.get('model')}` does not exist.")
        if body.get("n", 1) != 1:
            return self._fail(400, "n must be 1")
        tok = self.engine.tokenizer
        if chat:
            text = tok.apply_chat_template(
                body["messages"], add_generation_prompt=True, tokenize=False
            )
            assert isinstance(text, str)
            ids = tok.encode(text, add_special_tokens=False)
        else:
            ids = tok.encode(body["prompt"])
        if not ids:  # as vLLM: an empty prompt is a 400, not an engine crash
            return self._fail(400, "The decoder prompt cannot be empty")
        max_tokens = body.get("max_tokens")
        if max_tokens is not None and max_tokens < 1:
            return self._fail(400, f"max_tokens must be at least 1, got {max_tokens}.")
        if len(ids) >= self.engine.max_model_len:
            return self._fail(
                400,
                f"This model's maximum context length is {self.engine.max_model_len} tokens. "
                f"However, your request has {len(ids)} input tokens.",
            )
        stop = body.get("stop")
        sp = SamplingParams(
            n=1,
            max_tokens=max_tokens,
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            seed=body.get("seed"),
            stop=[stop] if isinstance(stop, str) else stop,
        )
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        gen = self.engine.generate({"prompt_token_ids": ids}, sp, rid)
        if not body.get("stream"):
            return await self._whole(gen, rid, chat, len(ids))
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(
            self._stream(gen, rid, chat, len(ids), usage, fault), media_type="text/event-stream"
        )

    async def _whole(
        self, gen: AsyncIterator[RequestOutput], rid: str, chat: bool, n_prompt: int
    ) -> Response:
        last: RequestOutput | None = None
        async for out in gen:
            last = out
        assert last is not None
        o = last.outputs[0]
        choice: dict[str, Any] = {"index": 0, "finish_reason": o.finish_reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": o.text}
        else:
            choice["text"] = o.text
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "model": self.engine.model,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": n_prompt,
                    "completion_tokens": len(o.token_ids),
                    "total_tokens": n_prompt + len(o.token_ids),
                },
            }
        )

    async def _stream(
        self,
        gen: AsyncIterator[RequestOutput],
        rid: str,
        chat: bool,
        n_prompt: int,
        include_usage: bool,
        fault: Fault | None,
    ) -> AsyncIterator[str]:
        obj = "chat.completion.chunk" if chat else "text_completion"
        model = self.engine.model

        def chunk(piece: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if chat:
                delta: dict[str, Any] = {"role": "assistant"} if role else {}
                if piece is not None:
                    delta["content"] = piece
                choice["delta"] = delta
            else:
                choice["text"] = piece or ""
            return {"id": rid, "object": obj, "model": model, "choices": [choice]}

        self.streams_open += 1
        sent, pieces, n_out = "", 0, 0
        try:
            if chat:
                yield _sse(chunk("", None, role=True))
            async for out in gen:
                o = out.outputs[0]
                piece, sent = o.text[len(sent) :], max(sent, o.text, key=len)
                n_out = len(o.token_ids)
                if piece:
                    if (
                        fault is not None
                        and fault.cut_after is not None
                        and pieces >= fault.cut_after
                    ):
                        raise _Cut("injected: connection dropped mid-stream")
                    if (
                        fault is not None
                        and fault.error_after is not None
                        and pieces >= fault.error_after
                    ):
                        yield _sse(_error_body(fault.error_status, fault.message))
                        yield "data: [DONE]\n\n"
                        return
                    pieces += 1
                    yield _sse(chunk(piece, None))
                if o.finish_reason is not None:
                    if o.finish_reason == "abort":
                        return
                    yield _sse(chunk(None if chat else "", o.finish_reason))
            if include_usage:
                yield _sse(
                    {
                        "id": rid,
                        "object": obj,
                        "model": model,
                        "choices": [],
                        "usage": {
                            "prompt_tokens": n_prompt,
                            "completion_tokens": n_out,
                            "total_tokens": n_prompt + n_out,
                        },
                    }
                )
            yield "data: [DONE]\n\n"
        finally:
            self.streams_open -= 1
            await gen.aclose()  # a client that went away aborts the request (as vLLM does)


@contextlib.contextmanager
def serve(server: FakeVllmServer) -> Iterator[FakeVllmServer]:
    """Serve ``server`` with hypercorn on a free loopback port, on an event loop in a
    thread of its own; sets ``server.base_url``."""
    with loopback_config(0.2) as (config, base_url), start_blocking_portal() as portal:
        server.base_url = base_url
        stop = portal.call(anyio.Event)
        done = portal.start_task_soon(
            partial(hypercorn_serve, server.app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
        )
        try:
            yield server
        finally:
            portal.call(stop.set)
            done.result(timeout=10)
