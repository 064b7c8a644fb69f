"""Close-match hints for an unknown model id (docs/api.md §11): the 404 names the known
ids nearest to what was asked, so a typo or a missing organisation prefix is one glance
away from its fix.

``model_not_found("all-MiniLM-L6-v2", known)`` is a ``ModelNotFound`` whose message ends
"did you mean 'sentence-transformers/all-MiniLM-L6-v2'?" and whose ``suggestions`` field
lists up to ``MAX_SUGGESTIONS`` ids (``[]`` when nothing is close). For an unknown
profile of a known model (``sentence-transformers/all-MiniLM-L6-v2:nosuch``) it lists
the model and all its profile ids instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from difflib import SequenceMatcher
from itertools import islice

from sie.core.echo import echo
from sie.core.errors import ModelNotFound

__all__ = [
    "CUTOFF",
    "MAX_CANDIDATES",
    "MAX_PROFILE_SUGGESTIONS",
    "MAX_SUGGESTIONS",
    "close_ids",
    "model_not_found",
]

#: Most ids one 404 suggests.
MAX_SUGGESTIONS = 3
#: Most ids a 404 for an unknown profile of a known model lists (the model and its
#: ``model:profile`` ids).
MAX_PROFILE_SUGGESTIONS = 16
#: Least ``difflib`` similarity (0..1) for an id to be suggested.
CUTOFF = 0.6
#: Most known ids one 404 compares (in the order given): bounds the work a stream of
#: mistyped ids can cost the event loop (tens of ms at worst, 1,000 ids all alike).
MAX_CANDIDATES = 1000
#: Longer queries get no suggestions: no valid id is this long (a model id is at most
#: 128 characters, ``model:profile`` 193), and matching costs grow with the length.
_MAX_QUERY_CHARS = 256


def _tail(model_id: str) -> str:
    return model_id.rpartition("/")[2]


def _similarity(m: SequenceMatcher[str], candidate: str) -> float:
    """``m``'s ratio against ``candidate`` (``m`` holds the query as its second
    sequence, whose index difflib builds once), or 0 below ``CUTOFF``."""
    m.set_seq1(candidate)
    if m.real_quick_ratio() < CUTOFF or m.quick_ratio() < CUTOFF:  # cheap upper bounds first
        return 0.0
    return m.ratio()


def close_ids(query: str, known: Iterable[str], n: int = MAX_SUGGESTIONS) -> list[str]:
    """The ``n`` ids of ``known`` most like ``query``, best first (ties by id).

    Case-insensitive; an id also matches on its name without the organisation
    (``all-minilm-l6-v2`` finds ``sentence-transformers/all-MiniLM-L6-v2``). Empty for
    an empty or over-long query. Only the first ``MAX_CANDIDATES`` of ``known`` are
    compared.
    """
    if not query or len(query) > _MAX_QUERY_CHARS:
        return []
    whole = SequenceMatcher(None)
    whole.set_seq2(query.lower())
    tail = SequenceMatcher(None)
    tail.set_seq2(_tail(query.lower()))
    scored: list[tuple[float, str]] = []
    for model_id in islice(known, MAX_CANDIDATES):
        k = model_id.lower()
        best = max(_similarity(whole, k), _similarity(tail, _tail(k)))
        if best >= CUTOFF:
            scored.append((-best, model_id))
    return [model_id for _, model_id in sorted(scored)[:n]]


def _profiles_of(model_id: str, known: list[str]) -> list[str] | None:
    """For ``base:profile`` whose base is known: the base and its routable
    ``base:profile`` ids (at most ``MAX_PROFILE_SUGGESTIONS``); else None."""
    base, sep, _ = model_id.partition(":")
    if not sep or base not in known:
        return None
    ids = [base, *sorted(k for k in known if k.startswith(base + ":"))]
    close = close_ids(model_id, ids, n=len(ids))  # a mistyped profile's fix first
    return [*close, *(i for i in ids if i not in close)][:MAX_PROFILE_SUGGESTIONS]


def model_not_found(model_id: str, known: Iterable[str]) -> ModelNotFound:
    """404 ``MODEL_NOT_FOUND`` for ``model_id``, with ``model`` and ``suggestions`` as
    fields and the suggestions in the message: for ``base:profile`` whose base is known
    (an unknown profile), the base and every profile id it has; else the closest of
    ``known``, maybe none."""
    ids = list(islice(known, MAX_CANDIDATES))
    if len(model_id) <= _MAX_QUERY_CHARS and (profiles := _profiles_of(model_id, ids)):
        base = model_id.partition(":")[0]
        message = (
            f"model {echo(model_id)!r} not found: {base!r} has no profile "
            f"{echo(model_id.partition(':')[2])!r}; its ids: "
            + ", ".join(repr(p) for p in profiles)
        )
        return ModelNotFound(message, model=model_id, suggestions=profiles)
    suggestions = close_ids(model_id, ids)
    message = f"model {echo(model_id)!r} not found"
    if len(suggestions) == 1:
        message += f"; did you mean {suggestions[0]!r}?"
    elif suggestions:
        message += "; did you mean one of " + ", ".join(repr(s) for s in suggestions) + "?"
    return ModelNotFound(message, model=model_id, suggestions=suggestions)
