"""Output dtypes for encode results (docs/api.md §2.1).

``output_dtype`` is one of ``OUTPUT_DTYPES``; quantisation is per row (a dense
vector is one row; a multivector is one row per token):

- ``float32`` (default), ``float16``: a cast;
- ``int8``: symmetric, ``round(x / max|x| * 127)`` in [-127, 127]; an all-zero row stays zero;
- ``uint8``: linear min/max to [0, 255]; a constant row is all zeros;
- ``binary`` / ``ubinary``: ``numpy.packbits(x > 0)`` along the last axis (uint8,
  ``ceil(dim / 8)`` bytes per row), labelled ``binary``; ``dims`` stays the original
  dimension.

Sparse values are never quantised below float16: ``float16`` casts them, every
other dtype leaves them float32.
"""

from __future__ import annotations

import numpy as np

from sie.core.errors import InvalidInput

__all__ = ["OUTPUT_DTYPES", "check_output_dtype", "quantize", "quantize_sparse"]

OUTPUT_DTYPES = ("float32", "float16", "int8", "uint8", "binary", "ubinary")


def check_output_dtype(value: object, *, field: str = "params.output_dtype") -> str:
    """``value`` if it names an output dtype.

    Raises:
        InvalidInput: anything else (names ``field`` and the allowed values).
    """
    if not isinstance(value, str) or value not in OUTPUT_DTYPES:
        raise InvalidInput(
            f"{field}: {value!r} is not one of {', '.join(OUTPUT_DTYPES)}", field=field
        )
    return value


def quantize(values: np.ndarray, dtype: str) -> tuple[np.ndarray, str]:
    """Quantise ``values`` (``(dim,)`` or ``(rows, dim)`` float) row by row.

    Returns:
        ``(array, label)``: the converted array and its dtype label (``binary`` for
        both bit-packed kinds).
    """
    x = np.asarray(values, dtype=np.float32)
    if dtype == "float32":
        return x, "float32"
    if dtype == "float16":
        return x.astype(np.float16), "float16"
    if dtype == "int8":
        peak = np.max(np.abs(x), axis=-1, keepdims=True)
        scale = np.where(peak > 0, 127.0 / np.where(peak > 0, peak, 1.0), 0.0)
        return np.clip(np.rint(x * scale), -127, 127).astype(np.int8), "int8"
    if dtype == "uint8":
        lo = np.min(x, axis=-1, keepdims=True)
        span = np.max(x, axis=-1, keepdims=True) - lo
        scale = np.where(span > 0, 255.0 / np.where(span > 0, span, 1.0), 0.0)
        return np.clip(np.rint((x - lo) * scale), 0, 255).astype(np.uint8), "uint8"
    if dtype in ("binary", "ubinary"):
        return np.packbits(x > 0, axis=-1), "binary"
    raise InvalidInput(f"unknown output_dtype {dtype!r}", field="params.output_dtype")


def quantize_sparse(values: np.ndarray, dtype: str) -> tuple[np.ndarray, str]:
    """Sparse values: float16 when asked, else float32 (never below float16)."""
    if dtype == "float16":
        return np.asarray(values, dtype=np.float16), "float16"
    return np.asarray(values, dtype=np.float32), "float32"
