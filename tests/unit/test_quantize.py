"""Output dtypes (reference §1.5, §4.7): shapes, labels and per-row scaling."""

from __future__ import annotations

import numpy as np
import pytest

from sie.core.errors import InvalidInput
from sie.engines.encoders.quantize import check_output_dtype, quantize, quantize_sparse

ROW = np.array([0.5, -1.0, 0.25, 0.0, 2.0, -0.5, 0.1, -0.1, 0.3], dtype=np.float32)


def test_float_casts() -> None:
    a, label = quantize(ROW, "float16")
    assert label == "float16" and a.dtype == np.float16 and a.shape == ROW.shape
    a, label = quantize(ROW, "float32")
    assert label == "float32" and a.dtype == np.float32


def test_int8_is_symmetric_per_row() -> None:
    rows = np.stack([ROW, ROW * 10, np.zeros_like(ROW)])
    a, label = quantize(rows, "int8")
    assert label == "int8" and a.dtype == np.int8 and a.shape == rows.shape
    assert a[0, 4] == 127 and a[0, 1] == round(-1.0 / 2.0 * 127)
    np.testing.assert_array_equal(a[0], a[1])  # per row: scale does not matter
    assert not a[2].any()  # zero row stays zero, no division by zero


def test_uint8_is_min_max_per_row() -> None:
    a, label = quantize(ROW, "uint8")
    assert label == "uint8" and a.dtype == np.uint8
    assert a.min() == 0 and a.max() == 255 and a[1] == 0 and a[4] == 255
    const, _ = quantize(np.full(4, 3.0), "uint8")
    assert not const.any()


@pytest.mark.parametrize("kind", ["binary", "ubinary"])
def test_binary_is_bit_packed(kind: str) -> None:
    a, label = quantize(ROW, kind)
    assert label == "binary" and a.dtype == np.uint8 and a.shape == (2,)  # ceil(9 / 8)
    np.testing.assert_array_equal(np.unpackbits(a)[:9], (ROW > 0).astype(np.uint8))
    multi, _ = quantize(np.stack([ROW, -ROW]), kind)  # per token
    assert multi.shape == (2, 2)


def test_sparse_never_below_float16() -> None:
    v = np.array([0.5, 1.5], dtype=np.float32)
    assert quantize_sparse(v, "float16")[0].dtype == np.float16
    for kind in ("int8", "uint8", "binary", "float32"):
        a, label = quantize_sparse(v, kind)
        assert a.dtype == np.float32 and label == "float32"


def test_unknown_dtype_names_the_field() -> None:
    with pytest.raises(InvalidInput, match=r"params\.output_dtype.*int4"):
        check_output_dtype("int4")
    assert check_output_dtype("ubinary") == "ubinary"
