"""What the SDK puts on the wire: msgpack with numpy arrays, request headers, the
``gpu`` routing form and the version-skew check (docs/sdk.md "Wire"; docs/api.md §1).

Bodies of encode, score and extract travel as msgpack both ways. numpy arrays are
msgpack-numpy maps with **bin** keys (``{b"nd": True, b"type": "<f4", b"kind": b"",
b"shape": [...], b"data": <raw bytes>}``), as the server writes them; decoding also
accepts str keys. Decoded arrays are read-only views of the response bytes (copy one
to change it).
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

from sie import __version__

__all__ = [
    "JSON",
    "MSGPACK",
    "SDK_VERSION",
    "VersionSkewWarning",
    "base_headers",
    "check_version_skew",
    "is_skewed",
    "pack",
    "routing_headers",
    "split_gpu",
    "unpack",
]

log = logging.getLogger("sie.client")

MSGPACK = "application/msgpack"
JSON = "application/json"
#: The SDK's version: the ``sie`` package it ships in.
SDK_VERSION = __version__


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        if arr.dtype.kind in "OV":
            raise TypeError(f"cannot send a numpy array of dtype {arr.dtype}")
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        return {
            b"nd": True,
            b"type": arr.dtype.str,
            b"kind": b"",
            b"shape": list(arr.shape),
            b"data": arr.tobytes(),
        }
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot send a {type(obj).__name__} in a request body")


def pack(obj: Any) -> bytes:
    """``obj`` as msgpack (numpy arrays as msgpack-numpy maps).

    Raises:
        TypeError: a value msgpack cannot carry.
    """
    out: bytes = msgpack.packb(obj, use_bin_type=True, default=_default)
    return out


def _nd(obj: dict[Any, Any]) -> Any:
    if b"nd" in obj:
        nd, type_str, data, shape = (
            obj[b"nd"],
            obj.get(b"type"),
            obj.get(b"data"),
            obj.get(b"shape"),
        )
    elif "nd" in obj and len(obj) in (4, 5):
        nd, type_str, data, shape = obj["nd"], obj.get("type"), obj.get("data"), obj.get("shape")
    else:
        return obj
    if not isinstance(nd, bool) or not isinstance(type_str, str) or not isinstance(data, bytes):
        return obj
    dtype = np.dtype(type_str)
    if dtype.kind in "OV":
        raise ValueError(f"refusing a msgpack-numpy array of dtype {type_str!r}")
    if not nd:
        return np.frombuffer(data, dtype=dtype, count=1)[0]
    if not isinstance(shape, list):
        raise ValueError("msgpack-numpy array without a shape")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def unpack(data: bytes) -> Any:
    """Decode a msgpack body; msgpack-numpy maps become numpy arrays.

    Raises:
        ValueError: not msgpack, or an array whose dtype, shape or data do not fit.
    """
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, object_hook=_nd)
    except (msgpack.UnpackException, msgpack.ExtraData, TypeError) as exc:
        raise ValueError(f"malformed msgpack body: {exc}") from exc


def base_headers(api_key: str | None) -> dict[str, str]:
    """Headers every request carries: the SDK version and, with a key, the bearer token."""
    headers = {"X-SIE-SDK-Version": SDK_VERSION, "User-Agent": f"sie-sdk/{SDK_VERSION}"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def split_gpu(gpu: str | None) -> tuple[str | None, str | None]:
    """``"pool/profile"`` → ``(pool, profile)``; ``"l4"`` → ``(None, "l4")``;
    ``"pool/"`` → ``(pool, None)``; None or empty → ``(None, None)``."""
    if not gpu or not gpu.strip():
        return None, None
    pool, sep, profile = gpu.strip().partition("/")
    if not sep:
        return None, pool
    return (pool.strip() or None), (profile.strip() or None)


def routing_headers(gpu: str | None) -> dict[str, str]:
    """``X-SIE-Pool`` / ``X-SIE-Machine-Profile`` for a ``gpu`` value (docs/pools.md)."""
    pool, profile = split_gpu(gpu)
    headers = {}
    if pool:
        headers["X-SIE-Pool"] = pool
    if profile:
        headers["X-SIE-Machine-Profile"] = profile
    return headers


def _major_minor(version: str) -> tuple[int, int] | None:
    parts = version.strip().lstrip("v").split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except (ValueError, IndexError):
        return None


def is_skewed(client_version: str, server_version: str) -> bool:
    """Whether two versions are out of the supported skew: another major version, or
    minor versions more than one apart. Unparseable versions are never skewed."""
    a, b = _major_minor(client_version), _major_minor(server_version)
    if a is None or b is None:
        return False
    return a[0] != b[0] or abs(a[1] - b[1]) > 1


class VersionSkewWarning(UserWarning):
    """The server's version is outside the SDK's supported skew (docs/sdk.md "Versions")."""


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def check_version_skew(headers: Mapping[str, str], client_version: str = SDK_VERSION) -> bool:
    """Warn (``VersionSkewWarning``, and a log line) once per process for each server
    version outside the skew; never raises. Returns whether this call warned."""
    server = headers.get("x-sie-server-version") or headers.get("x-sie-version")
    if not server or not is_skewed(client_version, server):
        return False
    key = (client_version, server)
    with _warned_lock:
        if key in _warned:
            return False
        _warned.add(key)
    text = (
        f"SIE server version {server} and SDK version {client_version} differ by more than "
        "one minor version (or in the major): upgrade the older one (docs/sdk.md)"
    )
    log.warning(text)
    warnings.warn(text, VersionSkewWarning, stacklevel=4)
    return True
