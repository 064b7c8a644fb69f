"""The payload store: work-item bodies too large for one bus message, by reference
(``payload_ref``; docs/api.md §12, architecture §16.2 step 2).

The gateway ``put``s a work item that does not fit the bus's ``max_payload`` under a
key, publishes a slim item naming that key, and ``delete``s the key when the request
ends. The worker ``get``s it. Keys are relative to the store's root
(``SIE_PAYLOAD_STORE_URL``): the gateway and its workers must be given the same root,
and a worker never reads outside its own root, whatever a work item names.

``FsspecPayloadStore`` works on any fsspec URL: ``memory://…`` (one process: the
embedded default), a local directory (processes on one machine), ``s3://…`` / ``gs://…``
when that backend's package is installed. ``tests/contract/test_payload_store.py``
runs the port's contract over the memory and local adapters.
"""

from __future__ import annotations

import re
import time
from typing import Any, Protocol

import anyio.to_thread
import fsspec
from fsspec.implementations.memory import MemoryFileSystem

from sie.core.errors import PayloadUnavailable

__all__ = [
    "FsspecPayloadStore",
    "PayloadStore",
    "payload_key",
]

#: A key: up to four ``/``-separated parts, none starting with a dot, nothing that
#: could climb out of the root.
_KEY = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.:-]{0,299}(/[A-Za-z0-9_-][A-Za-z0-9_.:-]{0,299}){0,3}")


def payload_key(router_id: str, request_id: str, item_index: int) -> str:
    """The key of one offloaded work item: flat (``{router_id}.{request_id}.{index}``),
    so deleting it leaves no empty directory behind."""
    return f"{router_id}.{request_id}.{item_index}"


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not _KEY.fullmatch(key) or ".." in key:
        raise PayloadUnavailable("payload_ref is not a valid payload key")
    return key


class PayloadStore(Protocol):
    """Bytes by key under one root. Every method may raise ``PayloadUnavailable``."""

    url: str

    async def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` (overwrites)."""
        ...

    async def get(self, key: str) -> bytes:
        """The bytes under ``key``.

        Raises:
            PayloadUnavailable: no such key, an invalid key, or the store failed.
        """
        ...

    async def delete(self, keys: list[str]) -> None:
        """Remove ``keys``; missing ones are not an error."""
        ...

    async def sweep(self, older_than_s: float) -> int:
        """Remove every payload stored more than ``older_than_s`` seconds ago (left
        behind by a gateway that died); returns how many were removed."""
        ...


class FsspecPayloadStore:
    """``PayloadStore`` on an fsspec URL. Blocking filesystems run on worker threads;
    the in-process memory filesystem is called directly."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        fs, root = fsspec.core.url_to_fs(self.url)
        self.fs: Any = fs
        self.root = root.rstrip("/")
        self._inline = isinstance(fs, MemoryFileSystem)
        # stored-at times for the memory filesystem, which keeps no usable mtime
        self._stored_at: dict[str, float] = {}

    def _path(self, key: str) -> str:
        return f"{self.root}/{_check_key(key)}"

    async def _call(self, fn: Any, *args: Any) -> Any:
        try:
            if self._inline:
                return fn(*args)
            return await anyio.to_thread.run_sync(fn, *args)
        except FileNotFoundError as exc:
            raise PayloadUnavailable("payload not found in the payload store") from exc
        except OSError as exc:
            raise PayloadUnavailable(f"payload store error: {type(exc).__name__}") from exc

    def _put(self, path: str, data: bytes) -> None:
        parent = path.rsplit("/", 1)[0]
        self.fs.makedirs(parent, exist_ok=True)
        self.fs.pipe_file(path, data)

    async def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        await self._call(self._put, path, data)
        if self._inline:
            self._stored_at[path] = time.time()

    async def get(self, key: str) -> bytes:
        data = await self._call(self.fs.cat_file, self._path(key))
        return bytes(data)

    def _delete(self, paths: list[str]) -> None:
        for path in paths:
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                pass
            self._stored_at.pop(path, None)

    async def delete(self, keys: list[str]) -> None:
        if keys:
            await self._call(self._delete, [self._path(k) for k in keys])

    def _sweep(self, older_than_s: float) -> int:
        cutoff = time.time() - older_than_s
        try:
            found = self.fs.find(self.root, detail=True)
        except FileNotFoundError:
            return 0
        old = []
        for path, info in found.items():
            at = self._stored_at.get(path)
            if at is None:
                mtime = info.get("mtime") or info.get("created") or info.get("LastModified")
                at = mtime.timestamp() if hasattr(mtime, "timestamp") else mtime
            if isinstance(at, int | float) and at < cutoff:
                old.append(path)
        self._delete(old)
        return len(old)

    async def sweep(self, older_than_s: float) -> int:
        return int(await self._call(self._sweep, older_than_s))
