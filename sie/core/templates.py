"""Input templates (docs/api.md §9): ``query_template`` / ``doc_template`` runtime options.

A template may use only the plain fields ``{text}`` and ``{instruction}``: no
format specs (``{text:>9999999}`` would let a 30-byte option build megabytes),
no conversions, no attribute or index access. Without a template a non-empty
instruction is prefixed as ``"{instruction} {text}"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from string import Formatter
from typing import Any

from sie.core.errors import InvalidInput

__all__ = ["check_template", "render_input"]

_FIELDS = frozenset({"text", "instruction"})


def check_template(template: str, *, field: str) -> str:
    """Validate a template.

    Raises:
        InvalidInput: naming ``field``, for anything but plain ``{text}``/``{instruction}``.
    """
    try:
        parts = list(Formatter().parse(template))
    except ValueError as exc:
        raise InvalidInput(f"{field}: not a valid template ({exc})", field=field) from exc
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in _FIELDS or spec or conversion:
            raise InvalidInput(
                f"{field}: {{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}} "
                "is not allowed; use only {text} and {instruction}",
                field=field,
            )
    return template


def render_input(
    text: str, instruction: str | None, is_query: bool, options: Mapping[str, Any]
) -> str:
    """The string the model reads for ``text``.

    Raises:
        InvalidInput: a template that ``check_template`` rejects.
    """
    name = "query_template" if is_query else "doc_template"
    template = options.get(name)
    if template:
        check_template(str(template), field=f"params.options.{name}")
        return str(template).format(text=text, instruction=instruction or "")
    return f"{instruction} {text}" if instruction else text
