"""The operator's ``ConfigTrust`` (``sie.core.trust``) built from ``ServeSettings``, for
the config role (write-time check) and the worker (load-time check, upstream keys);
docs/security.md "Trust model"."""

from __future__ import annotations

import logging
from pathlib import Path

from sie.core.trust import ConfigTrust
from sie.engines.weights import default_weights_roots
from sie.settings import ServeSettings

__all__ = ["config_trust"]

log = logging.getLogger(__name__)


def config_trust(settings: ServeSettings) -> ConfigTrust:
    """The policy ``settings`` describe: ``SIE_WEIGHTS_ROOTS`` (unset: the model caches
    and shipped weight packages, ``default_weights_roots``), ``SIE_ALLOW_TRUST_REMOTE_CODE``,
    ``SIE_UPSTREAM_BASE_URLS`` and ``SIE_UPSTREAM_API_KEY_ENVS`` with the values
    ``ServeSettings.from_env`` captured for them.

    Raises:
        ValueError: an upstream allowlist entry that does not parse (the settings
            validator refuses those first).
    """
    roots = (
        tuple(Path(r) for r in settings.weights_roots)
        if settings.weights_roots
        else default_weights_roots(settings.model_cache_dir)
    )
    trust = ConfigTrust(
        weights_roots=roots,
        allow_trust_remote_code=settings.allow_trust_remote_code,
        upstream_base_urls=settings.upstream_base_urls,
        upstream_api_key_envs=frozenset(settings.upstream_api_key_envs),
        upstream_api_keys=dict(settings.upstream_api_keys),
    )
    if settings.allow_trust_remote_code:
        log.warning(
            "SIE_ALLOW_TRUST_REMOTE_CODE is on: model configs may make workers import Python "
            "shipped with their weights"
        )
    missing = [n for n in settings.upstream_api_key_envs if n not in settings.upstream_api_keys]
    if missing and "worker" in settings.roles:
        log.warning("SIE_UPSTREAM_API_KEY_ENVS names unset variable(s): %s", ", ".join(missing))
    return trust
