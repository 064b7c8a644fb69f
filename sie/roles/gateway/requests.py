"""Request checks made before anything is published (architecture §2, §16.2): the
model resolves, supports the task, and the request stays within the gateway's item
and text limits; and the lane a request goes to."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sie.core.config import POOL_RE
from sie.core.errors import InvalidInput
from sie.core.registry import ModelEntry, ModelRegistry
from sie.settings_views import LimitsSettings

__all__ = ["DEFAULT_ROUTING", "Routing", "check_request", "lane_of", "split_routing"]


@dataclass(frozen=True, slots=True)
class Routing:
    """Where a request goes and how long it may wait (docs/architecture.md §2, §16.3).

    ``pool`` / ``machine_profile``: the ``X-SIE-Pool`` / ``X-SIE-Machine-Profile``
    header values (None: the model's pool, the gateway's default profile);
    ``timeout_s``: seconds to wait for every result (None: ``SIE_REQUEST_TIMEOUT_S``);
    ``request_id``: the id results are collected under (None: a new uuid7).
    """

    pool: str | None = None
    machine_profile: str | None = None
    timeout_s: float | None = None
    request_id: str | None = None


#: No routing headers, the default timeout, a fresh request id.
DEFAULT_ROUTING = Routing()


def check_request(
    registry: ModelRegistry,
    limits: LimitsSettings,
    model_id: str,
    items: Sequence[Mapping[str, Any]],
    task: str | None,
    texts: list[tuple[str, Any]],
) -> tuple[ModelEntry, str]:
    """Resolve ``model_id`` and check the request before anything is published:
    the item count, the model's ``task`` (``score`` / ``extract``), and every text
    (``texts`` plus each item's) against ``max_text_chars`` (``max_extract_chars`` for
    extract).

    Raises:
        ModelNotFound: unknown model (404).
        InvalidInput: too many items, a missing task, or a text too long (400).
    """
    limit = limits.max_items_per_request
    if len(items) > limit:
        raise InvalidInput(
            f"items: at most {limit} items per request, got {len(items)}", field="items"
        )
    entry, bundle = registry.resolve(model_id)
    if task is not None and getattr(entry.config.tasks, task) is None:
        verb = {"score": "scoring", "extract": "extraction"}.get(task, task)
        raise InvalidInput(
            f"model {entry.model_id!r} does not support {verb} (no tasks.{task})",
            field="model",
        )
    chars = limits.max_text_chars
    if task == "extract":  # read whole, window by window: one text must fit the timeout
        chars = min(chars, limits.max_extract_chars)
    all_texts = texts + [(f"items[{i}].text", it.get("text")) for i, it in enumerate(items)]
    for name, text in all_texts:
        if isinstance(text, str) and len(text) > chars:
            window = entry.config.max_sequence_length
            why = (
                f" (the model reads at most {window} tokens)"
                if window and task != "extract"  # extract reads long texts in windows
                else ""
            )
            raise InvalidInput(
                f"{name}: {len(text)} characters exceeds the limit of {chars}{why}",
                field=name,
            )
    return entry, bundle


def split_routing(pool: str | None, machine_profile: str | None) -> tuple[str | None, str | None]:
    """The ``X-SIE-Pool`` and ``X-SIE-Machine-Profile`` values with the SDK's
    ``gpu="pool/profile"`` form (sent as ``X-SIE-Machine-Profile: pool/profile``) split.

    Raises:
        InvalidInput: ``pool/profile`` naming another pool than ``X-SIE-Pool`` (400).
    """
    if machine_profile is not None and "/" in machine_profile:
        named, _, profile = machine_profile.partition("/")
        if pool is not None and pool.strip().lower() != named.strip().lower():
            raise InvalidInput(
                f"X-SIE-Machine-Profile: {machine_profile[:130]!r} names pool {named[:64]!r} "
                f"but X-SIE-Pool is {pool[:64]!r}",
                field="X-SIE-Machine-Profile",
            )
        return named, profile
    return pool, machine_profile


def lane_of(queue_pool: str, machine_profile: str | None, default_profile: str) -> tuple[str, str]:
    """``(queue pool, machine_profile)`` of a request: the queue pool its pool resolved
    to (``PoolManager.route``) and the ``X-SIE-Machine-Profile`` header, else this
    gateway's default profile; lowercase (architecture §8.2).

    Raises:
        InvalidInput: a header value that is not a valid profile name.
    """
    if machine_profile is not None and not POOL_RE.fullmatch(machine_profile):
        raise InvalidInput(
            f"X-SIE-Machine-Profile: {machine_profile[:130]!r} must match {POOL_RE.pattern}",
            field="X-SIE-Machine-Profile",
        )
    return queue_pool.lower(), (machine_profile or default_profile).lower()
