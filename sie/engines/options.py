"""Typed reading of engine options (docs/api.md §9 ``adapter_options``).

Runtime options come from the request merged over the profile; a wrong type or
range is the caller's mistake: ``InvalidInput`` naming ``params.options.<name>``.
Loadtime options come from the model config; a wrong one is a permanent
``ModelLoadFailed`` (``CONFIG``) naming ``loadtime.<name>``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sie.core.errors import InvalidInput, ModelLoadFailed

__all__ = ["loadtime_positive_int", "runtime_bool", "runtime_fraction", "runtime_positive_int"]


def runtime_bool(options: Mapping[str, Any], name: str, default: bool) -> bool:
    """A boolean runtime option (``None`` or absent: ``default``).

    Raises:
        InvalidInput: not a boolean.
    """
    value = options.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidInput(
            f"params.options.{name} must be a boolean, got {type(value).__name__}",
            field=f"params.options.{name}",
        )
    return value


def runtime_fraction(options: Mapping[str, Any], name: str, default: float) -> float:
    """A number in 0..1 (``None`` or absent: ``default``), e.g. a score threshold.

    Raises:
        InvalidInput: not a finite number in 0..1.
    """
    value = options.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(
            f"params.options.{name} must be a number in 0..1, got {type(value).__name__}",
            field=f"params.options.{name}",
        )
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise InvalidInput(
            f"params.options.{name} must be in 0..1, got {value!r}",
            field=f"params.options.{name}",
        )
    return float(value)


def runtime_positive_int(options: Mapping[str, Any], name: str) -> int | None:
    """A positive integer runtime option, or ``None`` when absent.

    Raises:
        InvalidInput: not a positive integer.
    """
    value = options.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(
            f"params.options.{name} must be a positive integer, got {value!r}",
            field=f"params.options.{name}",
        )
    return value


def loadtime_positive_int(loadtime: Mapping[str, Any], name: str, default: int, sie_id: str) -> int:
    """A positive integer loadtime option (absent: ``default``).

    Raises:
        ModelLoadFailed: (CONFIG, permanent) not a positive integer.
    """
    value = loadtime.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelLoadFailed(
            f"model {sie_id!r}: loadtime.{name} must be a positive integer, got {value!r}",
            error_class="CONFIG",
            permanent=True,
        )
    return value
