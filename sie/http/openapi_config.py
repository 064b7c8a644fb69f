"""The config role's route table for its OpenAPI document (``sie.http.openapi``;
docs/api.md §8, §14). Every route ``build_config_app`` registers has a row here.

Every error uses the config envelope ``{"detail": {code, error, message}}``. Reads need
the inference or admin token once any token is set (401 missing, 403 wrong); writes
and export need the admin token (docs/api.md §8 "Auth").
"""

from __future__ import annotations

from sie.core.config import ModelConfig
from sie.http.openapi import (
    JSON,
    YAML,
    ApiTable,
    Content,
    Operation,
    Param,
    Reply,
    errors,
    self_operations,
)
from sie.http.openapi_common import BODY, config_reads, ok
from sie.http.responses_admin import ConfigEpoch, ConfigExport, ConfigWriteReply, ProbeStatus

__all__ = ["config_table"]

AUTH = (401, 403)
#: REGISTRY_UNAVAILABLE: the bundles did not load at start.
REGISTRY = (503,)


def config_table() -> ApiTable:
    """The config role's routes (``sie.http.config.build_config_app``)."""
    yaml_doc = {"type": "object", "description": "YAML (docs/api.md §9)"}
    reads = config_reads(
        "config",
        AUTH,
        models_summary="Model configs",
        bundles_summary="Bundles",
        bundle_doc=yaml_doc,
        unavailable=REGISTRY,
    )
    return ApiTable(
        title="SIE config role",
        description="The single writer of model configs (docs/api.md §8). "
        "Errors: {detail: {code, error, message}}.",
        operations=(
            reads.models,
            Operation(
                "POST",
                "/v1/configs/models",
                "Add a model, or profiles to one (append-only)",
                {
                    200: Reply("a replay: nothing changed", (Content(ConfigWriteReply),)),
                    201: Reply("profiles created", (Content(ConfigWriteReply),)),
                }
                | errors("config", *AUTH, *BODY, 409, 422),
                auth="admin",
                body=Content(
                    ModelConfig,
                    (YAML, JSON),
                    "a model config (docs/api.md §9); YAML, of which JSON is a subset",
                ),
                params=(
                    Param(
                        "Idempotency-Key",
                        "header",
                        "a replay with the same key returns the first answer",
                    ),
                ),
                tag="configs",
                description="docs/api.md §8: the write is persisted, the epoch advances "
                "and the delta goes to every gateway and worker.",
            ),
            Operation(
                "GET",
                "/v1/configs/models/{model:path}",
                "A model's config (YAML)",
                {200: ok(yaml_doc, YAML)} | errors("config", *AUTH, 404, *REGISTRY),
                params=(Param("model", "path", "a model id"),),
                tag="configs",
            ),
            reads.bundles,
            reads.bundle,
            reads.resolve,
            Operation(
                "GET",
                "/v1/configs/export",
                "The authoritative snapshot (admin)",
                {200: ok(ConfigExport)} | errors("config", *AUTH, *REGISTRY),
                auth="admin",
                tag="configs",
            ),
            Operation(
                "GET",
                "/v1/configs/epoch",
                "The config epoch and the bundle hashes",
                {200: ok(ConfigEpoch)} | errors("config", *AUTH),
                tag="configs",
            ),
            Operation(
                "GET",
                "/healthz",
                "Liveness",
                {200: ok(ProbeStatus)},
                auth="open",
                tag="health",
            ),
            Operation(
                "GET",
                "/readyz",
                "Readiness: 503 REGISTRY_UNAVAILABLE when the bundles failed to load",
                {200: ok(ProbeStatus)} | errors("config", *REGISTRY),
                auth="open",
                tag="health",
            ),
            reads.metrics,
            *self_operations("config", AUTH),
        ),
        tags={
            "configs": "model configs and bundles (docs/api.md §8)",
            "health": "probes and metrics",
            "meta": "this description (docs/api.md §14)",
        },
    )
