"""Nesting bounds for untrusted documents (docs/security.md "Limits").

Every decoder SIE feeds untrusted bytes to stops at a fixed depth before it can
allocate in proportion to the nesting: JSON request bodies at Python's recursion
limit (the C decoder raises ``RecursionError``), msgpack at its 1,024-level stack,
the generation routes' token walk and the config role's YAML event walk at
``DEFAULT_MAX_DEPTH`` / their own bound. ``check_depth`` then applies the request
bound to a decoded value.
"""

from __future__ import annotations

from typing import Any

from sie.core.errors import WireError

__all__ = ["DEFAULT_MAX_DEPTH", "check_depth", "too_deep"]

#: Deepest nesting a request body may have (objects and arrays). SIE's own bodies
#: nest about 6 levels; JSON schemas in ``output_schema`` or chat ``tools`` rarely 20.
DEFAULT_MAX_DEPTH = 64

_CONTAINERS = frozenset({dict, list, tuple})


def too_deep(limit: int, field: str = "body") -> WireError:
    """The one error for a document nested past ``limit`` (400 INVALID_PAYLOAD)."""
    return WireError(f"{field}: nested deeper than {limit} levels", field=field, max_depth=limit)


def check_depth(value: Any, limit: int = DEFAULT_MAX_DEPTH, *, field: str = "body") -> None:
    """Refuse a decoded value (dicts, lists, tuples) nested deeper than ``limit``.

    Breadth-first, one level at a time: a value nested past Python's recursion limit
    is refused, not a crash. Cost: one visit per container (about 0.3 µs), nothing
    per scalar.

    Raises:
        WireError: nested deeper than ``limit`` (400 INVALID_PAYLOAD, ``field``).
    """
    level = [value] if type(value) in _CONTAINERS else []
    depth = 1
    while level:
        if depth > limit:
            raise too_deep(limit, field)
        deeper = []
        for node in level:
            for child in node.values() if type(node) is dict else node:
                if type(child) in _CONTAINERS:
                    deeper.append(child)
        level = deeper
        depth += 1
