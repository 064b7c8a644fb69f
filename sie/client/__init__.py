"""The SIE Python SDK (docs/sdk.md): ``SIEClient`` (blocking) and ``SIEAsyncClient``
(async), both on httpx, msgpack on the wire and numpy arrays in results.

    from sie.client import SIEClient

    with SIEClient("http://localhost:8080") as client:
        r = client.encode("sentence-transformers/all-MiniLM-L6-v2", {"text": "hello"})
        r["dense"]  # numpy float32[384]

Retries follow docs/sdk.md "Retries": ``Retry-After`` honoured within a per-call time
budget, ``MODEL_LOAD_FAILED`` never retried, out-of-memory answers backed off.
"""

from sie.client.aio import SIEAsyncClient
from sie.client.errors import (
    LoraLoadingError,
    ModelLoadFailedError,
    ModelLoadingError,
    PoolError,
    ProvisioningError,
    RequestError,
    ResourceExhaustedError,
    ServerError,
    SIEConnectionError,
    SIEError,
    StatusError,
)
from sie.client.helpers import (
    dense_embedding,
    maxsim,
    maxsim_batch,
    multivector_embedding,
    normalize_sparse_vector,
    sparse_embedding,
    sparse_embedding_dict,
)
from sie.client.sync import SIEClient
from sie.client.types import (
    CapacityInfo,
    EncodeResult,
    ExtractResult,
    Item,
    ModelInfo,
    PoolInfo,
    PoolSpec,
    ScoreResult,
)
from sie.client.wire import SDK_VERSION, VersionSkewWarning

__all__ = [
    "SDK_VERSION",
    "CapacityInfo",
    "EncodeResult",
    "ExtractResult",
    "Item",
    "LoraLoadingError",
    "ModelInfo",
    "ModelLoadFailedError",
    "ModelLoadingError",
    "PoolError",
    "PoolInfo",
    "PoolSpec",
    "ProvisioningError",
    "RequestError",
    "ResourceExhaustedError",
    "SIEAsyncClient",
    "SIEClient",
    "SIEConnectionError",
    "SIEError",
    "ScoreResult",
    "ServerError",
    "StatusError",
    "VersionSkewWarning",
    "dense_embedding",
    "maxsim",
    "maxsim_batch",
    "multivector_embedding",
    "normalize_sparse_vector",
    "sparse_embedding",
    "sparse_embedding_dict",
]
