"""The loadtime options of the upstream generation engine (``openai_upstream``), read
and checked against the operator's trust policy (docs/security.md "Trust model")."""

from __future__ import annotations

from dataclasses import dataclass, field

from sie.core.config import ModelConfig, ResolvedProfile
from sie.core.errors import ModelLoadFailed
from sie.core.trust import ConfigTrust

__all__ = ["UpstreamOptions", "read_upstream_options"]


@dataclass(frozen=True)
class UpstreamOptions:
    """Validated options: ``base_url`` without ``/v1``, ``api_root`` with it;
    ``headers`` (the Bearer, if any); ``metrics_url`` None when scraping is off;
    seconds for ``timeout_s`` and ``metrics_interval_s``."""

    base_url: str
    api_root: str
    upstream_model: str
    metrics_url: str | None
    max_num_seqs: int | None
    timeout_s: float
    metrics_interval_s: float
    headers: dict[str, str] = field(default_factory=dict)


def _config_error(
    config: ModelConfig, profile: ResolvedProfile, name: str, what: str
) -> ModelLoadFailed:
    got = profile.loadtime.get(name)
    return ModelLoadFailed(
        f"model {config.sie_id!r}: loadtime.{name} must be {what}, got {got!r}",
        error_class="CONFIG",
        permanent=True,
    )


def _refused(
    config: ModelConfig, profile: ResolvedProfile, name: str, setting: str
) -> ModelLoadFailed:
    return ModelLoadFailed(
        f"model {config.sie_id!r}: loadtime.{name} {profile.loadtime.get(name)!r} "
        f'is not allowed by the operator ({setting}; docs/security.md "Trust model")',
        error_class="CONFIG",
        permanent=True,
        config_field=f"profiles.{profile.name}.adapter_options.loadtime.{name}",
    )


def _opt_str(config: ModelConfig, profile: ResolvedProfile, name: str) -> str | None:
    v = profile.loadtime.get(name)
    if v is not None and (not isinstance(v, str) or not v):
        raise _config_error(config, profile, name, "a non-empty string")
    return v


def _opt_seconds(config: ModelConfig, profile: ResolvedProfile, name: str, default: float) -> float:
    v = profile.loadtime.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < float("inf"):
        raise _config_error(config, profile, name, "a positive number of seconds")
    return float(v)


def read_upstream_options(
    config: ModelConfig, profile: ResolvedProfile, trust: ConfigTrust
) -> UpstreamOptions:
    """Validate ``profile``'s loadtime options against the operator's ``trust``
    (``openai_upstream``'s module docstring lists them).

    Raises:
        ModelLoadFailed: (CONFIG) a malformed option, a ``base_url`` / ``metrics_url``
            off the operator's allowlist, an undeclared or unset ``api_key_env``.
    """
    lt = profile.loadtime
    base = _opt_str(config, profile, "base_url")
    if base is None or not base.startswith(("http://", "https://")):
        raise _config_error(config, profile, "base_url", "an http(s) URL of the upstream server")
    if not trust.upstream_allowed(base):
        raise _refused(config, profile, "base_url", "SIE_UPSTREAM_BASE_URLS")
    base = base.rstrip("/")
    root = base.removesuffix("/v1")
    key = _opt_str(config, profile, "api_key")
    env = _opt_str(config, profile, "api_key_env")
    if env is not None:
        if env not in trust.upstream_api_key_envs:
            raise _refused(config, profile, "api_key_env", "SIE_UPSTREAM_API_KEY_ENVS")
        key = trust.api_key(env)
        if key is None:
            raise ModelLoadFailed(
                f"model {config.sie_id!r}: loadtime.api_key_env names {env!r}, "
                "which is not set on this worker",
                error_class="CONFIG",
                permanent=True,
            )
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    upstream_model = _opt_str(config, profile, "upstream_model") or (config.hf_id or config.sie_id)
    metrics = lt.get("metrics_url")
    if metrics is False:
        metrics_url = None
    elif metrics is None:
        metrics_url = root + "/metrics"
    elif isinstance(metrics, str) and metrics.startswith(("http://", "https://")):
        if not trust.upstream_allowed(metrics):
            raise _refused(config, profile, "metrics_url", "SIE_UPSTREAM_BASE_URLS")
        metrics_url = metrics
    else:
        raise _config_error(config, profile, "metrics_url", "an http(s) URL or false")
    seqs = lt.get("max_num_seqs")
    if seqs is not None and (isinstance(seqs, bool) or not isinstance(seqs, int) or seqs < 1):
        raise _config_error(config, profile, "max_num_seqs", "a positive integer")
    timeout_s = _opt_seconds(config, profile, "timeout_s", 600.0)
    metrics_interval_s = _opt_seconds(config, profile, "metrics_interval_s", 2.0)
    return UpstreamOptions(
        base_url=root,
        api_root=root + "/v1",
        headers=headers,
        upstream_model=upstream_model,
        metrics_url=metrics_url,
        max_num_seqs=seqs,
        timeout_s=timeout_s,
        metrics_interval_s=metrics_interval_s,
    )
