"""What the gateway's and the config role's OpenAPI tables share (``sie.http.openapi``;
docs/api.md §8, §14): the status groups, the ``200 OK`` reply, and the config read
surface both serve (model-config list, bundles, a bundle, resolve) plus ``/metrics``,
each table with its own envelope, auth errors and summaries.
"""

from __future__ import annotations

from dataclasses import dataclass

from sie.http.openapi import (
    JSON,
    MSGPACK,
    TEXT,
    YAML,
    Content,
    Envelope,
    Operation,
    Param,
    Reply,
    Schema,
    errors,
)
from sie.http.responses_admin import BundleList, ConfigModelList, ResolveReply
from sie.http.schemas import ResolveRequest

__all__ = ["BODY", "READ", "WORK", "ConfigReads", "config_reads", "ok"]

#: Errors any read can answer when auth is on (401 missing/wrong token; 500 auth on
#: with no token configured).
READ = (401, 500)
#: What reading a body can answer: malformed (400), slow (408), too large (413), an
#: unread charset or media type (415), the process-wide body budget spent (503).
BODY = (400, 408, 413, 415, 503)
#: What running work on the workers can answer.
WORK = (404, 500, 502, 503, 504)


def ok(model: Schema, *media: str, headers: tuple[str, ...] = ()) -> Reply:
    """``200 OK`` with ``model`` in ``media`` (default JSON) and ``headers``."""
    return Reply("OK", (Content(model, media or (JSON,)),), headers)


@dataclass(frozen=True)
class ConfigReads:
    """The config reads of one server, each placed where its table lists it."""

    models: Operation
    bundles: Operation
    bundle: Operation
    resolve: Operation
    metrics: Operation


def config_reads(
    envelope: Envelope,
    auth: tuple[int, ...],
    *,
    models_summary: str,
    bundles_summary: str,
    bundle_doc: Schema,
    unavailable: tuple[int, ...] = (),
    headers: tuple[str, ...] = (),
) -> ConfigReads:
    """The config reads in ``envelope`` with ``auth`` errors; ``unavailable``: the
    statuses of a registry that did not load (not on resolve); ``headers``: of each
    ``200`` but the metrics text."""
    text = Content({"type": "string"}, (TEXT,))
    return ConfigReads(
        models=Operation(
            "GET",
            "/v1/configs/models",
            models_summary,
            {200: ok(ConfigModelList, headers=headers)} | errors(envelope, *auth, *unavailable),
            tag="configs",
        ),
        bundles=Operation(
            "GET",
            "/v1/configs/bundles",
            bundles_summary,
            {200: ok(BundleList, headers=headers)} | errors(envelope, *auth, *unavailable),
            tag="configs",
        ),
        bundle=Operation(
            "GET",
            "/v1/configs/bundles/{bundle}",
            "A bundle (YAML)",
            {200: ok(bundle_doc, YAML, headers=headers)}
            | errors(envelope, *auth, 404, *unavailable),
            params=(Param("bundle", "path", "a bundle id (case-insensitive)"),),
            tag="configs",
        ),
        resolve=Operation(
            "POST",
            "/v1/configs/resolve",
            "Which bundle serves a model spec",
            {200: ok(ResolveReply, headers=headers)} | errors(envelope, *auth, *BODY, 404, 409),
            body=Content(ResolveRequest, (JSON, MSGPACK)),
            tag="configs",
        ),
        metrics=Operation(
            "GET",
            "/metrics",
            "Prometheus metrics",
            {200: Reply("Prometheus text format", (text,))} | errors(envelope, *auth),
            tag="health",
        ),
    )
