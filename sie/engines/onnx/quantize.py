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

The int8 graph is cached beside the float32 one it was made from
(``INT8_FILE``; for a shipped graph, under the model cache keyed by that graph's
digest), written to a temporary file and renamed. Whether it may serve is decided
by the quality gate (``sie.engines.onnx.checks.check_int8``), at every load.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from sie.core.errors import ModelLoadFailed
from sie.engines.onnx.export import atomic_write

__all__ = ["INT8_FILE", "QUANT_SETTINGS", "quantize_int8"]

log = logging.getLogger(__name__)

#: The settings above, as recorded in the cached file's name (a change re-quantises).
QUANT_SETTINGS = "dyn-qint8-perchannel-matmul-v1"
#: The int8 graph's file name, beside the float32 graph.
INT8_FILE = f"model.int8.{QUANT_SETTINGS}.onnx"


def _quiet_advice(record: logging.LogRecord) -> bool:
    """Drop the quantiser's "consider pre-processing" advice (shape inference for
    image models: nothing to do for these graphs); keep every other record."""
    return "pre-processing before quantization" not in record.getMessage()


def quantize_int8(src: Path, target: Path) -> float:
    """Write the dynamic int8 quantisation of the float32 graph ``src`` to ``target``.

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
            lambda tmp: quantize_dynamic(
                str(src),
                str(tmp),
                per_channel=True,
                op_types_to_quantize=["MatMul"],
                weight_type=QuantType.QInt8,
            ),
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
