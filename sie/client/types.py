"""Shapes the SDK takes and returns (docs/sdk.md "Types"): plain dicts, typed.

Vectors are numpy arrays: ``EncodeResult["dense"]`` is ``ndarray[dims]`` (float32
unless another ``output_dtype`` was asked for; ``binary`` is bit-packed uint8),
``multivector`` is ``ndarray[num_tokens, token_dims]``, ``sparse`` is
``{"indices": ndarray[int], "values": ndarray[float]}``.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "CapacityInfo",
    "ChatMessage",
    "Classification",
    "DType",
    "EncodeResult",
    "Entity",
    "ExtractResult",
    "Item",
    "ModelInfo",
    "ModelState",
    "PoolInfo",
    "PoolSpec",
    "Relation",
    "ScoreEntry",
    "ScoreResult",
    "SparseVector",
    "Timing",
]

OutputType = Literal["dense", "sparse", "multivector"]
OutputDType = Literal["float32", "float16", "int8", "uint8", "binary", "ubinary"]
DType = Literal["float32", "float16", "bfloat16", "int8", "uint8", "binary", "ubinary"]
ModelState = Literal["available", "loading", "loaded", "unloading", "failed"]


class ImageInput(TypedDict, total=False):
    data: bytes
    format: str | None


class DocumentInput(TypedDict, total=False):
    data: bytes
    format: str | None


class Item(TypedDict, total=False):
    """One input. ``id`` is echoed in its result. ``images`` entries may also be
    paths, PIL images or arrays (sent as JPEG); ``document`` a path (extract)."""

    id: str
    text: str
    images: list[Any]
    document: Any
    metadata: dict[str, Any]


class SparseVector(TypedDict):
    indices: NDArray[np.integer[Any]]
    values: NDArray[np.floating[Any]]


class Timing(TypedDict, total=False):
    """Milliseconds, from the response's timing headers (docs/api.md §1)."""

    total_ms: float
    queue_ms: float
    tokenization_ms: float
    inference_ms: float


class EncodeResult(TypedDict, total=False):
    id: str
    dense: NDArray[Any]
    sparse: SparseVector
    multivector: NDArray[Any]
    timing: Timing


class ScoreEntry(TypedDict):
    item_id: str
    score: float
    rank: int


class ScoreResult(TypedDict, total=False):
    model: str
    query_id: str | None
    scores: list[ScoreEntry]


class Entity(TypedDict, total=False):
    text: str
    label: str
    score: float
    start: int | None
    end: int | None
    bbox: list[float] | None


class Relation(TypedDict, total=False):
    head: str
    tail: str
    relation: str
    score: float


class Classification(TypedDict, total=False):
    label: str
    score: float


class ExtractResult(TypedDict, total=False):
    id: str
    entities: list[Entity]
    relations: list[Relation]
    classifications: list[Classification]
    objects: list[dict[str, Any]]
    data: dict[str, Any]


class ModelInfo(TypedDict, total=False):
    """``GET /v1/models`` entries (docs/api.md §7)."""

    name: str
    inputs: list[str]
    outputs: list[str]
    dims: dict[str, int]
    loaded: bool
    state: ModelState
    last_error: dict[str, Any] | None
    max_sequence_length: int | None
    profiles: dict[str, dict[str, bool]]
    bundles: list[str]
    pool: str | None


class CapacityInfo(TypedDict, total=False):
    """What the gateway can serve now (``GET /health``; filtered by ``gpu``)."""

    status: str
    configured_gpu_types: list[str]
    live_gpu_types: list[str]
    worker_count: int
    gpu_count: int
    models_loaded: int
    total_qps: float
    workers: list[dict[str, Any]]


class PoolSpec(TypedDict, total=False):
    """``POST /v1/pools`` (docs/pools.md "The API")."""

    name: str
    gpus: dict[str, int]
    gpu_caps: dict[str, int] | None
    bundle: str | None
    queue_pool: str | None
    ttl_seconds: int | None
    minimum_worker_count: int
    pinned_models: list[str]


class PoolInfo(TypedDict, total=False):
    spec: PoolSpec
    status: dict[str, Any]


class ChatMessage(TypedDict, total=False):
    role: str
    content: str
