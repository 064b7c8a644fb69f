"""The OpenAPI documents (docs/api.md §14): valid OpenAPI 3.1, every reference resolves,
and the builder's rules (``sie.http.openapi``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from openapi_spec_validator import validate
from pydantic import BaseModel

from sie.core.errors import InvalidInput
from sie.engines.openai_params import parse_generation
from sie.http.openapi import (
    ApiTable,
    Content,
    Operation,
    Reply,
    build_document,
    errors,
    openapi_path,
)
from sie.http.openapi_config import config_table
from sie.http.openapi_gateway import gateway_table

TABLES: dict[str, Callable[[], ApiTable]] = {"gateway": gateway_table, "config": config_table}


@pytest.fixture(params=sorted(TABLES))
def document(request: pytest.FixtureRequest) -> dict[str, Any]:
    return build_document(TABLES[request.param]())


def test_documents_are_valid_openapi_3_1(document: dict[str, Any]) -> None:
    assert document["openapi"] == "3.1.0"
    validate(document)  # raises on any violation of the OpenAPI 3.1 schema
    json.dumps(document)  # plain JSON throughout


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def test_every_reference_resolves_and_every_schema_is_used(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    refs = set(_refs(document))
    assert refs, "the document names no schema"
    prefix = "#/components/schemas/"
    assert all(r.startswith(prefix) for r in refs)
    assert {r.removeprefix(prefix) for r in refs} <= set(schemas)
    # a schema reached from nothing would be dead weight
    assert set(schemas) <= {r.removeprefix(prefix) for r in refs}


def test_operation_ids_are_unique_and_errors_use_the_envelopes(document: dict[str, Any]) -> None:
    ids = [op["operationId"] for item in document["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))
    envelopes = {
        "#/components/schemas/SieClientErrorEnvelope",
        "#/components/schemas/SieServerErrorEnvelope",
        "#/components/schemas/OpenAIErrorEnvelope",
        "#/components/schemas/ConfigErrorEnvelope",
        "#/components/schemas/ModelNotFoundReply",
        # the drop-in routes answer in the shape of the server they imitate (§15)
        "#/components/schemas/CohereClientError",
        "#/components/schemas/CohereServerError",
        "#/components/schemas/TeiError",
    }
    for path, item in document["paths"].items():
        for method, op in item.items():
            for status, reply in op["responses"].items():
                if int(status) >= 400 and path not in ("/readyz",):
                    schema = reply["content"]["application/json"]["schema"]
                    assert schema["$ref"] in envelopes, (method, path, status)


def test_request_bodies_come_from_the_models_the_routes_validate_with() -> None:
    doc = build_document(gateway_table())
    body = doc["paths"]["/v1/encode/{model}"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "application/msgpack"}
    assert body["application/json"]["schema"] == {"$ref": "#/components/schemas/EncodeRequest"}
    encode = doc["components"]["schemas"]["EncodeRequest"]
    assert encode["required"] == ["items"] and encode["properties"]["items"]["minItems"] == 1
    assert doc["components"]["schemas"]["Item"]["required"] == ["text"]
    config = build_document(config_table())
    write = config["paths"]["/v1/configs/models"]["post"]
    assert set(write["requestBody"]["content"]) == {"application/yaml", "application/json"}
    assert write["x-sie-auth"] == "admin" and write["security"] == [{"bearerAuth": []}]
    assert config["paths"]["/healthz"]["get"]["security"] == []


def test_generation_bodies_document_the_model_as_the_routes_read_it() -> None:
    """Chat and completions name the model in the body (the gateway answers 400
    ``model: required`` without it); the native route names it in its path and refuses
    it in the body (an unknown parameter): the schemas say the same."""
    doc = build_document(gateway_table())
    schemas = doc["components"]["schemas"]
    for path, name, rest in (
        ("/v1/chat/completions", "ChatBody", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", "CompletionBody", {"prompt": "hi"}),
    ):
        body = doc["paths"][path]["post"]["requestBody"]
        assert body["content"]["application/json"]["schema"]["$ref"].endswith(f"/{name}")
        assert "model" in schemas[name]["required"], name
        assert schemas[name]["properties"]["model"]["type"] == "string"
        route = "chat" if name == "ChatBody" else "completions"
        with pytest.raises(InvalidInput) as exc:
            parse_generation(route, json.dumps(rest).encode(), "r")
        assert exc.value.fields["field"] == "model"
    native = schemas["NativeBody"]
    assert "model" not in native["properties"] and native["additionalProperties"] is False
    assert not native.get("required")
    with pytest.raises(InvalidInput) as exc:
        parse_generation("native", b'{"model": "m", "prompt": "hi"}', "r")
    assert exc.value.fields["field"] == "model" and "unknown parameter" in exc.value.message


def test_path_converters_become_plain_parameters() -> None:
    assert openapi_path("/v1/encode/{model:path}") == "/v1/encode/{model}"
    assert openapi_path("/v1/pools/{name}/renew") == "/v1/pools/{name}/renew"
    doc = build_document(gateway_table())
    (param, *_) = doc["paths"]["/v1/encode/{model}"]["post"]["parameters"]
    assert param["in"] == "path" and param["required"] and "'/'" in param["description"]


class _Body(BaseModel):
    x: int


def test_a_route_declared_twice_is_refused() -> None:
    op = Operation("GET", "/a", "a", {200: Reply("ok", (Content(_Body),))})
    with pytest.raises(ValueError, match="declared twice"):
        build_document(ApiTable("t", "d", (op, op)))


def test_errors_pick_the_envelope_by_status() -> None:
    sie = errors("sie", 400, 503)
    assert sie[400].content[0].schema.__name__ == "SieClientErrorEnvelope"  # type: ignore[union-attr]
    assert sie[503].content[0].schema.__name__ == "SieServerErrorEnvelope"  # type: ignore[union-attr]
    assert "Retry-After" in sie[503].headers and "Retry-After" not in sie[400].headers
    assert errors("openai", 401)[401].headers == ("X-SIE-Error-Code", "WWW-Authenticate")
