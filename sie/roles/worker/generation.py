"""Generation on a worker (architecture §2 OpenAI surfaces, §8.2 worker-direct
dispatch, §15.1): parse the request body the gateway forwarded untouched, run it on
the model's generation engine, and stream ``GenerationChunk``s to the request's inbox.

The gateway reads only ``model`` (and ``stream``) from the body; everything else is
parsed and validated here, so a bad field is reported as the first chunk: ``seq`` 0
is either the acceptance (empty text) or the error (``done`` with ``error_code`` and
the field). Then one chunk per engine delta, in order, the last with ``done``,
``finish_reason`` and the token counts; an engine failure mid-stream ends the stream
with an error chunk, never silently.

Routes (``WorkItem.item["route"]``): ``chat`` (``/v1/chat/completions``: ``messages``),
``completions`` (``/v1/completions``: ``prompt``) and ``native``
(``/v1/generate/{model}``: ``prompt`` or ``messages``). The bodies are parsed strictly
by ``sie.engines.openai_params`` (docs/api.md §5.1: every parameter honoured or refused);
``echo`` sends the prompt as the first text chunk (no tokens), and a delta's log
probabilities travel on its chunk.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from sie.core.errors import InferenceError, InvalidInput, SieError
from sie.core.wire import GenerationChunk, WorkItem
from sie.engines.base import Engine
from sie.engines.generation import is_generator
from sie.engines.openai_params import parse_generation

__all__ = ["parse_generation", "run_generation"]

log = logging.getLogger(__name__)


async def run_generation(
    engine: Engine,
    item: WorkItem,
    publish: Callable[[GenerationChunk], Awaitable[None]],
    worker_id: str,
) -> None:
    """Parse ``item``, run it on ``engine`` and publish its chunks (see module doc).

    Cancellation (``work_cancel``, a dead gateway) closes the engine's iterator,
    which aborts the request and frees its slot.
    """
    rid = item.request_id

    def fail(seq: int, exc: SieError) -> GenerationChunk:
        field = exc.fields.get("field")
        return GenerationChunk(
            request_id=rid,
            seq=seq,
            done=True,
            error=exc.message,
            error_code=exc.code,
            error_field=field if isinstance(field, str) else None,
            worker_id=worker_id,
        )

    data = item.item if isinstance(item.item, dict) else {}
    body, route = data.get("body"), data.get("route")
    try:
        if not isinstance(body, bytes) or not isinstance(route, str):
            raise InvalidInput("generation work item without a body", field="body")
        if not is_generator(engine):
            raise InvalidInput(f"model {item.model_id!r} does not generate text", field="model")
        parsed = parse_generation(route, body, rid)
        req = parsed.request
        # e.g. a prompt over the window, a feature the engine lacks, a logit_bias id
        # outside the vocabulary: a 400 before acceptance, not a broken stream
        await anyio.to_thread.run_sync(engine.check_request, req)
    except SieError as exc:
        await publish(fail(0, exc))
        return
    except Exception as exc:  # a parser or engine bug: a 500 for this request, the worker lives
        log.exception("generation %s: cannot parse or check the request", rid)
        await publish(fail(0, InferenceError(f"generation failed: {exc}")))
        return
    await publish(GenerationChunk(request_id=rid, seq=0, worker_id=worker_id))
    seq = 0
    try:
        if parsed.echo:
            seq += 1
            await publish(
                GenerationChunk(request_id=rid, seq=seq, text=parsed.echo, worker_id=worker_id)
            )
        async for delta in engine.generate(req):
            seq += 1
            await publish(
                GenerationChunk(
                    request_id=rid,
                    seq=seq,
                    text=delta.text,
                    done=delta.finish_reason is not None,
                    finish_reason=delta.finish_reason,
                    prompt_tokens=delta.prompt_tokens,
                    completion_tokens=delta.completion_tokens,
                    logprobs=delta.logprobs,
                    worker_id=worker_id,
                )
            )
    except SieError as exc:
        await publish(fail(seq + 1, exc))
    except Exception as exc:  # an engine bug must end the stream with an error, not hang it
        await publish(fail(seq + 1, SieError(f"generation failed: {exc}")))
