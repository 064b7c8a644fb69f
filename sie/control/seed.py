"""Load the filesystem seed: ``--bundles-dir`` and ``--models-dir`` (architecture §4 step 1).

Any fsspec URL works (a local path, ``memory://``, ``s3://`` with s3fs installed).
Each ``*.yaml`` is one bundle or one model config; a bundle's ``name`` defaults
to its file stem (docs/api.md §9).
"""

from __future__ import annotations

import logging
from pathlib import PurePosixPath

import fsspec

from sie.core.config import Bundle, ModelConfig, parse_bundle, parse_model_config
from sie.core.errors import ConfigError
from sie.core.registry import subject_token

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
        ConfigError: naming the file and the offending keys, a duplicate ``sie_id``, or
            two ids with one NATS subject token (``sec/x.y`` and ``sec/x_dot_y``,
            architecture §8.2): they would share one work subject.
    """
    out: dict[str, ModelConfig] = {}
    tokens: dict[str, tuple[str, str]] = {}  # subject token → (sie_id, file name)
    for name, data in read_yaml_dir(url):
        try:
            cfg = parse_model_config(data, what=f"{url}/{name}")
        except ConfigError as exc:
            raise ConfigError(exc.message) from exc
        if cfg.sie_id in out:
            raise ConfigError(f"{url}/{name}: duplicate sie_id {cfg.sie_id!r}")
        token = subject_token(cfg.sie_id)
        other = tokens.setdefault(token, (cfg.sie_id, name))
        if other[0] != cfg.sie_id:
            raise ConfigError(
                f"{url}/{name}: sie_id {cfg.sie_id!r} maps to the NATS subject token "
                f"{token!r} of {other[0]!r} ({other[1]}); rename one",
                field="sie_id",
            )
        out[cfg.sie_id] = cfg
    return list(out.values())
