"""NATS subject and stream names (architecture §8, §8.2, §16.2) and wildcard matching.

Work subjects are exactly six tokens, ``sie.work.{pool}.{machine_profile}.{bundle}.{model}``;
every token goes through ``normalize_model_id`` so ids such as
``vidore/colqwen2.5-v0.2`` stay one token.
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = [
    "ADVISORY_MAX_DELIVERIES",
    "CANCEL_WILDCARD",
    "CONFIG_ALL_SUBJECT",
    "DEAD_LETTERS_STREAM",
    "DLQ_PREFIX",
    "HEALTH_WILDCARD",
    "batch_cancel_subject",
    "batch_cancel_wildcard",
    "cancel_subject",
    "config_subject",
    "direct_filter",
    "direct_stream_name",
    "direct_subject",
    "dlq_msg_id",
    "dlq_subject",
    "health_subject",
    "inbox_subject",
    "inbox_wildcard",
    "lane_filter",
    "normalize_model_id",
    "stream_name",
    "stream_subjects",
    "subject_matches",
    "work_subject",
]

_UNSAFE = re.compile(r"[*>\s]")
CONFIG_ALL_SUBJECT = "sie.config.models._all"
HEALTH_WILDCARD = "sie.health.>"
CANCEL_WILDCARD = "work_cancel.>"
#: JetStream's advisory when a message hits a consumer's max_deliver (architecture §8).
ADVISORY_MAX_DELIVERIES = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"
DEAD_LETTERS_STREAM = "DEAD_LETTERS"
DLQ_PREFIX = "sie.dlq"


def dlq_subject(work_subject_: str) -> str:
    """``sie.dlq.{model_token}``: the model token of a work subject
    ``sie.work.{pool}.{profile}.{bundle}.{model}`` (already normalised, §8.2)."""
    parts = work_subject_.split(".")
    token = parts[5] if len(parts) > 5 else "unknown"
    return f"{DLQ_PREFIX}.{token}"


def dlq_msg_id(stream: str, seq: int) -> str:
    """Deterministic ``Nats-Msg-Id`` of a dead letter: every gateway replica republishing
    the same advisory is deduplicated by JetStream (§8)."""
    return f"dlq.{stream}.{seq}"


def normalize_model_id(model_id: str) -> str:
    """``/`` → ``__``, ``.`` → ``_dot_``, ``*``, ``>`` and whitespace → ``_`` (§8.2)."""
    return _UNSAFE.sub("_", model_id.replace("/", "__").replace(".", "_dot_"))


def work_subject(pool: str, machine_profile: str, bundle: str, model_id: str) -> str:
    """``sie.work.{pool}.{machine_profile}.{bundle}.{model}`` with every token normalised."""
    toks = (pool, machine_profile, bundle, model_id)
    return "sie.work." + ".".join(normalize_model_id(t) for t in toks)


def direct_subject(
    pool: str, machine_profile: str, bundle: str, model_id: str, worker_id: str
) -> str:
    """Worker-direct dispatch (generation, §8.2):
    ``sie.work.{pool}.{machine_profile}.{bundle}.{model}.{worker_id}``; one token more
    than the pool stream's ``sie.work.{pool}.*.*.*``, so the stream never captures it."""
    return (
        f"{work_subject(pool, machine_profile, bundle, model_id)}.{normalize_model_id(worker_id)}"
    )


def direct_filter(pool: str, machine_profile: str, bundle: str, worker_id: str) -> str:
    """What one worker subscribes to for direct dispatch: any model of its lane."""
    lane = ".".join(normalize_model_id(t) for t in (pool, machine_profile, bundle))
    return f"sie.work.{lane}.*.{normalize_model_id(worker_id)}"


def direct_stream_name(worker_id: str) -> str:
    """``WORK_DIRECT_{worker_id}``: the JetStream stream of one worker's direct dispatch."""
    return f"WORK_DIRECT_{normalize_model_id(worker_id)}"


def lane_filter(pool: str, machine_profile: str, bundle: str) -> str:
    """A worker's consumer filter: ``sie.work.{pool}.{machine_profile}.{bundle}.*``."""
    return (
        "sie.work."
        + ".".join(normalize_model_id(t) for t in (pool, machine_profile, bundle))
        + ".*"
    )


def stream_name(pool: str) -> str:
    """``WORK_POOL_{pool}``."""
    return f"WORK_POOL_{normalize_model_id(pool)}"


def stream_subjects(pool: str) -> list[str]:
    """``["sie.work.{pool}.*.*.*"]``."""
    return [f"sie.work.{normalize_model_id(pool)}.*.*.*"]


def inbox_subject(router_id: str, request_id: str) -> str:
    """``_INBOX.{router_id}.{request_id}``."""
    return f"_INBOX.{normalize_model_id(router_id)}.{normalize_model_id(request_id)}"


def inbox_wildcard(router_id: str) -> str:
    """``_INBOX.{router_id}.>``: the gateway's one app-wide result subscription."""
    return f"_INBOX.{normalize_model_id(router_id)}.>"


def cancel_subject(router_id: str, request_id: str) -> str:
    """``work_cancel.{router_id}.{request_id}``: best-effort request abandonment (§8)."""
    return f"work_cancel.{normalize_model_id(router_id)}.{normalize_model_id(request_id)}"


def batch_cancel_subject(router_id: str, worker_id: str, request_id: str) -> str:
    """``batch_cancel.{router_id}.{worker_id}.{request_id}``: the request's items queued
    on the worker's direct stream were published to the pool instead (§8)."""
    toks = (router_id, worker_id, request_id)
    return "batch_cancel." + ".".join(normalize_model_id(t) for t in toks)


def batch_cancel_wildcard(worker_id: str) -> str:
    """What ``worker_id`` subscribes to: ``batch_cancel.*.{worker_id}.*``."""
    return f"batch_cancel.*.{normalize_model_id(worker_id)}.*"


def health_subject(worker_id: str) -> str:
    """``sie.health.{worker_id}``."""
    return f"sie.health.{normalize_model_id(worker_id)}"


def config_subject(bundle_id: str) -> str:
    """``sie.config.models.{bundle}``."""
    return f"sie.config.models.{bundle_id}"


@lru_cache(maxsize=8192)
def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard match: ``*`` is one token, a trailing ``>`` one or more tokens.

    Memoised (a bounded cache): the in-memory bus asks it for every stored message on
    every fetch, for the same few work subjects."""
    p = pattern.split(".")
    s = subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s):
            return False
        if tok != "*" and tok != s[i]:
            return False
    return len(p) == len(s)
