"""Load the filesystem seed: ``--bundles-dir`` and ``--models-dir`` (architecture §4 step 1).

Any fsspec URL works (a local path, ``memory://``, ``s3://`` with s3fs installed).
Each ``*.yaml`` is one bundle or one model config; a bundle's ``name`` defaults
to its file stem (reference §3.3).
"""

from __future__ import annotations

import logging
from pathlib import PurePosixPath

import fsspec

from sie.core.config import Bundle, ModelConfig, parse_bundle, parse_model_config
from sie.core.errors import ConfigError

__all__ = ["load_bundles", "load_models", "read_yaml_dir"]

log = logging.getLogger(__name__)


def read_yaml_dir(url: str) -> list[tuple[str, bytes]]:
    """``[(file_name, bytes)]`` of every ``*.yaml``/``*.yml`` under ``url``, sorted by name.

    Raises:
        ConfigError: the directory does not exist.
    """
    fs, path = fsspec.core.url_to_fs(url)
    if not fs.isdir(path):
        raise ConfigError(f"config directory {url!r} does not exist", field="dir")
    files = sorted(p for p in fs.ls(path, detail=False) if str(p).endswith((".yaml", ".yml")))
    return [(PurePosixPath(str(p)).name, fs.cat_file(p)) for p in files]


def load_bundles(url: str) -> list[Bundle]:
    """Every bundle under ``url``.

    Raises:
        ConfigError: naming the file and the offending keys.
    """
    out = []
    for name, data in read_yaml_dir(url):
        stem = name.rsplit(".", 1)[0]
        try:
            out.append(parse_bundle(data, default_name=stem))
        except ConfigError as exc:
            raise ConfigError(f"{url}/{name}: {exc.message}") from exc
    return out


def load_models(url: str) -> list[ModelConfig]:
    """Every model config under ``url``.

    Raises:
        ConfigError: naming the file and the offending keys, or a duplicate ``sie_id``.
    """
    out: dict[str, ModelConfig] = {}
    for name, data in read_yaml_dir(url):
        try:
            cfg = parse_model_config(data, what=f"{url}/{name}")
        except ConfigError as exc:
            raise ConfigError(exc.message) from exc
        if cfg.sie_id in out:
            raise ConfigError(f"{url}/{name}: duplicate sie_id {cfg.sie_id!r}")
        out[cfg.sie_id] = cfg
    return list(out.values())
