"""Dynamic int8 quantisation of a float32 graph (profile ``compute_precision: int8``).

``onnxruntime.quantization.quantize_dynamic`` with the settings that keep quality
(all-MiniLM-L6-v2, the 50 probe texts of ``sie.engines.onnx.checks``, against float32;
docs/performance.md "ONNX Runtime engines"):

- ``MatMul`` nodes only (the attention and feed-forward weights; embeddings, layer
  norms and the rest stay float32);
- per-channel weight scales (one per output column): a per-tensor int8 MiniLM falls
  to min cosine 0.79 (mean 0.958);
- weights ``QInt8`` (signed), activations quantised per call (uint8): min cosine 0.964
  (one- and two-word texts; 0.989 and up from 8 words), mean 0.993, top-10 agreement
  0.914. ``QUInt8`` weights gave the same quality (min 0.964) but ran about 1.5x
  slower. Keeping the feed-forward input MatMuls in float32 raises the min to 0.981 at
  about a third of the speed-up: not done.

- activations scaled per tensor by default (ONNX Runtime's ``DynamicQuantizeLinear``);
  loadtime ``int8_activation_scales: token`` scales each token on its own
  (``sie.engines.onnx.token_scales``): better quality (MiniLM: min 0.969, mean 0.9967,
  top-10 0.944) and a text's vector independent of its batch, 5-14% slower on 2 cores
  (docs/performance.md "Per-token activation scales").

The int8 graph is cached beside the float32 one it was made from
(``INT8_FILE``; for a shipped graph, under the model cache keyed by that graph's
digest), written to a temporary file and renamed. Whether it may serve is decided
by the quality gate (``sie.engines.onnx.checks.check_int8``), at every load.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from sie.core.errors import ModelLoadFailed
from sie.engines.onnx.export import atomic_write
from sie.engines.onnx.token_scales import per_token_scales

__all__ = [
    "ACTIVATION_SCALES",
    "INT8_FILE",
    "INT8_TOKEN_FILE",
    "QUANT_SETTINGS",
    "int8_file",
    "quantize_int8",
]

log = logging.getLogger(__name__)

#: The settings above, as recorded in the cached file's name (a change re-quantises).
QUANT_SETTINGS = "dyn-qint8-perchannel-matmul-v1"
#: The int8 graph's file name, beside the float32 graph.
INT8_FILE = f"model.int8.{QUANT_SETTINGS}.onnx"
#: The same with per-token activation scales (``sie.engines.onnx.token_scales``).
INT8_TOKEN_FILE = f"model.int8.{QUANT_SETTINGS}-tokenscales-v1.onnx"
#: The activation scales an int8 graph may use (loadtime ``int8_activation_scales``).
ACTIVATION_SCALES = ("tensor", "token")


def int8_file(scales: str = "tensor") -> str:
    """The int8 graph's file name for ``scales`` (``ACTIVATION_SCALES``)."""
    return INT8_TOKEN_FILE if scales == "token" else INT8_FILE


def _quiet_advice(record: logging.LogRecord) -> bool:
    """Drop the quantiser's "consider pre-processing" advice (shape inference for
    image models: nothing to do for these graphs); keep every other record."""
    return "pre-processing before quantization" not in record.getMessage()


def _quantise(
    quantize_dynamic: Any, quant_type: Any, src: Path, tmp: Path, token_scales: bool
) -> None:
    """``quantize_dynamic`` (the settings above) into ``tmp``; with ``token_scales``,
    then per-token activation scales (``sie.engines.onnx.token_scales``).

    Raises:
        ValueError: the quantiser wrote nothing the rewrite recognises.
    """
    import onnx

    quantize_dynamic(
        str(src),
        str(tmp),
        per_channel=True,
        op_types_to_quantize=["MatMul"],
        weight_type=quant_type.QInt8,
    )
    if not token_scales:
        return
    model = onnx.load(str(tmp))
    if not per_token_scales(model):
        raise ValueError("the quantiser wrote no DynamicQuantizeLinear to rewrite")
    onnx.save(model, str(tmp))


def quantize_int8(src: Path, target: Path, token_scales: bool = False) -> float:
    """Write the dynamic int8 quantisation of the float32 graph ``src`` to ``target``
    (``token_scales``: each token's activations scaled on their own, module docstring).

    Returns:
        Seconds it took.

    Raises:
        ModelLoadFailed: DEPENDENCY (the ``onnx`` package, which the quantiser needs,
            is missing) or UNKNOWN (the quantiser failed); both permanent.
    """
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:
        raise ModelLoadFailed(
            f"int8 quantisation needs onnxruntime.quantization and the onnx package ({exc}); "
            "pip install onnx",
            error_class="DEPENDENCY",
            permanent=True,
        ) from exc
    t0 = time.monotonic()
    root_log = logging.getLogger()  # the quantiser logs its advice on the root logger
    root_log.addFilter(_quiet_advice)
    try:
        atomic_write(
            target,
            lambda tmp: _quantise(quantize_dynamic, QuantType, src, tmp, token_scales),
        )
    except Exception as exc:
        raise ModelLoadFailed(
            f"int8 quantisation failed: {type(exc).__name__}: {exc}",
            error_class="UNKNOWN",
            permanent=True,
        ) from exc
    finally:
        root_log.removeFilter(_quiet_advice)
    secs = time.monotonic() - t0
    log.info("quantised %s to int8 in %.1fs", src.parent.name, secs)
    return secs
