"""ONNX Runtime encoder engines (docs/performance.md "ONNX Runtime engines").

The same models as the torch engines (``sie.engines.encoders.sentence_transformers``),
run by ``onnxruntime`` with ``tokenizers`` instead of torch:

- ``sie.engines.onnx.export``: the model's own weights exported to ONNX once, cached
  under the worker's model cache (``SIE_MODEL_CACHE_DIR``) by weights hash, or a
  ``model.onnx`` the weights directory ships;
- ``sie.engines.onnx.quantize``: dynamic int8 (``compute_precision: int8``), cached
  beside the float32 graph;
- ``sie.engines.onnx.checks``: what a load must pass: float32 against the torch
  pipeline (cosine >= 0.99999), int8 against float32 (a documented quality bound);
- ``sie.engines.onnx.runtime``: tokenisation and sessions sized to the cores;
- ``sie.engines.onnx.encoders`` (the bundle module): ``OnnxDenseEncoder`` (dense and
  multivector outputs, docs/api.md §2) and ``OnnxSparseEncoder`` (SPLADE);
- ``sie.engines.onnx.cross`` (the bundle module): ``OnnxCrossEncoderScorer``
  (cross-encoder reranking, docs/api.md §3), with its pair inputs
  (``sie.engines.onnx.pairs``) and checks (``sie.engines.onnx.cross_checks``).

Nothing here imports onnxruntime, tokenizers or torch at import time.
"""
