"""The float32 ONNX graph of a model: shipped, or exported once from its own weights.

Where the graph comes from, in order:

1. loadtime ``onnx_file`` (a path inside the weights directory), else a ``model.onnx``
   or ``onnx/model.onnx`` the weights directory ships (``shipped_onnx``);
2. an export made earlier and cached (``cached_graph_dir``): under the worker's model
   cache (``SIE_MODEL_CACHE_DIR``, the directory the GGUF dequantiser uses,
   ``sie.engines.generators.gguf.model_cache_root``), in
   ``onnx/<safe model id>--<key>/``, where ``key`` hashes the weight files' contents
   with ``EXPORTER_VERSION``, ``OPSET``, the torch version and the graph's head; new
   weights, a new exporter or a new torch give a new directory, never a stale graph;
3. else ``export_graph``: ``torch.onnx.export`` (the TorchScript exporter,
   ``dynamo=False``) of the Hugging Face module, inputs ``input_ids`` /
   ``attention_mask`` / ``token_type_ids`` (int64 ``[batch, seq]``, both axes dynamic),
   one float32 output (``token_embeddings`` ``[batch, seq, hidden]`` for an encoder),
   then its shape arithmetic folded into constants (``sie.engines.onnx.simplify``).
   Written to a temporary file and renamed: a crash or a concurrent loader never
   leaves a half-written graph behind.

Whatever its source, the engine checks the graph against the torch pipeline before it
serves (``sie.engines.onnx.checks``). Graphs over 2 GB (ONNX external data) are not
handled: the engines target small encoders.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sie.core.errors import ModelLoadFailed
from sie.engines.generators.gguf import model_cache_root, safe_name

__all__ = [
    "EXPORTER_VERSION",
    "FP32_FILE",
    "OPSET",
    "SHIPPED_ONNX_FILES",
    "atomic_write",
    "cached_graph_dir",
    "export_graph",
    "file_digest",
    "shipped_onnx",
    "weights_digest",
]

log = logging.getLogger(__name__)

#: Bumped when the export itself changes (inputs, outputs, options, the rewrites of
#: ``sie.engines.onnx.simplify``): old caches are unused.
EXPORTER_VERSION = 2
#: The ONNX opset the graphs are exported with.
OPSET = 17
#: Where a weights directory may ship its own graph (relative paths, first found wins).
SHIPPED_ONNX_FILES = ("model.onnx", "onnx/model.onnx")
#: The exported float32 graph's file name inside its cache directory.
FP32_FILE = "model.onnx"
#: Files whose contents key the export: the architecture and the weights.
_KEY_SUFFIXES = (".safetensors", ".bin")
_KEY_FILES = ("config.json",)
_CHUNK = 1 << 20


def file_digest(path: Path, h: Any = None) -> str:
    """sha256 hex digest of ``path``'s contents (read in 1 MiB chunks; about 0.1 s per
    100 MB)."""
    h = h if h is not None else hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return str(h.hexdigest())


def weights_digest(root: Path) -> str:
    """sha256 over the names and contents of ``root``'s ``config.json`` and top-level
    weight files (``*.safetensors``, ``*.bin``), in name order.

    Raises:
        ModelLoadFailed: (NOT_FOUND, permanent) ``root`` holds no weight file.
    """
    files = sorted(
        p
        for p in root.iterdir()
        if p.is_file() and (p.name in _KEY_FILES or p.suffix in _KEY_SUFFIXES)
    )
    if not any(p.suffix in _KEY_SUFFIXES for p in files):
        raise ModelLoadFailed(
            f"no *.safetensors or *.bin weights in {str(root)!r} to export to ONNX",
            error_class="NOT_FOUND",
            permanent=True,
        )
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0")
        file_digest(p, h)
    return str(h.hexdigest())


def cached_graph_dir(
    model_cache_dir: str | Path | None, sie_id: str, digest: str, head: str
) -> Path:
    """The directory an export of weights ``digest`` (``weights_digest``) with output
    ``head`` lives in: ``<model cache>/onnx/<safe sie_id>--<16 hex>``. The hex hashes the
    digest, ``EXPORTER_VERSION``, ``OPSET``, ``head`` and the installed torch version."""
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    key = f"{digest}|exporter={EXPORTER_VERSION}|opset={OPSET}|head={head}|torch={torch_version}"
    short = hashlib.sha256(key.encode()).hexdigest()[:16]
    return model_cache_root(model_cache_dir) / "onnx" / f"{safe_name(sie_id)}--{short}"


def shipped_onnx(root: Path, loadtime: Mapping[str, Any], sie_id: str) -> Path | None:
    """The graph the weights directory ships: loadtime ``onnx_file`` when set, else the
    first of ``SHIPPED_ONNX_FILES`` present; ``None`` when there is none.

    Raises:
        ModelLoadFailed: (CONFIG, permanent) ``onnx_file`` is not a relative path to a
            file inside ``root``.
    """
    name = loadtime.get("onnx_file")
    if name is not None:
        path = (root / str(name)).resolve()
        if not isinstance(name, str) or Path(name).is_absolute() or not path.is_file():
            raise ModelLoadFailed(
                f"model {sie_id!r}: loadtime.onnx_file {name!r} is not a file inside "
                "the weights directory",
                error_class="CONFIG",
                permanent=True,
            )
        if root.resolve() not in path.parents:
            raise ModelLoadFailed(
                f"model {sie_id!r}: loadtime.onnx_file {name!r} leaves the weights directory",
                error_class="CONFIG",
                permanent=True,
            )
        return path
    for rel in SHIPPED_ONNX_FILES:
        if (root / rel).is_file():
            return root / rel
    return None


def atomic_write(target: Path, write: Any) -> None:
    """Call ``write(tmp_path)`` then rename ``tmp_path`` to ``target`` (same directory,
    so the rename is atomic); the temporary file is removed if ``write`` fails."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def export_graph(
    module: Any,
    example: Mapping[str, Any],
    input_names: Sequence[str],
    output_name: str,
    output_key: str,
    target: Path,
    info: Mapping[str, Any] | None = None,
) -> float:
    """Export ``module`` (a Hugging Face ``PreTrainedModel``, eval mode) to ``target``.

    Args:
        example: an input batch, numpy int64 ``[batch, seq]`` per name (a padded one:
            the trace must see the attention mask in use).
        input_names: the inputs the graph takes, in order (a subset of ``example``).
        output_name: the graph's output name (``token_embeddings``, ``logits``).
        output_key: the key of the module's output dict to export
            (``last_hidden_state``, ``logits``).
        info: written beside the graph as ``export.json`` (what it was made from).

    Returns:
        Seconds the export took.

    Raises:
        ModelLoadFailed: DEPENDENCY (no ``onnx`` package, which the exporter needs) or
            UNKNOWN (the exporter failed); both permanent.
    """
    import torch

    if importlib.util.find_spec("onnx") is None:
        raise ModelLoadFailed(
            "exporting to ONNX needs the onnx package (pip install 'sie[st]')",
            error_class="DEPENDENCY",
            permanent=True,
        )
    names = tuple(input_names)

    class _Forward(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *tensors: Any) -> Any:
            kwargs = dict(zip(names, tensors, strict=True))
            return self.inner(**kwargs, return_dict=True)[output_key]

    args = tuple(torch.from_numpy(example[n]) for n in names)
    axes = {n: {0: "batch", 1: "sequence"} for n in (*names, output_name)}
    t0 = time.monotonic()

    def write(tmp: Path) -> None:
        hf_log = logging.getLogger("transformers.modeling_utils")
        level = hf_log.level
        hf_log.setLevel(logging.ERROR)  # the tracer reads properties transformers warns about
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # tracer notes on Python-side branches
                torch.onnx.export(
                    _Forward(module).eval(),
                    args,
                    str(tmp),
                    input_names=list(names),
                    output_names=[output_name],
                    dynamic_axes=axes,
                    opset_version=OPSET,
                    do_constant_folding=True,
                    dynamo=False,
                )
        finally:
            hf_log.setLevel(level)
        _simplify_file(tmp)

    try:
        atomic_write(target, write)
    except Exception as exc:
        raise ModelLoadFailed(
            f"exporting to ONNX failed: {type(exc).__name__}: {exc}",
            error_class="UNKNOWN",
            permanent=True,
        ) from exc
    secs = time.monotonic() - t0
    meta = {**(info or {}), "exporter": EXPORTER_VERSION, "opset": OPSET, "seconds": secs}
    atomic_write(
        target.with_name("export.json"), lambda tmp: tmp.write_text(json.dumps(meta, indent=1))
    )
    log.info("exported %s to ONNX in %.1fs", target.parent.name, secs)
    return secs


def _simplify_file(path: Path) -> None:
    """Rewrite the exported graph at ``path`` with ``simplify_graph`` (same outputs)."""
    import onnx

    from sie.engines.onnx.simplify import simplify_graph

    model, removed = simplify_graph(onnx.load(str(path)))
    if removed:
        onnx.save(model, str(path))
        log.info("export: %d nodes of shape arithmetic folded", removed)
