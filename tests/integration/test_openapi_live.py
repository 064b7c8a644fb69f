"""schemathesis over the live gateway and config role (docs/api.md §14): every operation
of each ``/openapi.json`` is called over real HTTP (memory bus, the real MiniLM,
splade-tiny and Rampart models, auth on, the admin token sent) with generated valid and
invalid requests, and every answer must be no 5xx, a documented status and media type,
and a body that conforms to the documented schema.

Half the generated requests name a served model (``ALIASES``), so they reach a worker.
Bounded to a couple of minutes on two cores: ``MAX_EXAMPLES`` per operation in the
examples and fuzzing phases, plus the coverage phase's boundary cases; no stateful
phase (it would write configs and pools at random), no deadline, no shrinking.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import hypothesis
import msgpack
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from sie.core.config import dump_yaml, load_yaml
from sie.http.openapi import build_document
from sie.http.openapi_config import config_table
from sie.http.openapi_gateway import gateway_table
from tests.conftest import MINILM, Stack, run_stack, wait_for

pytestmark = [pytest.mark.slow]

ADMIN, USER = "openapi-admin-token", "openapi-user-token"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
#: Sent with every gateway request: a machine profile no worker serves is 503
#: PROVISIONING by design (the autoscaler's signal, docs/api.md §11), so the requests
#: ask for the one the stack's worker serves.
GATEWAY_HEADERS = {**AUTH, "X-SIE-Machine-Profile": "default"}
MAX_EXAMPLES = 25
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@schemathesis.serializer("application/msgpack")
def _msgpack(ctx: Any, value: Any) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]
    except OverflowError:  # an integer msgpack cannot carry (over 64 bits): no such request
        hypothesis.reject()


#: Served models under ids without '/' (schemathesis drops a dictionary value with '/'
#: for a path parameter), registered through the config role at start.
ALIASES = {
    "minilm": MINILM,
    "splade": "rasyosef/splade-tiny",
    "rampart": "nationaldesignstudio/rampart",
}


def _add_alias(stack: Stack, alias: str, model: str) -> None:
    """Write ``model``'s config again under the id ``alias`` (config role, admin token)
    and wait until the gateway serves it and a worker has loaded it."""
    doc = load_yaml(httpx.get(f"{stack.base_url}/v1/configs/models/{model}", headers=AUTH).content)
    doc["sie_id"] = alias
    r = httpx.post(
        f"{config_url(stack)}/v1/configs/models",
        content=dump_yaml(doc),
        headers={**AUTH, "Content-Type": "application/yaml"},
    )
    assert r.status_code == 201, r.text
    if doc["tasks"].get("extract") is not None:
        path, body = "extract", {"items": [{"text": "Ann lives in Paris."}]}
    else:
        kinds = list(doc["tasks"]["encode"])
        path, body = "encode", {"items": [{"text": "hi"}], "params": {"output_types": kinds}}
    url = f"{stack.base_url}/v1/{path}/{alias}"
    wait_for(lambda: httpx.post(url, json=body, headers=AUTH, timeout=60).status_code == 200, 60)


@pytest.fixture(scope="module")
def live() -> Iterator[Stack]:
    with run_stack(
        preload=(MINILM,),
        auth_mode="token",
        auth_token=USER,
        admin_token=ADMIN,
        request_timeout_s=20.0,
    ) as s:
        for alias, model in ALIASES.items():
            _add_alias(s, alias, model)
        yield s


def _schema(table: Any) -> Any:
    """The app's document as built in this process (``test_served_documents`` checks the
    live apps serve the same), with the run's bounds."""
    config = schemathesis.Config.from_dict(
        {
            "headers": AUTH,
            "generation": {"max-examples": MAX_EXAMPLES, "no-shrink": True, "database": "none"},
            # half the requests name a served model, so they reach a worker
            "dictionaries": {
                "aliases": {"values": list(ALIASES)},
                "models": {"values": [*ALIASES, *ALIASES.values()]},
            },
            "parameters": {
                "path.model": {"dictionary": "aliases", "probability": 0.5},
                "body.model": {"dictionary": "models", "probability": 0.5},
            },
            "phases": {
                "examples": {"enabled": True},
                "fuzzing": {"enabled": True},
                "coverage": {"enabled": True},
                "stateful": {"enabled": False},
            },
        }
    )
    return schemathesis.openapi.from_dict(build_document(table()), config=config)


def config_url(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.running.config_port}"


def test_served_documents(live: Stack) -> None:
    """The live apps serve the documents the run below is generated from."""
    for url, table in ((live.base_url, gateway_table), (config_url(live), config_table)):
        r = httpx.get(f"{url}/openapi.json", headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json() == json.loads(json.dumps(build_document(table())))


gateway = _schema(gateway_table)
config = _schema(config_table)
SETTINGS = hypothesis.settings(
    deadline=None,
    max_examples=MAX_EXAMPLES,
    suppress_health_check=list(hypothesis.HealthCheck),
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
)


@gateway.parametrize()
@SETTINGS
def test_gateway_conforms(case: Any, live: Stack) -> None:
    case.call_and_validate(
        base_url=live.base_url, headers=GATEWAY_HEADERS, checks=CHECKS, timeout=60
    )


@config.parametrize()
@SETTINGS
def test_config_role_conforms(case: Any, live: Stack) -> None:
    case.call_and_validate(base_url=config_url(live), headers=AUTH, checks=CHECKS, timeout=60)
