"""Request bodies and result shapes of encode, score and extract (docs/sdk.md
"Calls"; docs/api.md §2-§4). Pure functions, shared by both clients.

Items: a ``str`` is ``{"text": s}``. ``images`` entries are sent as
``{"data": bytes, "format": "jpeg"}`` (raw bytes as given; paths, PIL images and
arrays converted with Pillow); on extract a ``document`` path is read and its
``format`` taken from the suffix.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sie.client.types import EncodeResult, ExtractResult, ScoreResult, Timing

__all__ = [
    "encode_body",
    "extract_body",
    "merge_options",
    "parse_encode",
    "parse_extract",
    "parse_score",
    "score_body",
    "timing_of",
    "to_item",
]

_DOC_FORMATS = {
    ".pdf": "pdf",
    ".docx": "docx",
    ".doc": "doc",
    ".html": "html",
    ".htm": "html",
    ".xhtml": "html",
    ".md": "md",
    ".markdown": "md",
    ".txt": "txt",
    ".rtf": "rtf",
    ".odt": "odt",
    ".pptx": "pptx",
    ".xlsx": "xlsx",
    ".csv": "csv",
}


def _jpeg(image: Any) -> bytes:
    if isinstance(image, bytes | bytearray | memoryview):
        return bytes(image)
    from PIL import Image  # only when an image that is not bytes is sent

    img: Any
    if isinstance(image, str | Path):
        img = Image.open(image)
    elif hasattr(image, "__array__") and not isinstance(image, Image.Image):
        import numpy as np

        img = Image.fromarray(np.asarray(image))
    else:
        img = image
    if img.mode not in ("RGB", "L"):
        img = img.convert("RGB")
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=95)
    return out.getvalue()


def _document(doc: Any) -> dict[str, Any]:
    if isinstance(doc, Mapping):
        return dict(doc)
    if isinstance(doc, bytes | bytearray):
        return {"data": bytes(doc), "format": None}
    path = Path(doc)
    return {"data": path.read_bytes(), "format": _DOC_FORMATS.get(path.suffix.lower())}


def to_item(item: Any, *, documents: bool = False) -> dict[str, Any]:
    """One wire item from an ``Item`` dict or a string.

    Raises:
        TypeError: neither a mapping nor a string.
    """
    if isinstance(item, str):
        return {"text": item}
    if not isinstance(item, Mapping):
        raise TypeError(f"an item is a dict or a str, not {type(item).__name__}")
    out = {k: v for k, v in item.items() if k not in ("images", "document")}
    images = item.get("images")
    if images:
        out["images"] = [
            dict(im) if isinstance(im, Mapping) else {"data": _jpeg(im), "format": "jpeg"}
            for im in images
        ]
    doc = item.get("document")
    if doc is not None:
        out["document"] = _document(doc) if documents else doc
    return out


def merge_options(
    default: Mapping[str, Any] | None, call: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The client's default options under the call's (the call's keys win; shallow)."""
    merged = {**(default or {}), **(call or {})}
    return merged or None


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def encode_body(
    items: Sequence[Any],
    *,
    output_types: Sequence[str] | None,
    instruction: str | None,
    output_dtype: str | None,
    is_query: bool | None,
    options: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """``POST /v1/encode/{model}``: ``{"items", "params"?}`` (docs/api.md §2)."""
    params = _drop_none(
        {
            "output_types": list(output_types) if output_types else None,
            "instruction": instruction,
            "output_dtype": output_dtype,
            "is_query": is_query,
            "options": dict(options) if options else None,
        }
    )
    body: dict[str, Any] = {"items": [to_item(it) for it in items]}
    if params:
        body["params"] = params
    return body


def score_body(
    query: Any,
    items: Sequence[Any],
    *,
    instruction: str | None,
    options: Mapping[str, Any] | None,
    top_k: int | None = None,
) -> dict[str, Any]:
    """``POST /v1/score/{model}``: ``{"query", "items", "instruction"?, "options"?}``
    (no ``params`` wrapper; docs/api.md §3)."""
    return _drop_none(
        {
            "query": to_item(query),
            "items": [to_item(it) for it in items],
            "instruction": instruction,
            "options": dict(options) if options else None,
            "top_k": top_k,
        }
    )


def extract_body(
    items: Sequence[Any],
    *,
    labels: Sequence[str] | None,
    output_schema: Mapping[str, Any] | None,
    instruction: str | None,
    options: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """``POST /v1/extract/{model}``: ``{"items", "params"?}`` (docs/api.md §4)."""
    params = _drop_none(
        {
            "labels": list(labels) if labels is not None else None,
            "output_schema": dict(output_schema) if output_schema is not None else None,
            "instruction": instruction,
            "options": dict(options) if options else None,
        }
    )
    body: dict[str, Any] = {"items": [to_item(it, documents=True) for it in items]}
    if params:
        body["params"] = params
    return body


_TIMING_HEADERS = {
    "x-total-time": "total_ms",
    "x-queue-time": "queue_ms",
    "x-tokenization-time": "tokenization_ms",
    "x-inference-time": "inference_ms",
}


def timing_of(headers: Mapping[str, str]) -> Timing:
    """Milliseconds from the timing headers of an encode, score or extract answer."""
    out = Timing()
    for header, key in _TIMING_HEADERS.items():
        raw = headers.get(header)
        if raw is not None:
            try:
                out[key] = float(raw)  # type: ignore[literal-required]
            except ValueError:
                continue
    return out


def _expect(body: Any, key: str) -> Any:
    if not isinstance(body, Mapping) or key not in body:
        raise ValueError(f"unexpected response: no {key!r} in it")
    return body[key]


def parse_encode(body: Any, timing: Timing | None = None) -> list[EncodeResult]:
    """Results of an encode answer, in input order: ``dense`` / ``multivector`` as
    arrays, ``sparse`` as ``{"indices", "values"}``, ``id`` when the item had one.

    Raises:
        ValueError: the body is not an encode answer.
    """
    out: list[EncodeResult] = []
    for raw in _expect(body, "items"):
        res: dict[str, Any] = {}
        if "id" in raw and raw["id"] is not None:
            res["id"] = raw["id"]
        if "dense" in raw:
            res["dense"] = raw["dense"]["values"]
        if "sparse" in raw:
            res["sparse"] = {
                "indices": raw["sparse"]["indices"],
                "values": raw["sparse"]["values"],
            }
        if "multivector" in raw:
            res["multivector"] = raw["multivector"]["values"]
        if timing:
            res["timing"] = dict(timing)
        out.append(res)  # type: ignore[arg-type]
    return out


def parse_score(body: Any) -> ScoreResult:
    """``{"model", "query_id", "scores": [{"item_id", "score", "rank"}]}``, best first.

    Raises:
        ValueError: the body is not a score answer.
    """
    scores = [
        {"item_id": s["item_id"], "score": float(s["score"]), "rank": int(s["rank"])}
        for s in _expect(body, "scores")
    ]
    return ScoreResult(model=body.get("model", ""), query_id=body.get("query_id"), scores=scores)  # type: ignore[typeddict-item]


def parse_extract(body: Any) -> list[ExtractResult]:
    """Per item ``{"id", "entities", "relations", "classifications", "objects", "data"}``.

    Raises:
        ValueError: the body is not an extract answer.
    """
    out: list[ExtractResult] = []
    for raw in _expect(body, "items"):
        res: dict[str, Any] = {
            k: list(raw.get(k) or []) for k in ("entities", "relations", "classifications")
        }
        res["objects"] = list(raw.get("objects") or [])
        if raw.get("id") is not None:
            res["id"] = raw["id"]
        if "data" in raw:
            res["data"] = raw["data"] if raw["data"] is not None else {}
        out.append(res)  # type: ignore[arg-type]
    return out
