"""Append-only merge of a model-config write into the current config (architecture §3).

Pure: the config authority (step 3.2-3.3) and every registry apply (gateway
deltas, worker deltas, restore) use the same rules, so they cannot disagree:

- a profile name not yet present is **created**;
- a profile name already present with identical content is **skipped**;
- a profile name already present with different content is a **conflict** (409);
- a top-level field equal to its current *effective* value (set, or the default when
  unset) is kept; any other value is a **conflict** (409): metadata is append-only too,
  and setting a field that was left at its default (e.g. ``pool``) would change how
  the existing profiles are served;
- fields the write omits are preserved.

"Identical" compares the profile as validated, with ``adapter_options`` whose
values are all falsy treated as absent (the §7 canonicalisation), so a replay
that spells an empty option block differently is still a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from sie.core.config import ModelConfig, Profile, check_document_size, parse_model_config
from sie.core.errors import ConfigError, ContentConflict, ValidationFailed, echo
from sie.core.hashing import canonicalize_adapter_options

__all__ = [
    "MAX_PROFILES",
    "MergeResult",
    "canonical_profile",
    "document_of",
    "merge_model_write",
]

#: Most profiles one model may have (bounds write cost and registry size).
MAX_PROFILES = 256


@dataclass(frozen=True, slots=True)
class MergeResult:
    """``config``: the merged, validated config; ``document``: its YAML mapping.

    ``created``/``skipped``: profile names of the write, in its order.
    """

    config: ModelConfig
    document: dict[str, Any]
    created: list[str]
    skipped: list[str]


def document_of(config: ModelConfig) -> dict[str, Any]:
    """The mapping that was written (unset defaults omitted): what the store persists."""
    return config.model_dump(mode="json", exclude_unset=True)


def canonical_profile(profile: Profile) -> dict[str, Any]:
    """A profile's comparable form: set fields only, falsy adapter_options dropped."""
    doc = profile.model_dump(mode="json", exclude_none=True)
    opts = doc.get("adapter_options")
    if opts is not None and canonicalize_adapter_options(opts) is None:
        del doc["adapter_options"]
    return doc


def _effective(config: ModelConfig, key: str) -> Any:
    """A top-level field's value as served (an unset ``pool`` is ``default``)."""
    return config.effective_pool if key == "pool" else getattr(config, key)


def _as_validation(exc: ConfigError) -> ValidationFailed:
    if isinstance(exc, ValidationFailed):
        return exc
    return ValidationFailed(exc.message, **exc.fields)


def merge_model_write(existing: ModelConfig | None, incoming: dict[str, Any]) -> MergeResult:
    """Merge one write (a parsed YAML mapping) into ``existing`` (None: a new model).

    The merged document is held to the ``load_yaml`` bounds (``MAX_YAML_NODES`` nodes,
    ``MAX_YAML_CHARS`` characters once aliases are expanded; docs/security.md "Limits"),
    so each write is bounded and whatever is stored and published loads again.

    Raises:
        ValidationFailed: missing ``sie_id``/``profiles``, unknown keys, invalid
            fields, a merged document that is not a valid config, or one past the
            document bounds (422, field ``profiles``).
        ContentConflict: a changed profile body or top-level value (409), with
            ``conflicting_profiles`` / ``conflicting_fields``.
    """
    sie_id = incoming.get("sie_id")
    if not isinstance(sie_id, str) or not sie_id:
        raise ValidationFailed("sie_id: required (a non-empty string)", field="sie_id")
    profiles = incoming.get("profiles")
    if not isinstance(profiles, dict) or not profiles:
        raise ValidationFailed(
            "profiles: required (a non-empty mapping of profile name to profile)",
            field="profiles",
        )
    if len(profiles) > MAX_PROFILES or (
        existing is not None and len(set(existing.profiles) | set(profiles)) > MAX_PROFILES
    ):
        raise ValidationFailed(
            f"profiles: a model has at most {MAX_PROFILES} profiles", field="profiles"
        )
    if existing is None:
        try:
            config = parse_model_config(incoming, what=f"model {echo(sie_id)!r}")
        except ConfigError as exc:
            raise _as_validation(exc) from exc
        document = document_of(config)
        check_document_size(document, what=f"model {echo(sie_id)!r}")
        return MergeResult(config, document, list(profiles), [])

    created: list[str] = []
    skipped: list[str] = []
    conflicting_profiles: list[str] = []
    for name, raw in profiles.items():
        try:
            prof = Profile.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(x) for x in ("profiles", name, *err["loc"]))
            raise ValidationFailed(f"{loc}: {err['msg']}", field=loc) from exc
        have = existing.profiles.get(name)
        if have is None:
            created.append(name)
        elif canonical_profile(have) == canonical_profile(prof):
            skipped.append(name)
        else:
            conflicting_profiles.append(name)

    base = document_of(existing)
    conflicting_fields: list[str] = []
    added: dict[str, Any] = {}
    for key, value in incoming.items():
        if key in ("sie_id", "profiles"):
            continue
        try:  # compare as validated (e.g. pool case), not as spelled
            trial = ModelConfig.model_validate({**base, key: value})
        except ValidationError as exc:
            raise ValidationFailed(f"{key}: {exc.errors()[0]['msg']}", field=key) from exc
        # Against the *effective* value: a field left unset means its default, and setting
        # it now (e.g. ``pool``) would change how existing profiles are served.
        if _effective(trial, key) != _effective(existing, key):
            conflicting_fields.append(key)
        elif key not in base:
            added[key] = value
    if conflicting_profiles or conflicting_fields:
        parts = []
        if conflicting_profiles:
            parts.append(f"profile(s) {conflicting_profiles} already exist with different content")
        if conflicting_fields:
            parts.append(f"field(s) {conflicting_fields} already set to a different value")
        raise ContentConflict(
            f"model {echo(sie_id)!r} is append-only: " + "; ".join(parts),
            model=sie_id,
            conflicting_profiles=conflicting_profiles,
            conflicting_fields=conflicting_fields,
        )
    merged = {
        **base,
        **added,
        "profiles": {**base["profiles"], **{n: profiles[n] for n in created}},
    }
    try:
        config = parse_model_config(merged, what=f"model {echo(sie_id)!r}")
    except ConfigError as exc:
        raise _as_validation(exc) from exc
    document = document_of(config)
    if created:
        check_document_size(document, what=f"model {echo(sie_id)!r}")
    return MergeResult(config, document, created, skipped)
