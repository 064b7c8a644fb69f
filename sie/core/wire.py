"""Wire codec: msgpack for everything on the hot path (architecture §8.4).

This is the only module that imports ``ormsgpack``. Encoding uses ormsgpack;
numpy arrays are written in msgpack-numpy's extension-free map form with
**bin-type keys** (docs/api.md §1)::

    {b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [n, d], b"data": <raw LE C-order bytes>}

so a client using ``msgpack`` + ``msgpack_numpy`` decodes our payloads. Decoding
uses ``msgpack`` (ormsgpack cannot read bin map keys) with a hook that turns
either bin- or str-keyed ``nd`` maps back into read-only numpy arrays.

Message types: ``WorkItem`` (gateway → worker, JetStream), ``WorkResult``
(worker → gateway inbox, NATS Core), ``Heartbeat`` (worker → ``sie.health.*``).
Fields follow architecture §16.2 and architecture §8.4.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import msgpack
import numpy as np
import ormsgpack
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from sie.core.errors import WireError
from sie.core.model_status import MAX_ENGINE_NAME_CHARS, ModelLoadState, ModelStatus

__all__ = [
    "MAX_ENGINE_NAME_CHARS",
    "ConfigNotification",
    "GenerationChunk",
    "Heartbeat",
    "ModelLoadState",
    "ModelStatus",
    "WorkItem",
    "WorkResult",
    "packb",
    "salvage_reply",
    "unpackb",
]

_PACK_OPTS = ormsgpack.OPT_NON_STR_KEYS


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        if arr.dtype.kind in "OV":
            raise TypeError(f"cannot encode numpy dtype {arr.dtype}")
        if not arr.dtype.isnative and arr.dtype.byteorder != "|":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        return {
            b"nd": True,
            b"type": arr.dtype.str,
            b"kind": b"",
            b"shape": list(arr.shape),
            b"data": arr.tobytes(),
        }
    if isinstance(obj, np.generic):
        return {b"nd": False, b"type": obj.dtype.str, b"kind": b"", b"data": obj.tobytes()}
    raise TypeError(f"cannot encode {type(obj).__name__}")


def packb(obj: Any) -> bytes:
    """Encode ``obj`` as msgpack; numpy arrays/scalars become msgpack-numpy maps.

    Raises:
        WireError: an unencodable value.
    """
    try:
        return ormsgpack.packb(obj, default=_default, option=_PACK_OPTS)
    except (TypeError, ormsgpack.MsgpackEncodeError) as exc:
        raise WireError(f"cannot encode payload: {exc}") from exc


def _nd_hook(obj: dict[Any, Any]) -> Any:
    """Turn a msgpack-numpy map into an array; leave every other map alone.

    Raises:
        WireError: a map that claims to be an array (``nd`` bool, ``type`` str,
            ``data`` bytes) but whose dtype, shape or data do not fit.
    """
    if len(obj) not in (4, 5):
        return obj
    bin_keys = b"nd" in obj
    if not bin_keys and "nd" not in obj:
        return obj

    def get(key: str) -> Any:
        return obj.get(key.encode()) if bin_keys else obj.get(key)

    nd, type_str, data = get("nd"), get("type"), get("data")
    if not isinstance(nd, bool) or not isinstance(type_str, str) or not isinstance(data, bytes):
        return obj
    try:
        dtype = np.dtype(type_str)
        if dtype.kind in "OV":
            raise TypeError(f"dtype {type_str!r} is not allowed")
        if nd:
            shape = get("shape")
            if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
                raise ValueError(f"bad shape {shape!r}")
            return np.frombuffer(data, dtype=dtype).reshape(shape)
        return np.frombuffer(data, dtype=dtype, count=1)[0]
    except (TypeError, ValueError, IndexError) as exc:
        raise WireError(f"malformed msgpack-numpy array: {exc}") from exc


def unpackb(data: bytes) -> Any:
    """Decode msgpack; msgpack-numpy maps (bin or str keys) become numpy arrays.

    Raises:
        WireError: malformed msgpack.
    """
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, object_hook=_nd_hook)
    except (
        ValueError,
        TypeError,
        RecursionError,
        msgpack.UnpackException,
        msgpack.ExtraData,
    ) as exc:
        raise WireError(
            f"malformed msgpack body: {type(exc).__name__}: {exc}".rstrip(": ")
        ) from exc


def salvage_reply(data: bytes) -> tuple[str, WorkResult] | None:
    """For a work item that does not decode: ``(reply_subject, error result)`` if its
    reply fields can still be read, else None."""
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:  # anything at all: this is the last-chance path
        return None
    if not isinstance(raw, dict):
        return None
    reply, rid, wid, idx = (
        raw.get(k) for k in ("reply_subject", "request_id", "work_item_id", "item_index")
    )
    if not (
        isinstance(reply, str)
        and isinstance(rid, str)
        and isinstance(wid, str)
        and isinstance(idx, int)
    ):
        return None
    return reply, WorkResult(
        work_item_id=wid,
        request_id=rid,
        item_index=idx,
        success=False,
        error="work item could not be decoded",
        error_code="INVALID_PAYLOAD",
    )


T = TypeVar("T", bound="_Message")
_BASIC: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "int": int,
    "bool": bool,
    "float": (int, float),
}


_FIELDS: dict[type, tuple[tuple[str, ...], frozenset[str], tuple[Any, ...]]] = {}


def _fields_of(cls: type) -> tuple[tuple[str, ...], frozenset[str], tuple[Any, ...]]:
    """A message class's field names in order, as a set, and ``(name, type name,
    accepted types)`` of those with a basic type; computed once per class
    (``dataclasses.fields`` costs microseconds, and every work item, result and
    heartbeat is encoded or decoded)."""
    got = _FIELDS.get(cls)
    if got is None:
        names = tuple(f.name for f in fields(cls))
        checks = tuple(
            (f.name, str(f.type), want)
            for f in fields(cls)
            if (want := _BASIC.get(str(f.type))) is not None
        )
        got = _FIELDS[cls] = (names, frozenset(names), checks)
    return got


@dataclass(slots=True)
class _Message:
    """Base: dataclass ↔ msgpack map with named fields; None fields are omitted."""

    def to_map(self) -> dict[str, Any]:
        # Field values are plain msgpack data already: no deep copy (asdict) on the hot path.
        return {n: v for n in _fields_of(type(self))[0] if (v := getattr(self, n)) is not None}

    def to_bytes(self) -> bytes:
        return packb(self.to_map())

    @classmethod
    def from_map(cls: type[T], data: Any) -> T:
        return _decode(cls, data)

    @classmethod
    def from_bytes(cls: type[T], data: bytes) -> T:
        return cls.from_map(unpackb(data))


def _decode(cls: type[T], data: Any) -> T:
    """``cls(**data)`` with the basic field types checked (``_Message.from_map``).

    Raises:
        WireError: not a map, a field of the wrong type, or a missing field.
    """
    if not isinstance(data, dict):
        raise WireError(f"{cls.__name__}: expected a map, got {type(data).__name__}")
    _, names, checks = _fields_of(cls)
    for name, type_name, want in checks:
        if name in data and not isinstance(data[name], want):
            raise WireError(
                f"{cls.__name__}.{name}: expected {type_name}, got {type(data[name]).__name__}"
            )
    try:
        return cls(**{k: v for k, v in data.items() if k in names})
    except TypeError as exc:
        raise WireError(f"{cls.__name__}: {exc}") from exc


@dataclass(slots=True)
class WorkItem(_Message):
    """One unit of work on ``sie.work.{pool}.{profile}.{bundle}.{model}`` (§16.2).

    Encode and extract fan out one work item per input item; a score request is one
    work item carrying the query and every candidate (architecture §8.4). ``item`` /
    ``query_item`` / ``score_items`` are wire Item maps (docs/api.md §1: ``id``,
    ``text``, ...); ``labels`` are extract's entity types. ``timestamp`` is epoch seconds.
    """

    work_item_id: str
    request_id: str
    item_index: int
    total_items: int
    operation: str
    model_id: str
    profile_id: str
    pool_name: str
    router_id: str
    reply_subject: str
    timestamp: float = field(default_factory=time.time)
    admission_pool: str | None = None
    machine_profile: str | None = None
    bundle_config_hash: str | None = None
    item: dict[str, Any] | None = None
    output_types: list[str] | None = None
    instruction: str | None = None
    is_query: bool | None = None
    options: dict[str, Any] | None = None
    query_item: dict[str, Any] | None = None
    score_items: list[dict[str, Any]] | None = None
    labels: list[str] | None = None
    output_schema: dict[str, Any] | None = None
    accepts_result_chunks: bool | None = None  # result_chunk_v1 (sie.core.chunks)
    payload_ref: str | None = None  # the whole item in the payload store (docs/api.md §12)
    traceparent: str | None = None
    tracestate: str | None = None


@dataclass(slots=True)
class WorkResult(_Message):
    """A worker's answer for one work item, published on the request's inbox.

    ``result_msgpack`` holds the msgpack-encoded result (encode: one item's
    ``{"dense"|"sparse"|"multivector": {...}}``; score: ``{"scores": [float]}`` in
    candidate order; extract: one item's ``{"entities": [...], ...}``). Times are
    milliseconds.
    ``input_tokens`` is the item's token count after truncation.
    """

    work_item_id: str
    request_id: str
    item_index: int
    success: bool
    result_msgpack: bytes | None = None
    error: str | None = None
    error_code: str | None = None
    error_field: str | None = None  # the request field an INVALID_INPUT error names
    error_details: dict[str, Any] | None = None  # MODEL_LOAD_FAILED: error_class, attempts, ...
    inference_ms: float | None = None
    queue_ms: float | None = None
    tokenization_ms: float | None = None
    processing_ms: float | None = None
    worker_id: str | None = None
    input_tokens: int | None = None
    bundle_config_hash: str | None = None
    payload_fetch_ms: float | None = None  # fetching a payload_ref'd item
    direct_origin: bool | None = None  # True: taken from the worker's direct stream (§8)

    def result(self) -> dict[str, Any]:
        """Decode ``result_msgpack``.

        Raises:
            WireError: missing or malformed result payload.
        """
        if self.result_msgpack is None:
            raise WireError("WorkResult has no result_msgpack")
        out = unpackb(self.result_msgpack)
        if not isinstance(out, dict):
            raise WireError("WorkResult.result_msgpack is not a map")
        return out


@dataclass(slots=True)
class GenerationChunk(_Message):
    """One piece of a generation stream, on the request's inbox (architecture §8.2,
    §15.1). ``seq`` counts from 0 per request with no gaps: the gateway fails the
    stream on a gap rather than emit text out of order. ``seq`` 0 is the worker's
    acceptance (no text). The last chunk has ``done`` set and carries
    ``finish_reason`` (``stop`` / ``length``) and the token counts, or ``error`` /
    ``error_code`` (and ``error_field``) when the request failed. ``logprobs``: one map
    per token the chunk accounts for, when asked for (OpenAI's chat shape; docs/api.md §5.1).
    """

    request_id: str
    seq: int
    text: str = ""
    done: bool = False
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    error_code: str | None = None
    error_field: str | None = None
    worker_id: str | None = None
    logprobs: list[Any] | None = None
    generation: bool = True  # tells a chunk from a WorkResult on the shared inbox


@dataclass(slots=True)
class Heartbeat(_Message):
    """Worker liveness on ``sie.health.{worker_id}`` (architecture §8, last one wins).

    ``models``: every model the worker knows, typed (``ModelStatus``); a heartbeat
    with a malformed entry is refused whole (``WireError``).
    """

    worker_id: str
    pool: str
    machine_profile: str
    bundle: str
    ready: bool
    models: list[ModelStatus] = field(default_factory=list)
    bundle_config_hash: str = ""
    timestamp: float = field(default_factory=time.time)
    interval_s: float = 1.0

    def to_map(self) -> dict[str, Any]:
        out = _Message.to_map(self)
        out["models"] = [m.to_map() for m in self.models]
        return out

    @classmethod
    def from_map(cls, data: Any) -> Heartbeat:
        models = data.get("models", []) if isinstance(data, dict) else []
        if not isinstance(models, list):
            raise WireError("Heartbeat.models: expected a list")
        hb = _decode(cls, data)
        hb.models = [ModelStatus.from_map(m) for m in models]
        return hb


class ConfigNotification(BaseModel):
    """A config delta on ``sie.config.models.{bundle}`` and ``sie.config.models._all``.

    JSON (architecture §8.3, §8.4). ``router_id`` is the producer's id (also read
    from the alias ``producer_id``); ``model_config`` is the full merged model YAML,
    or blank for a pure epoch bump (§4.3). Unknown fields are ignored so newer
    producers stay readable.
    """

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    router_id: str = Field(validation_alias=AliasChoices("router_id", "producer_id"))
    bundle_id: str
    epoch: int = Field(ge=0)
    bundle_config_hash: str = ""
    bundle_pool_config_hashes: dict[str, dict[str, str]] = Field(default_factory=dict)
    model_id: str = ""
    pool: str = "default"
    profiles_added: list[str] = Field(default_factory=list)
    model_config_yaml: str = Field(
        default="",
        validation_alias=AliasChoices("model_config"),
        serialization_alias="model_config",
    )
    affected_bundles: list[str] = Field(default_factory=list)

    def to_bytes(self) -> bytes:
        """Compact UTF-8 JSON with the wire key names."""
        return self.model_dump_json(by_alias=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ConfigNotification:
        """Parse one notification.

        Raises:
            WireError: not JSON, or a field of the wrong type.
        """
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            raise WireError(f"ConfigNotification: {exc.errors()[0]['msg']}") from exc
