"""ConfigStore: durable model configs and the epoch on fsspec (architecture §9).

Layout under ``base`` (any fsspec URL: a local path, ``memory://``, ``s3://``,
``gs://`` when that backend's package is installed)::

    {base}/models/{model_id with "/" replaced by "__"}.yaml
    {base}/epoch                       plain-text integer

Local writes are atomic (temp file in the same directory, fsync, ``os.replace``);
object stores get a single whole-object PUT. Every stored model file starts with
a ``# sie-epoch: N`` comment (the epoch its write produced), so a malformed or
empty ``epoch`` file is *repaired* to the highest epoch any model records instead
of being read as 0 forever (the drift-detection failure §9 warns about).

All methods are blocking I/O: call them from a worker thread.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from pathlib import Path

import fsspec
from fsspec.implementations.local import LocalFileSystem

from sie.core.config import load_yaml, validate_model_id
from sie.core.errors import ConfigError, ContentConflict, StoreUnavailable

__all__ = ["ConfigStore", "model_file_name"]

log = logging.getLogger(__name__)

_EPOCH_HEADER = re.compile(rb"\A# sie-epoch: (\d+)\n")


def model_file_name(model_id: str) -> str:
    """``org/model`` → ``org__model.yaml`` (architecture §9).

    Ids never contain ``__``, but ``a_/b`` and ``a/_b`` still share a file name:
    ``write_model`` refuses the second one, and listings read ids from file content.

    Raises:
        InvalidModelId: an invalid id.
    """
    validate_model_id(model_id)
    return model_id.replace("/", "__") + ".yaml"


def _stored_id(data: bytes) -> str | None:
    """The ``sie_id`` a stored file holds, or None if unreadable."""
    try:
        sie_id = load_yaml(data, what="stored model").get("sie_id")
    except ConfigError:
        return None
    return sie_id if isinstance(sie_id, str) else None


class ConfigStore:
    """Model configs and the epoch under one fsspec base URL."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.fs, root = fsspec.core.url_to_fs(self.url)
        self.root = root.rstrip("/")
        self._local = isinstance(self.fs, LocalFileSystem)

    def _path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    # -- low level -----------------------------------------------------------------------

    def _write(self, path: str, data: bytes) -> None:
        try:
            if self._local:
                p = Path(path)
                p.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
                try:
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(tmp, p)
                except BaseException:
                    Path(tmp).unlink(missing_ok=True)
                    raise
            else:
                self.fs.pipe_file(path, data)
        except OSError as exc:
            raise StoreUnavailable(f"config store write {path!r} failed: {exc}") from exc

    def _read(self, path: str) -> bytes | None:
        try:
            return bytes(self.fs.cat_file(path))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreUnavailable(f"config store read {path!r} failed: {exc}") from exc

    # -- models --------------------------------------------------------------------------

    def write_model(self, model_id: str, yaml_text: str, epoch: int) -> None:
        """Persist one model's full YAML, stamped with the epoch this write produces.

        Raises:
            InvalidModelId: see ``model_file_name``.
            StoreUnavailable: the write failed (the old file, if any, is intact).
        """
        path = self._path("models", model_file_name(model_id))
        current = self._read(path)
        owner = _stored_id(current) if current is not None else None
        if owner is not None and owner != model_id:
            raise ContentConflict(
                f"sie_id {model_id!r} maps to the same store file as the stored model "
                f"{owner!r}; choose another id",
                field="sie_id",
                conflicting_model=owner,
            )
        self._write(path, f"# sie-epoch: {epoch}\n".encode() + yaml_text.encode())

    def read_model_raw(self, model_id: str) -> bytes | None:
        """The stored file exactly as on disk (epoch stamp included), or None."""
        return self._read(self._path("models", model_file_name(model_id)))

    def write_model_raw(self, model_id: str, data: bytes) -> None:
        """Put back bytes from ``read_model_raw`` (a rollback). Raises: StoreUnavailable."""
        self._write(self._path("models", model_file_name(model_id)), data)

    def read_model(self, model_id: str) -> str | None:
        """The stored YAML (without the epoch stamp), or None."""
        data = self._read(self._path("models", model_file_name(model_id)))
        return None if data is None else _EPOCH_HEADER.sub(b"", data).decode()

    def delete_model(self, model_id: str) -> None:
        """Remove a stored model (used only to roll back a failed write)."""
        try:
            self.fs.rm_file(self._path("models", model_file_name(model_id)))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StoreUnavailable(f"config store delete failed: {exc}") from exc

    def _model_files(self) -> list[str]:
        path = self._path("models")
        try:
            if not self.fs.isdir(path):
                return []
            names = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreUnavailable(f"config store list failed: {exc}") from exc
        return sorted(
            str(n)
            for n in names
            if str(n).endswith(".yaml") and not str(n).rsplit("/", 1)[-1].startswith(".")
        )

    def load_all(self) -> list[tuple[str, str]]:
        """``[(model_id, yaml_text)]`` for every stored model (for restore), sorted by id.
        The id is the file's ``sie_id`` (the file name when it has none)."""
        out = []
        for f in self._model_files():
            data = self._read(f)
            if data is None:
                continue
            fallback = f.rsplit("/", 1)[-1][: -len(".yaml")].replace("__", "/")
            out.append((_stored_id(data) or fallback, _EPOCH_HEADER.sub(b"", data).decode()))
        return sorted(out)

    def list_models(self) -> list[str]:
        """Stored model ids, sorted."""
        return [model_id for model_id, _ in self.load_all()]

    # -- epoch ---------------------------------------------------------------------------

    def _max_model_epoch(self) -> int:
        best = 0
        for f in self._model_files():
            data = self._read(f) or b""
            m = _EPOCH_HEADER.match(data)
            if m:
                best = max(best, int(m.group(1)))
        return best

    def read_epoch(self) -> int:
        """The stored epoch. A missing file with no stored models is 0; a missing,
        empty or malformed file otherwise is repaired (rewritten) to the highest
        epoch recorded by any stored model, and never lower than that.

        Raises:
            StoreUnavailable: the store cannot be read.
        """
        data = self._read(self._path("epoch"))
        text = (data or b"").strip()
        if text.isdigit():
            value = int(text)
            floor = self._max_model_epoch()
            if value >= floor:
                return value
            log.error("config store epoch %d is behind its models (%d): repairing", value, floor)
            self.write_epoch(floor)
            return floor
        floor = self._max_model_epoch()
        if data is None and floor == 0:
            return 0
        log.error(
            "config store epoch file is %s: repairing it to %d from the stored models",
            "missing" if data is None else f"malformed ({text[:40]!r})",
            floor,
        )
        self.write_epoch(floor)
        return floor

    def write_epoch(self, epoch: int) -> None:
        """Raises: StoreUnavailable."""
        self._write(self._path("epoch"), f"{epoch}\n".encode())
