"""Validation of decoded request payloads with pydantic: the first offending field is
named in a 400 ``INVALID_INPUT`` (used by the gateway's HTTP layer and by workers that
parse request bodies themselves, e.g. generation)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, StrictStr, ValidationError

from sie.core.errors import InvalidInput

__all__ = ["Text", "validate"]


def _utf8(v: str) -> str:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"contains an unpaired surrogate at position {exc.start}") from None
    return v


#: A JSON string that is valid Unicode (JSON escapes can smuggle lone surrogates).
#: A JSON string that is valid Unicode (JSON escapes can smuggle lone surrogates).
Text = Annotated[StrictStr, AfterValidator(_utf8)]


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


_BRANCH_TAGS = frozenset({"str", "int", "bool", "float", "list", "dict"})

#: Plain wording for pydantic error types whose default text names our classes.
_MESSAGES = {
    "model_type": "expected an object",
    "model_attributes_type": "expected an object",
    "dict_type": "expected an object",
    "list_type": "expected a list",
    "string_type": "expected a string",
    "bool_type": "expected true or false",
    "int_type": "expected an integer",
    "missing": "required",
    "too_short": "must not be empty",
    "extra_forbidden": "unknown field",
}


def validate(model: type[BaseModel], payload: Any) -> Any:
    """Validate a decoded payload.

    Raises:
        InvalidInput: naming the first offending field (``field``) and listing all.
    """
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        msgs = []
        for e in errors:
            # drop pydantic's union/validator branch tags ("str", "list[...]", "function-after[...]")
            loc = tuple(
                p for p in e["loc"] if not (isinstance(p, str) and ("[" in p or p in _BRANCH_TAGS))
            )
            msg = _MESSAGES.get(e["type"], e["msg"].removeprefix("Value error, "))
            msgs.append((_loc(loc), msg))
        field, first = msgs[0]
        raise InvalidInput(
            f"{field}: {first}", field=field, errors=[f"{f}: {m}" for f, m in msgs]
        ) from exc
