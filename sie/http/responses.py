"""Response bodies of the gateway's inference, model and generation routes, as pydantic
models: the one description ``sie.http.openapi`` publishes at ``/openapi.json``
(docs/api.md §2-§7, §14).

Handlers build these bodies as plain dicts on the hot path; the models say what the
dicts hold, and the schemathesis run over the live gateway (``tests/integration/
test_openapi_live.py``) checks every answer against them. Fields a route always sends
are required (nullable where ``null`` is a value); fields it sends only sometimes are
optional. Extra keys are allowed, so a field added to a reply never breaks a client.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChatChoice",
    "ChatCompletion",
    "ChatMessage",
    "DenseVector",
    "EmbeddingData",
    "EmbeddingsResponse",
    "EncodeResponse",
    "EncodedItem",
    "Entity",
    "ExtractResponse",
    "ExtractedItem",
    "GenerateResponse",
    "ModelInfo",
    "ModelList",
    "ModelObject",
    "MultivectorValues",
    "OpenAIModel",
    "ProfileInfo",
    "ScoreEntry",
    "ScoreResponse",
    "SparseVector",
    "TextChoice",
    "TextCompletion",
    "Usage",
]


class Reply(BaseModel):
    """Base of the response models: other keys may appear beside the documented ones."""

    model_config = ConfigDict(extra="allow")


Number = float | int


class DenseVector(Reply):
    """One dense vector (docs/api.md §2.1): ``dims`` is the model's width even when the
    values are bit-packed (``binary``: ``dims / 8`` bytes as integers)."""

    dims: int
    dtype: str = Field(description="float32, float16, int8, uint8 or binary")
    values: list[Number]


class SparseVector(Reply):
    """Vocabulary indices (ascending) and their weights (> 0)."""

    dims: int | None
    dtype: str
    indices: list[int]
    values: list[Number]


class MultivectorValues(Reply):
    """One vector per real token, ``[num_tokens][token_dims]`` (quantised per token)."""

    token_dims: int
    num_tokens: int
    dtype: str
    values: list[list[Number]]


class EncodedItem(Reply):
    """One item's outputs, in request order; ``id`` only when the item had one."""

    id: str | None = None
    dense: DenseVector | None = None
    sparse: SparseVector | None = None
    multivector: MultivectorValues | None = None


class EncodeResponse(Reply):
    """``POST /v1/encode/{model}`` (docs/api.md §2)."""

    model: str
    items: list[EncodedItem]


class ScoreEntry(Reply):
    item_id: str = Field(description="the item's id, or item-{i} (its index)")
    score: float
    rank: int = Field(ge=0, description="0 is the best")


class ScoreResponse(Reply):
    """``POST /v1/score/{model}`` (docs/api.md §3): every item (or the best ``top_k``),
    best first; equal scores keep input order."""

    model: str
    query_id: str | None
    scores: list[ScoreEntry]


class Entity(Reply):
    """``start`` / ``end`` are character offsets into the item's text."""

    text: str
    label: str
    score: float
    start: int | None = None
    end: int | None = None


class ExtractedItem(Reply):
    """Every key is present, empty when the model found nothing of that kind."""

    id: str
    entities: list[Entity]
    relations: list[dict[str, Any]]
    classifications: list[dict[str, Any]]
    objects: list[dict[str, Any]]
    data: dict[str, Any]


class ExtractResponse(Reply):
    """``POST /v1/extract/{model}`` (docs/api.md §4)."""

    model: str
    items: list[ExtractedItem]


class EmbeddingData(Reply):
    object: Literal["embedding"]
    embedding: list[float] | str = Field(
        description="floats, or base64 of little-endian float32 with encoding_format=base64"
    )
    index: int


class Usage(Reply):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int | None = None


class EmbeddingsResponse(Reply):
    """OpenAI ``POST /v1/embeddings`` (docs/api.md §6); ``usage`` counts the tokens read."""

    object: Literal["list"]
    data: list[EmbeddingData]
    model: str
    usage: Usage


class ChatMessage(Reply):
    role: str
    content: str | None


class ChatChoice(Reply):
    index: int
    message: ChatMessage
    finish_reason: str | None
    logprobs: Any = None


class ChatCompletion(Reply):
    """OpenAI ``chat.completion`` (docs/api.md §5). With ``stream: true`` the answer is
    ``text/event-stream`` of ``chat.completion.chunk`` objects, then ``data: [DONE]``."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class TextChoice(Reply):
    index: int
    text: str
    finish_reason: str | None
    logprobs: Any = None


class TextCompletion(Reply):
    """OpenAI ``text_completion`` (``POST /v1/completions``)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage


class GenerateResponse(Reply):
    """SIE-native ``POST /v1/generate/{model}``."""

    model: str
    text: str
    finish_reason: str | None
    usage: Usage


class OpenAIModel(Reply):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ProfileInfo(Reply):
    is_default: bool


class ModelInfo(Reply):
    """A served model id (docs/api.md §7): its task outputs, its state over the live
    workers (``available``, ``loading``, ``loaded``, ``unloading``, ``failed``), the
    routing facts ``bundles`` / ``pool``, and ``engines``: the engines the workers serve
    it with when its profile picks one at load (``fastest``), else empty."""

    name: str
    inputs: list[str]
    outputs: list[str]
    dims: dict[str, int]
    loaded: bool
    state: str
    last_error: dict[str, Any] | None
    max_sequence_length: int | None
    profiles: dict[str, ProfileInfo]
    bundles: list[str]
    pool: str
    loads: int
    evictions: int
    engines: list[str]


class ModelObject(ModelInfo):
    """``GET /v1/models/{model}``: OpenAI's model object (``id``, ``object``, ``created``,
    ``owned_by``) with ModelInfo's fields beside it."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(Reply):
    """``GET /v1/models``: the OpenAI list (``data``) and SIE's ``models`` side by side."""

    object: Literal["list"]
    data: list[OpenAIModel]
    models: list[ModelInfo]
