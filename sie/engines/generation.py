"""The generation engine port: what a worker needs from a text-generation engine.

Unlike the task engines of ``sie.engines.base`` (synchronous, one inference thread),
a generation engine schedules concurrent requests itself (continuous batching), so
its request path is async: ``generate`` is an async iterator of ``GenerationDelta``
that never blocks the event loop; ``abort`` frees a request's slot; ``state`` reports
the scheduler's own numbers (running, waiting, KV-cache usage) for the admission gate
(shared/spec/admission-gate.md). ``load``/``unload`` are synchronous and heavy (call
them off the event loop); the constructor ``(config, profile, device)`` does no I/O.

Also here, pure and engine-independent: request validation (``validate_request``,
``InvalidInput`` naming the field; an engine passes the optional ``FEATURES`` it
implements, and a request asking for one it lacks is refused naming the OpenAI
parameter, docs/api.md §5.1) and ``StopMatcher``, which keeps stop strings,
and any prefix of one that then matches, out of the streamed text.

No torch import here: the vLLM and upstream-proxy engines share this module.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeGuard, runtime_checkable

from sie.core.admission import EngineState
from sie.core.errors import InvalidInput
from sie.engines.base import implements
from sie.engines.stop import StopMatcher

__all__ = [
    "FEATURES",
    "EngineState",
    "FinishReason",
    "GenerationDelta",
    "GenerationEngine",
    "GenerationRequest",
    "SamplingParams",
    "StopMatcher",
    "check_logit_bias",
    "is_generator",
    "logprob_entry",
    "prompt_token_ids",
    "validate_request",
    "validate_sampling",
]

FinishReason = Literal["stop", "length"]

#: Seeds accepted (what ``torch.Generator.manual_seed`` takes).
_SEED_MIN = -(2**63)
_SEED_MAX = 2**64 - 1

#: Optional request features an engine may implement (its ``features`` attribute), each
#: with the OpenAI parameter a refusal names (docs/api.md §5.1).
FEATURES: dict[str, str] = {
    "logprobs": "logprobs",
    "logit_bias": "logit_bias",
    "penalties": "presence_penalty",
    "json_object": "response_format",
}
#: Alternatives per token ``logprobs`` may ask for (OpenAI's ``top_logprobs`` bound;
#: vLLM's default ``max_logprobs``).
MAX_TOP_LOGPROBS = 20
#: A log probability below this is reported as this (JSON has no -inf; OpenAI and vLLM
#: floor at the same value).
MIN_LOGPROB = -9999.0


@dataclass
class SamplingParams:
    """How to sample (OpenAI semantics; docs/api.md §5.1).

    ``max_tokens``: completion tokens at most; ``None`` = up to the model window.
    ``temperature`` 0 is greedy. ``top_p`` in (0, 1]. ``seed`` makes sampling
    reproducible (same engine, same weights). ``stop``: strings that end the
    completion; none of them, nor any part of one that matched, is ever emitted.
    ``presence_penalty`` / ``frequency_penalty`` in [-2, 2]: subtracted from the logit
    of every token already in the completion (once / per occurrence; the prompt does
    not count, as in vLLM). ``logit_bias``: token id -> value in [-100, 100] added to
    that token's logit before sampling. ``logprobs``: None, or how many most likely
    alternatives (0..20) to report with each completion token's own log probability
    (from the model's raw distribution, before biases, penalties and temperature, as
    vLLM reports them). ``response_format`` ``"json_object"``: the completion is
    constrained to one JSON object and ends when it closes.
    """

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None
    response_format: Literal["text", "json_object"] = "text"

    def features(self) -> list[str]:
        """The optional ``FEATURES`` this request uses."""
        used = []
        if self.logprobs is not None:
            used.append("logprobs")
        if self.logit_bias:
            used.append("logit_bias")
        if self.presence_penalty or self.frequency_penalty:
            used.append("penalties")
        if self.response_format == "json_object":
            used.append("json_object")
        return used


@dataclass
class GenerationRequest:
    """One generation: exactly one of ``prompt`` (raw completion) or ``messages``
    (chat, ``[{"role": ..., "content": ...}, ...]``, rendered by the model's chat
    template with the generation prompt appended)."""

    request_id: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)


@dataclass(frozen=True)
class GenerationDelta:
    """A piece of a streamed completion.

    ``text``: new text (may be empty on the final delta; never contains any part of a
    stop string). ``num_tokens``: completion tokens this delta accounts for (text held
    back by the stop matcher or by incomplete UTF-8 is reported with a later delta),
    so the deltas' ``num_tokens`` add up to ``completion_tokens``.
    The final delta, and only it, has ``finish_reason`` (``"stop"``: EOS or a stop
    string, or a JSON object closed; ``"length"``: ``max_tokens`` or the model window)
    and the usage: ``prompt_tokens`` (after the chat template) and ``completion_tokens``.
    ``logprobs`` (only when the request asked for them): one ``logprob_entry`` per
    completion token this delta accounts for, EOS excluded, in order.
    """

    text: str
    num_tokens: int = 0
    finish_reason: FinishReason | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    logprobs: list[dict[str, Any]] | None = None


@runtime_checkable
class GenerationEngine(Protocol):
    """A text-generation engine (transformers, vLLM, an upstream OpenAI server)."""

    def load(self) -> None:
        """Load weights / connect; heavy, synchronous (run it off the event loop).

        Raises:
            ModelLoadFailed: not loadable (``error_class``, ``permanent``).
        """
        ...

    def unload(self) -> None:
        """Stop scheduling, fail in-flight requests, release memory; idempotent."""
        ...

    def check_request(self, req: GenerationRequest) -> None:
        """Validate ``req`` before the worker accepts it (synchronous; may tokenise,
        so the worker calls it off the event loop): its fields and, where the engine
        can tell, the prompt against the chat template and the window. The same
        errors ``generate`` would raise first, reported before any chunk is sent.

        Raises:
            InvalidInput: naming the field.
        """
        ...

    def generate(self, req: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        """Stream the completion of ``req`` (an ``async def`` generator).

        Ends after the delta carrying ``finish_reason``, or without one when the
        request was aborted. Closing the iterator early (client gone) aborts the
        request in the engine.

        Raises:
            InvalidInput: a bad request (naming the field), raised on first iteration.
            InferenceError: the engine failed mid-stream, or is not loaded.
        """
        ...

    async def abort(self, request_id: str) -> None:
        """Stop ``request_id`` and free its slot (a no-op for unknown ids)."""
        ...

    def state(self) -> EngineState:
        """The scheduler's current numbers; cheap, thread-safe."""
        ...


def is_generator(engine: object) -> TypeGuard[GenerationEngine]:
    """``engine`` implements ``GenerationEngine`` (decided once per class:
    ``sie.engines.base.implements``)."""
    return implements(engine, GenerationEngine)


def validate_sampling(sp: SamplingParams) -> None:
    """Check sampling parameters.

    Raises:
        InvalidInput: naming the field (``max_tokens``, ``temperature``, ``top_p``,
            ``seed``, ``stop``).
    """
    mt = sp.max_tokens
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
        raise InvalidInput(
            f"max_tokens must be a positive integer or null, got {mt!r}", field="max_tokens"
        )
    t = sp.temperature
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
        raise InvalidInput(
            f"temperature must be a finite number >= 0, got {t!r}", field="temperature"
        )
    p = sp.top_p
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 < p <= 1.0:
        raise InvalidInput(f"top_p must be in (0, 1], got {p!r}", field="top_p")
    s = sp.seed
    if s is not None and (
        isinstance(s, bool) or not isinstance(s, int) or not _SEED_MIN <= s <= _SEED_MAX
    ):
        raise InvalidInput(f"seed must be a 64-bit integer or null, got {s!r}", field="seed")
    if not isinstance(sp.stop, list | tuple) or not all(isinstance(x, str) and x for x in sp.stop):
        raise InvalidInput("stop must be a list of non-empty strings", field="stop")
    for name in ("presence_penalty", "frequency_penalty"):
        v = getattr(sp, name)
        if isinstance(v, bool) or not isinstance(v, int | float) or not -2.0 <= v <= 2.0:
            raise InvalidInput(f"{name} must be a number in [-2, 2], got {v!r}", field=name)
    lb = sp.logit_bias
    if not isinstance(lb, dict):
        raise InvalidInput("logit_bias must map token ids to numbers", field="logit_bias")
    for tid, bias in lb.items():
        if isinstance(tid, bool) or not isinstance(tid, int) or tid < 0:
            raise InvalidInput(
                f"logit_bias: {tid!r} is not a token id (a non-negative integer)",
                field="logit_bias",
            )
        if (
            isinstance(bias, bool)
            or not isinstance(bias, int | float)
            or not -100.0 <= bias <= 100.0
        ):
            raise InvalidInput(
                f"logit_bias: the bias of token {tid} must be a number in [-100, 100], "
                f"got {bias!r}",
                field="logit_bias",
            )
    k = sp.logprobs
    if k is not None and (
        isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_TOP_LOGPROBS
    ):
        raise InvalidInput(
            f"logprobs: alternatives per token must be 0..{MAX_TOP_LOGPROBS}, got {k!r}",
            field="logprobs",
        )
    if sp.response_format not in ("text", "json_object"):
        raise InvalidInput(
            f"response_format must be text or json_object, got {sp.response_format!r}",
            field="response_format",
        )


def check_features(sp: SamplingParams, supported: frozenset[str], engine: str) -> None:
    """Refuse a request that uses an optional feature the engine does not implement.

    Raises:
        InvalidInput: naming the OpenAI parameter (``FEATURES``; docs/api.md §5.1).
    """
    for feature in sp.features():
        if feature not in supported:
            param = FEATURES[feature]
            if feature == "penalties" and not sp.presence_penalty:
                param = "frequency_penalty"
            raise InvalidInput(
                f"{param}: not supported by this model's engine ({engine}); see docs/api.md §5.1",
                field=param,
            )


def check_logit_bias(sp: SamplingParams, vocab_size: int) -> None:
    """Every ``logit_bias`` key is a token id of the model's vocabulary (``0 ..
    vocab_size - 1``).

    Raises:
        InvalidInput: naming ``logit_bias`` and the first id outside the vocabulary.
    """
    bad = sorted(t for t in sp.logit_bias if t >= vocab_size)
    if bad:
        raise InvalidInput(
            f"logit_bias: token id {bad[0]} is not in the model's vocabulary "
            f"(ids 0..{vocab_size - 1})",
            field="logit_bias",
        )


def logprob_entry(
    token: bytes, logprob: float, top: Sequence[tuple[bytes, float]] = ()
) -> dict[str, Any]:
    """One completion token's log probability in OpenAI's chat shape: ``{"token",
    "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...]}``.
    ``token``: the token's UTF-8 bytes (a token that is part of a character is
    shown with replacement characters, its ``bytes`` exact); log probabilities are
    floored at ``MIN_LOGPROB``."""

    def one(b: bytes, lp: float) -> dict[str, Any]:
        return {
            "token": b.decode("utf-8", "replace"),
            "logprob": MIN_LOGPROB if math.isnan(lp) else min(0.0, max(float(lp), MIN_LOGPROB)),
            "bytes": list(b),
        }

    entry = one(token, logprob)
    entry["top_logprobs"] = [one(b, lp) for b, lp in top]
    return entry


def validate_request(
    req: GenerationRequest, features: frozenset[str] | None = None, engine: str = "this engine"
) -> None:
    """Check a request: its id, exactly one of prompt / messages, and its sampling;
    with ``features`` (those of the engine named ``engine``), also that it uses no
    other optional feature (``check_features``).

    Raises:
        InvalidInput: naming the field (``request_id``, ``prompt``, ``messages``,
            or a sampling field).
    """
    if not isinstance(req.request_id, str) or not req.request_id:
        raise InvalidInput("request_id must be a non-empty string", field="request_id")
    if (req.prompt is None) == (req.messages is None):
        raise InvalidInput(
            "exactly one of prompt or messages is required, got "
            + ("both" if req.prompt is not None else "neither"),
            field="prompt" if req.prompt is not None else "messages",
        )
    if req.prompt is not None and not isinstance(req.prompt, str):
        raise InvalidInput("prompt must be a string", field="prompt")
    if req.messages is not None:
        if not isinstance(req.messages, list) or not req.messages:
            raise InvalidInput("messages must be a non-empty list", field="messages")
        for i, m in enumerate(req.messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise InvalidInput(
                    f"messages[{i}] must be an object with a string 'role'",
                    field=f"messages[{i}]",
                )
            content = m.get("content")
            if content is not None and not isinstance(content, str | list):
                raise InvalidInput(
                    f"messages[{i}].content must be a string, a list of parts or null",
                    field=f"messages[{i}].content",
                )
    validate_sampling(req.sampling)
    if features is not None:
        check_features(req.sampling, features, engine)


_LONGEST: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def longest_token_chars(tok: Any) -> int:
    """The most characters one token of ``tok``'s vocabulary stands for (computed once
    per tokenizer; 64 when the vocabulary cannot be read)."""
    try:
        return _LONGEST[tok]
    except (KeyError, TypeError):
        pass
    try:
        longest = max(8, max(len(t) for t in tok.get_vocab()))
    except Exception:  # a tokenizer without a readable vocabulary
        longest = 64
    try:
        _LONGEST[tok] = longest
    except TypeError:  # not weakly referenceable: computed each time
        pass
    return longest


def _check_chars(text: str, limit: int, window: int, where: str) -> None:
    """A prompt of more characters than ``window`` tokens can hold is refused before
    it is tokenised (tokenising megabytes would hold the worker for seconds).

    Raises:
        InvalidInput: naming ``where``.
    """
    if len(text) > limit:
        raise InvalidInput(
            f"{where} is {len(text)} characters: more than the model's {window}-token "
            "window can hold",
            field=where,
        )


def prompt_token_ids(tok: Any, req: GenerationRequest, *, sie_id: str, window: int) -> list[int]:
    """The token ids a model reads for ``req``: chat ``messages`` through the
    tokenizer's chat template with the generation prompt appended (no extra special
    tokens), or the raw ``prompt`` with the tokenizer's default special tokens.

    ``tok``: a Hugging Face tokenizer (``apply_chat_template``, ``encode``);
    ``window``: the model's context length in tokens.

    Raises:
        InvalidInput: no chat template, a conversation the template rejects, an empty
            prompt, or one that leaves no room for a completion token in ``window``
            (field ``messages`` or ``prompt``).
    """
    limit = window * longest_token_chars(tok)  # more characters can never fit: no tokenising
    if req.messages is not None:
        if not getattr(tok, "chat_template", None):
            raise InvalidInput(
                f"model {sie_id!r} has no chat template; send a prompt", field="messages"
            )
        try:
            text = tok.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # jinja raises TemplateError for bad conversations
            raise InvalidInput(
                f"messages do not fit the chat template: {exc}", field="messages"
            ) from exc
        where = "messages"
        _check_chars(text, limit, window, where)
        ids = list(tok.encode(text, add_special_tokens=False))
    else:
        where = "prompt"
        _check_chars(req.prompt or "", limit, window, where)
        ids = list(tok.encode(req.prompt or ""))
    if not ids:
        raise InvalidInput(f"{where} is empty", field=where)
    if len(ids) >= window:
        raise InvalidInput(
            f"{where} is {len(ids)} tokens; the model window is {window} "
            "(prompt plus at least one completion token)",
            field=where,
        )
    return ids
