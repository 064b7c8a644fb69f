"""The three functions on a worker: encode, score, extract (docs/api.md §2-§4, §10).

``run_task`` turns one work item into its result map, through the model's
token-budget batcher so concurrent requests share engine calls. Items are grouped
by a config key and one engine call runs per group (docs/api.md §10):

- encode ``("encode", output types, options)``; payload ``(text, options, instruction)``:
  the engine call prepares the group's texts (templates, clipping, token counts:
  ``EncodeEngine.prepare``) in one go on its own thread, then encodes them, so no
  tokeniser runs on the event loop (docs/performance.md "Where the time goes");
- score ``("score", instruction, options)``; payload ``(pairs, options)``: every
  ``(query, doc)`` pair of the group goes to one engine call;
- extract ``("extract", labels, options)``; payload ``(text, labels, options)``.

``is_query`` is part of the encode key; instructions may differ inside a group (the
engine call prepares each instruction's texts together). A text the preparation
refuses (``truncate: false`` on an over-long input) fails its own item only
(``sie.engines.runtime.batching.ItemFailure``). Results (msgpack maps, numpy arrays inside):

- encode: ``{"dense": {dims, dtype, values}, "sparse": {dims, dtype, indices, values},
  "multivector": {token_dims, num_tokens, dtype, values}}`` for the requested types,
  after ``output_dtype`` (``sie.engines.encoders.quantize``);
- score: ``{"scores": [float, ...]}`` in candidate order;
- extract: ``{"entities": [...], "relations": [], "classifications": [], "objects": [],
  "data": {}}``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import anyio
import numpy as np
from opentelemetry import context as otel_context
from opentelemetry import propagate

from sie.core.errors import InvalidInput
from sie.core.registry import ModelEntry
from sie.core.wire import WorkItem
from sie.engines.base import Engine, is_encoder, is_extractor, is_scorer
from sie.engines.encoders.quantize import check_output_dtype, quantize, quantize_sparse
from sie.engines.runtime.batching import ItemFailure
from sie.engines.runtime.cache import LoadedModel
from sie.engines.runtime.oom import split_on_oom

__all__ = ["TaskOutcome", "engine_batch_fn", "freeze", "run_task"]

#: Characters per token of the batch cost estimate of an encode text (its exact count is
#: known only once the engine call has tokenised it).
CHARS_PER_TOKEN = 4

#: Candidates per batcher submission of a score request.
SCORE_CHUNK_PAIRS = 32

#: Option keys the worker consumes itself; they never reach an engine or a batch key.
_WORKER_OPTIONS = ("output_dtype", "output_types", "profile", "is_query", "instruction")


@dataclass(slots=True)
class TaskOutcome:
    """One work item's result map and its timings (milliseconds) and token count."""

    result: dict[str, Any]
    inference_ms: float
    tokenization_ms: float
    tokens: int


def freeze(options: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A hashable, order-independent batch-group key for runtime options."""

    def f(v: Any) -> Any:
        if isinstance(v, dict):
            return tuple(sorted(((str(k), f(x)) for k, x in v.items()), key=repr))
        if isinstance(v, list | tuple):
            return tuple(f(x) for x in v)
        if isinstance(v, np.ndarray):
            return ("ndarray", v.dtype.str, v.shape, v.tobytes())
        try:
            hash(v)
        except TypeError:
            return repr(v)
        return v

    return tuple(sorted(((str(k), f(v)) for k, v in options.items()), key=repr))


def engine_batch_fn(engine: Engine) -> Callable[[Hashable, Sequence[Any]], list[Any]]:
    """The batcher's ``run_batch`` for one engine: one engine call per config group.

    ``key`` is the batch group (``("encode", output_types, options)``, ``("score",
    instruction, options)``, ``("extract", labels, options)``); ``payloads`` what
    ``_encode`` / ``_score`` / ``_extract`` submitted for it.

    An engine that runs out of memory gets each half of the batch again
    (``sie.engines.runtime.oom``).
    """

    def run(key: Hashable, payloads: Sequence[Any]) -> list[Any]:
        kind = cast(tuple[Any, ...], key)[0]
        if kind == "encode" and is_encoder(engine):
            return _encode_group(engine, cast(tuple[Any, ...], key)[1], payloads)
        if kind == "score" and is_scorer(engine):
            instruction = cast(tuple[Any, ...], key)[1]
            pairs = [pair for p in payloads for pair in p[0]]
            scores = engine.score(pairs, instruction=instruction, options=payloads[0][1])
            out_scores: list[list[float]] = []
            at = 0
            for p in payloads:
                out_scores.append([float(x) for x in scores[at : at + len(p[0])]])
                at += len(p[0])
            return out_scores
        if kind == "extract" and is_extractor(engine):
            return list(
                engine.extract(
                    [p[0] for p in payloads], labels=payloads[0][1], options=payloads[0][2]
                )
            )
        raise InvalidInput(f"unknown task {kind!r}", field="operation")

    return split_on_oom(run)


@dataclass(slots=True)
class Encoded:
    """One encode item's outputs (``{type: value}``), its token count after truncation
    and the seconds its group's preparation took."""

    outputs: dict[str, Any]
    tokens: int
    prepare_s: float


def _encode_group(
    engine: Any, output_types: tuple[str, ...], payloads: Sequence[Any]
) -> list[Encoded | ItemFailure]:
    """Prepare (``EncodeEngine.prepare``, one call per instruction) and encode one
    batch group, on the engine's thread. A preparation that refuses a text is retried
    text by text so that only the refused items fail."""
    options = payloads[0][1]  # the same for the whole group: the key freezes them
    is_query = bool(options.get("is_query", False))
    t0 = time.monotonic()
    prepared: list[tuple[str, int] | InvalidInput] = [("", 0)] * len(payloads)
    by_instruction: dict[str | None, list[int]] = {}
    for i, p in enumerate(payloads):
        by_instruction.setdefault(p[2], []).append(i)
    for instruction, idx in by_instruction.items():

        def prep(texts: list[str], instruction: str | None = instruction) -> Any:
            return engine.prepare(
                texts, instruction=instruction, is_query=is_query, options=options
            )

        try:
            texts, counts = prep([payloads[i][0] for i in idx])
            for j, i in enumerate(idx):
                prepared[i] = (texts[j], counts[j])
        except InvalidInput:
            for i in idx:
                try:
                    one, count = prep([payloads[i][0]])
                    prepared[i] = (one[0], count[0])
                except InvalidInput as exc:
                    prepared[i] = exc
    prepare_s = time.monotonic() - t0
    results: list[Encoded | ItemFailure] = [
        ItemFailure(p) if isinstance(p, InvalidInput) else Encoded({}, p[1], prepare_s)
        for p in prepared
    ]
    ok = [i for i, p in enumerate(prepared) if not isinstance(p, InvalidInput)]
    if ok:
        ready = cast(list[tuple[str, int]], [prepared[i] for i in ok])
        out = engine.encode(
            [t for t, _ in ready],
            output_types=output_types,
            options=options,
            lengths=[n for _, n in ready],
        )
        for j, i in enumerate(ok):
            cast(Encoded, results[i]).outputs = {k: v[j] for k, v in out.items()}
    return results


def _options(item: WorkItem, entry: ModelEntry) -> dict[str, Any]:
    """Profile runtime options overlaid by the request's (docs/api.md §2 precedence)."""
    return {**entry.profile.runtime, **(item.options if isinstance(item.options, dict) else {})}


def _engine_options(options: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k not in _WORKER_OPTIONS}


def _text(item: Mapping[str, Any] | None, where: str) -> str:
    text = item.get("text") if isinstance(item, dict) else None
    if not isinstance(text, str):
        raise InvalidInput(f"{where}.text must be a string", field=f"{where}.text")
    return text


def trace_context(item: WorkItem) -> otel_context.Context:
    """The W3C trace context ``item`` carries (empty when none)."""
    carrier = {k: v for k in ("traceparent", "tracestate") if (v := getattr(item, k))}
    return propagate.extract(carrier)


async def run_task(item: WorkItem, entry: ModelEntry, loaded: LoadedModel) -> TaskOutcome:
    """Run ``item`` on ``loaded`` (a ``LoadedModel``: engine + batcher).

    Raises:
        InvalidInput: the model lacks the task, or the item is malformed (names the field).
        InferenceError: the engine failed.
    """
    # the item's trace context is current while it is batched: its batch's
    # worker.run_batch span joins the gateway's trace (architecture §15.1)
    token = otel_context.attach(trace_context(item))
    try:
        if item.operation == "encode":
            return await _encode(item, entry, loaded)
        if item.operation == "score":
            return await _score(item, entry, loaded)
        if item.operation == "extract":
            return await _extract(item, entry, loaded)
    finally:
        otel_context.detach(token)
    raise InvalidInput(
        f"operation {item.operation!r} is not supported by this worker", field="operation"
    )


async def _encode(item: WorkItem, entry: ModelEntry, loaded: LoadedModel) -> TaskOutcome:
    engine = loaded.engine
    if entry.config.tasks.encode is None or not is_encoder(engine):
        raise InvalidInput(f"model {item.model_id!r} does not support encode", field="model")
    text = _text(item.item, f"items[{item.item_index}]")
    options = _options(item, entry)
    wanted = item.output_types or options.get("output_types") or ["dense"]
    if not isinstance(wanted, list) or not all(isinstance(t, str) for t in wanted):
        raise InvalidInput("output_types must be a list of strings", field="params.output_types")
    output_types = tuple(sorted(set(wanted)))
    unsupported = [
        t for t in output_types if t not in engine.outputs or t not in entry.config.outputs
    ]
    if unsupported:
        raise InvalidInput(
            f"model {item.model_id!r} does not produce output type(s) {unsupported}",
            field="params.output_types",
        )
    dtype = check_output_dtype(options.get("output_dtype", "float32"))
    instruction = item.instruction or options.get("instruction")
    is_query = bool(item.is_query if item.is_query is not None else options.get("is_query", False))
    # is_query stays visible to the engine (SPLADE encodes queries and documents
    # differently) and splits batch groups (docs/api.md §10 key)
    engine_options = {**_engine_options(options), "is_query": is_query}
    key = ("encode", output_types, freeze(engine_options))
    # a cost estimate for the batch budget; the engine call counts the tokens
    cost = min(
        (len(text) + len(instruction or "")) // CHARS_PER_TOKEN + 2, loaded.batcher.max_batch_tokens
    )
    try:
        encoded, stats = await loaded.batcher.submit(
            (text, engine_options, instruction), cost, key, item.request_id
        )
    except InvalidInput as exc:  # e.g. truncate: false and too long: name the item
        if exc.fields.get("field") == "text":
            where = f"items[{item.item_index}].text"
            exc.fields["field"], exc.message = where, f"{where}: {exc.message}"
        raise
    vectors, tokens = encoded.outputs, encoded.tokens
    tokenization_ms = encoded.prepare_s * 1000.0
    dims = entry.config.dims
    blob: dict[str, Any] = {}
    for t in output_types:
        v = vectors[t]
        if t == "dense":
            values, label = quantize(v, dtype)
            blob[t] = {"dims": int(dims.get(t, v.shape[-1])), "dtype": label, "values": values}
        elif t == "multivector":
            values, label = quantize(v, dtype)  # per token
            blob[t] = {
                "token_dims": int(v.shape[-1]),
                "num_tokens": int(v.shape[0]),
                "dtype": label,
                "values": values,
            }
        else:  # sparse: (indices, values), indices ascending
            indices, weights = v
            values, label = quantize_sparse(weights, dtype)
            blob[t] = {
                "dims": dims.get(t) or getattr(engine, "sparse_dim", None),
                "dtype": label,
                "indices": np.asarray(indices, dtype=np.int32),
                "values": values,
            }
    inference_ms = max(0.0, stats.inference_s * 1000.0 - tokenization_ms)  # the call prepared too
    return TaskOutcome(blob, inference_ms, tokenization_ms, tokens)


async def _score(item: WorkItem, entry: ModelEntry, loaded: LoadedModel) -> TaskOutcome:
    engine = loaded.engine
    if entry.config.tasks.score is None or not is_scorer(engine):
        raise InvalidInput(f"model {item.model_id!r} does not support scoring", field="model")
    query = _text(item.query_item, "query")
    candidates = item.score_items
    if not isinstance(candidates, list) or not candidates:
        raise InvalidInput("items: at least one item to score is required", field="items")
    docs = [_text(c, f"items[{i}]") for i, c in enumerate(candidates)]
    options = _options(item, entry)
    instruction = item.instruction or options.get("instruction")
    engine_options = _engine_options(options)
    key = ("score", instruction, freeze(engine_options))
    # The candidates go to the batcher in chunks, not as one payload: other requests'
    # work interleaves with a huge one, and a cancelled request (work_cancel, timeout)
    # stops after the chunk that is running instead of after all of them.
    chunks = [docs[i : i + SCORE_CHUNK_PAIRS] for i in range(0, len(docs), SCORE_CHUNK_PAIRS)]
    results: list[list[float]] = [[] for _ in chunks]
    inference_s = 0.0
    cost = 0

    async def one(i: int, chunk: list[str]) -> None:
        nonlocal inference_s, cost
        # cost ~ tokens: characters / 4 per pair (docs/api.md §10 scores by characters)
        c = sum(max(1, (len(query) + len(d)) // 4) for d in chunk)
        pairs = [(query, d) for d in chunk]
        results[i], stats = await loaded.batcher.submit(
            (pairs, engine_options), c, key, item.request_id
        )
        inference_s += stats.inference_s
        cost += c

    if len(chunks) == 1:
        await one(0, chunks[0])
    else:
        try:
            async with anyio.create_task_group() as tg:
                for i, chunk in enumerate(chunks):
                    tg.start_soon(one, i, chunk)
        except BaseExceptionGroup as group:  # one chunk's error is the request's error
            raise _first_error(group) from None
    scores = [x for r in results for x in r]
    return TaskOutcome({"scores": scores}, inference_s * 1000.0, 0.0, cost)


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf of an exception group (the engine error a chunk raised)."""
    leaf: BaseException = group
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    return leaf


async def _extract(item: WorkItem, entry: ModelEntry, loaded: LoadedModel) -> TaskOutcome:
    engine = loaded.engine
    if entry.config.tasks.extract is None or not is_extractor(engine):
        raise InvalidInput(f"model {item.model_id!r} does not support extraction", field="model")
    text = _text(item.item, f"items[{item.item_index}]")
    labels = item.labels
    if labels is not None and (
        not isinstance(labels, list) or not all(isinstance(x, str) and x for x in labels)
    ):
        raise InvalidInput(
            "params.labels must be a list of non-empty strings", field="params.labels"
        )
    options = _engine_options(_options(item, entry))
    label_key = tuple(sorted(set(labels))) if labels is not None else None
    cost = max(1, len(text) // 4)
    key = ("extract", label_key, freeze(options))
    entities, stats = await loaded.batcher.submit(
        (text, labels, options), cost, key, item.request_id
    )
    blob = {
        "entities": entities,
        "relations": [],
        "classifications": [],
        "objects": [],
        "data": {},
    }
    return TaskOutcome(blob, stats.inference_s * 1000.0, 0.0, cost)
