"""Request bodies of the gateway's HTTP API (docs/api.md §1-§6).

Unknown fields are ignored, as by the public server (docs/api.md §1); type
errors and missing required fields are 400 INVALID_INPUT naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
)

from sie.core.validation import Text

__all__ = [
    "EmbeddingsRequest",
    "EncodeOptions",
    "EncodeParams",
    "EncodeRequest",
    "ExtractParams",
    "ExtractRequest",
    "Item",
    "ResolveRequest",
    "RuntimeOptions",
    "ScoreRequest",
]

OutputType = Literal["dense", "sparse", "multivector"]
#: docs/api.md §2 (sie.engines.encoders.quantize)
OutputDtype = Literal["float32", "float16", "int8", "uint8", "binary", "ubinary"]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


def _text_required(schema: dict[str, Any]) -> None:
    """Every route reads text items only, so the API description (``/openapi.json``,
    docs/api.md §14) says ``text`` is required: the handlers refuse an item without it
    (400 naming ``items[i].text``), after this model's own checks."""
    schema["required"] = ["text"]
    schema["properties"]["text"] = {"type": "string", "title": "Text"}


class Item(_Lenient):
    """A wire item. ``id`` is echoed back; ``metadata`` is accepted, not echoed."""

    model_config = ConfigDict(extra="ignore", frozen=True, json_schema_extra=_text_required)

    id: Text | None = None
    text: Text | None = None
    metadata: dict[str, Any] | None = None


class RuntimeOptions(BaseModel):
    """Runtime options (docs/api.md §2-§4). Keys every engine shares are type-checked
    here; engine-specific keys pass through and the engine checks them."""

    model_config = ConfigDict(extra="allow", frozen=True)

    profile: StrictStr | None = None
    is_query: StrictBool | None = None
    instruction: StrictStr | None = None
    normalize: StrictBool | None = None
    query_template: StrictStr | None = None
    doc_template: StrictStr | None = None


class EncodeOptions(RuntimeOptions):
    output_types: list[OutputType] | None = Field(default=None, min_length=1)
    output_dtype: OutputDtype | None = None


class EncodeParams(_Lenient):
    output_types: list[OutputType] | None = Field(default=None, min_length=1)
    instruction: Text | None = None
    is_query: StrictBool | None = None
    output_dtype: OutputDtype | None = None
    options: EncodeOptions | None = None


class EncodeRequest(_Lenient):
    items: list[Item] = Field(min_length=1)
    params: EncodeParams | None = None


class EmbeddingsRequest(BaseModel):
    """OpenAI ``POST /v1/embeddings`` (docs/api.md §5.1, §6): unknown fields are refused.
    ``user`` is recorded as the request span's ``enduser.id``; ``truncate`` (TEI's
    name) and ``truncate_prompt_tokens`` (vLLM's: -1 = the model's limit, k >= 1 = at
    most k tokens) bound each input."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: StrictStr
    input: Text | list[Text]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: StrictInt | None = Field(default=None, gt=0)
    user: Text | None = None
    truncate: StrictBool | None = None
    truncate_prompt_tokens: StrictInt | None = Field(default=None, ge=-1)


class ScoreRequest(_Lenient):
    """``POST /v1/score/{model}`` (docs/api.md §3): no ``params`` wrapper."""

    query: Item
    items: list[Item] = Field(min_length=1)
    instruction: Text | None = None
    options: RuntimeOptions | None = None
    top_k: StrictInt | None = Field(default=None, gt=0)


class ExtractParams(_Lenient):
    labels: list[Annotated[Text, Field(min_length=1)]] | None = Field(default=None, min_length=1)
    output_schema: dict[str, Any] | None = None
    instruction: Text | None = None
    options: RuntimeOptions | None = None


class ExtractRequest(_Lenient):
    """``POST /v1/extract/{model}`` (docs/api.md §4)."""

    items: list[Item] = Field(min_length=1)
    params: ExtractParams | None = None


class ResolveRequest(_Lenient):
    """``POST /v1/configs/resolve`` (docs/api.md §8): which bundle serves a model spec."""

    model: StrictStr = Field(description="[bundle:/]org/model[:profile]")
    bundle: StrictStr | None = Field(default=None, description="the bundle to check instead")
