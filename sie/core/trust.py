"""The trust model for model configs (docs/security.md, "Trust model").

Config writers (who ``POST /v1/configs/models`` to the config role) are not the
operators who run workers. A config may ask a worker only for what the operator
allowed with ``SIE_*`` settings; ``ConfigTrust`` is that operator policy, and the one
rule used in both places a config is acted upon:

* at write time, by the config authority (``sie.control.authority``), before
  anything is persisted: ``ConfigTrust.check`` raises ``ValidationFailed`` (422)
  naming the field;
* at load time, by the worker's model cache (``sie.engines.runtime.cache``), because configs
  also arrive as bus deltas, from seed files and from the store: ``check_load``
  raises ``ModelLoadFailed`` (``error_class`` ``CONFIG``, permanent) before any engine
  is built or imported.

The rules (each names the offending field, e.g. ``weights_path`` or
``profiles.default.adapter_options.loadtime.trust_remote_code``):

* ``weights_path`` must resolve, after ``~`` expansion and ``Path.resolve()`` (so
  ``..`` segments and symlinks cannot escape), inside one of ``weights_roots``
  (``SIE_WEIGHTS_ROOTS``; no roots: no ``weights_path`` is allowed). This
  ``resolve()`` (a ``readlink`` per path component) is the only filesystem access in
  ``sie.core``.
* ``hf_id`` must be a hub repo id (``name`` or ``org/name``), never a filesystem path:
  vLLM loads a local directory named by it.
* loadtime ``trust_remote_code: true`` (also inside vLLM ``engine_args``) makes the
  worker import Python shipped with the weights: refused unless
  ``allow_trust_remote_code`` (``SIE_ALLOW_TRUST_REMOTE_CODE``). The same opt-in is
  needed for vLLM ``engine_args`` keys outside ``SAFE_ENGINE_ARGS`` (others name model
  paths, classes to import, download directories, ...).
* loadtime ``gguf_file`` must be a bare file name (no directory part, no ``..``).
* loadtime ``base_url`` and ``metrics_url`` (the OpenAI-compatible upstream) must
  match an entry of ``upstream_base_urls`` (``SIE_UPSTREAM_BASE_URLS``; none: no
  upstream is allowed). URLs are parsed, never compared as strings: the scheme, host
  and port must be equal and the path must be the entry's path or below it; URLs with
  credentials (``user@``), a query or fragment, backslashes, non-ASCII hosts or
  ``.``/``..`` path segments never match. A profile without ``metrics_url`` scrapes
  ``<base_url root>/metrics``, on the allowed upstream's own origin.
* loadtime ``api_key_env`` must be one of ``upstream_api_key_envs``
  (``SIE_UPSTREAM_API_KEY_ENVS``). Nothing a config names is read from the
  environment: the values of the allowed names are captured once at the edge
  (``sie.settings``) into ``upstream_api_keys`` and handed to the engine
  (``api_key``).

Client-visible load errors must not reveal the worker's filesystem (issue 11b):
``redact_paths`` replaces absolute paths, other than the ``weights_path`` the writer
sent themselves, with ``<path>``; the worker logs the unredacted message.
"""

from __future__ import annotations

import copy
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

from pydantic import SecretStr

from sie.core.config import ModelConfig, ResolvedProfile
from sie.core.errors import ModelLoadFailed, ValidationFailed

__all__ = [
    "SAFE_ENGINE_ARGS",
    "SECURITY_DOC",
    "ConfigTrust",
    "Finding",
    "UpstreamURL",
    "parse_upstream_url",
    "redact_error",
    "redact_paths",
]

#: Where the trust model is documented (cited in every refusal).
SECURITY_DOC = 'docs/security.md "Trust model"'

#: vLLM ``engine_args`` a config may set without ``SIE_ALLOW_TRUST_REMOTE_CODE``: sizes,
#: precision and scheduling knobs; nothing that names a path, a URL, a class or code.
SAFE_ENGINE_ARGS = frozenset(
    {
        "block_size",
        "cpu_offload_gb",
        "disable_custom_all_reduce",
        "disable_sliding_window",
        "dtype",
        "enable_chunked_prefill",
        "enable_prefix_caching",
        "enforce_eager",
        "gpu_memory_utilization",
        "kv_cache_dtype",
        "max_logprobs",
        "max_model_len",
        "max_num_batched_tokens",
        "max_num_seqs",
        "max_seq_len_to_capture",
        "pipeline_parallel_size",
        "quantization",
        "seed",
        "swap_space",
        "tensor_parallel_size",
    }
)

_HF_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)?$")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_LOADTIME = "adapter_options.loadtime"


class Finding(NamedTuple):
    """One refusal: ``field`` (dotted config path) and a message naming the setting."""

    field: str
    message: str


@dataclass(frozen=True, slots=True)
class UpstreamURL:
    """A parsed upstream URL: lower-case ``scheme`` and ``host``, explicit ``port``, and
    ``path`` without a trailing ``/`` (``""`` for the root)."""

    scheme: str
    host: str
    port: int
    path: str

    def covers(self, other: UpstreamURL) -> bool:
        """Whether ``other`` is this allowlist entry's origin at or below its path."""
        return (self.scheme, self.host, self.port) == (other.scheme, other.host, other.port) and (
            not self.path or other.path == self.path or other.path.startswith(self.path + "/")
        )


def parse_upstream_url(url: str) -> UpstreamURL:
    """Parse an upstream URL for the allowlist (module docstring).

    Raises:
        ValueError: not an ``http(s)://host[:port][/path]`` URL, or one with
            credentials, a query, a fragment, backslashes, whitespace or control
            characters, a non-ASCII host or ``.``/``..`` path segments (the reason).
    """
    if not isinstance(url, str) or not url:
        raise ValueError("must be a non-empty http(s) URL")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url) or "\\" in url:
        raise ValueError("must not contain whitespace, control characters or backslashes")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"is not a valid URL ({exc})") from exc
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise ValueError("must be an http:// or https:// URL")
    if "@" in parts.netloc:
        raise ValueError("must not carry credentials (user@host)")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise ValueError("must not have a query or fragment")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise ValueError("must name a host")
    if not host.isascii():
        raise ValueError("must have an ASCII host name (punycode for IDN)")
    path = parts.path
    if any(seg in (".", "..") for seg in unquote(path).split("/")):
        raise ValueError("must not have '.' or '..' path segments")
    return UpstreamURL(scheme, host.lower(), port or _DEFAULT_PORTS[scheme], path.rstrip("/"))


def _profile_source(config: ModelConfig, name: str) -> str:
    """The profile whose ``loadtime`` the resolved ``name`` uses (``extends``: a child
    without its own loadtime inherits the parent's, ``ModelConfig.resolve_profile``)."""
    prof = config.profiles.get(name)
    if prof is None:
        return name
    own = prof.adapter_options.loadtime if prof.adapter_options is not None else {}
    return name if own or prof.extends is None else prof.extends


@dataclass(frozen=True, slots=True)
class ConfigTrust:
    """What the operator lets config writers ask of workers (module docstring).

    The default instance allows nothing: no ``weights_path``, no remote code, no
    upstream, no environment secrets.

    Args:
        weights_roots: directories ``weights_path`` must resolve inside (resolved here).
        allow_trust_remote_code: accept ``trust_remote_code: true`` and any vLLM
            ``engine_args``.
        upstream_base_urls: allowlist of upstream URL prefixes (parsed here).
        upstream_api_key_envs: names a config may give as ``api_key_env``.
        upstream_api_keys: name -> value, captured from the environment at the edge
            (only names also in ``upstream_api_key_envs`` are ever handed out).

    Raises:
        ValueError: an allowlist entry that ``parse_upstream_url`` refuses.
    """

    weights_roots: tuple[Path, ...] = ()
    allow_trust_remote_code: bool = False
    upstream_base_urls: tuple[str, ...] = ()
    upstream_api_key_envs: frozenset[str] = frozenset()
    upstream_api_keys: Mapping[str, SecretStr] = field(
        default_factory=dict, repr=False, compare=False
    )
    _allowed: tuple[UpstreamURL, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        roots = tuple(_resolved(Path(r)) for r in self.weights_roots)
        object.__setattr__(self, "weights_roots", tuple(r for r in roots if r is not None))
        allowed = []
        for entry in self.upstream_base_urls:
            try:
                allowed.append(parse_upstream_url(entry))
            except ValueError as exc:
                raise ValueError(f"upstream allowlist entry {entry!r} {exc}") from exc
        object.__setattr__(self, "_allowed", tuple(allowed))
        object.__setattr__(self, "upstream_api_key_envs", frozenset(self.upstream_api_key_envs))

    # -- single decisions ----------------------------------------------------------------

    def weights_path_allowed(self, weights_path: str) -> bool:
        """Whether ``weights_path`` resolves inside a weights root."""
        real = _resolved(Path(weights_path))
        return real is not None and any(real.is_relative_to(r) for r in self.weights_roots)

    def upstream_allowed(self, url: str) -> bool:
        """Whether ``url`` parses and lies under an ``upstream_base_urls`` entry."""
        try:
            got = parse_upstream_url(url)
        except ValueError:
            return False
        return any(a.covers(got) for a in self._allowed)

    def api_key(self, name: str) -> str | None:
        """The captured value of an allowed ``api_key_env`` name (None: not allowed, or
        not set where this process started)."""
        if name not in self.upstream_api_key_envs:
            return None
        value = self.upstream_api_keys.get(name)
        if value is None:
            return None
        return value.get_secret_value() or None

    # -- whole configs -------------------------------------------------------------------

    def findings(self, config: ModelConfig, profiles: Iterable[str] | None = None) -> list[Finding]:
        """Every refusal for ``config``: its top-level fields, and the resolved loadtime
        options of ``profiles`` (None: every profile)."""
        out = self._top_findings(config)
        seen: set[str] = set()
        for name in config.profiles if profiles is None else profiles:
            source = _profile_source(config, name)
            if source in seen:
                continue  # an inherited loadtime is reported once, where it is written
            seen.add(source)
            resolved = config.resolve_profile(name)
            out += self.loadtime_findings(resolved.loadtime, f"profiles.{source}.{_LOADTIME}")
        return out

    def _top_findings(self, config: ModelConfig) -> list[Finding]:
        out: list[Finding] = []
        if config.weights_path is not None and not self.weights_path_allowed(config.weights_path):
            out.append(
                Finding(
                    "weights_path",
                    f"weights_path {config.weights_path!r} is outside the weights roots the "
                    f"operator allows (SIE_WEIGHTS_ROOTS; {SECURITY_DOC})",
                )
            )
        if config.hf_id is not None and not _is_repo_id(config.hf_id):
            out.append(
                Finding(
                    "hf_id",
                    f"hf_id {config.hf_id!r} must be a hub repo id ('name' or 'org/name'), not a "
                    f"path; local weights go in weights_path ({SECURITY_DOC})",
                )
            )
        return out

    def loadtime_findings(self, loadtime: Mapping[str, Any], prefix: str) -> list[Finding]:
        """Refusals for one resolved ``loadtime`` mapping; fields are ``prefix.<key>``."""
        out: list[Finding] = []
        if loadtime.get("trust_remote_code") is True and not self.allow_trust_remote_code:
            out.append(_remote_code(f"{prefix}.trust_remote_code"))
        engine_args = loadtime.get("engine_args")
        if isinstance(engine_args, Mapping) and not self.allow_trust_remote_code:
            for key in sorted(str(k) for k in engine_args):
                if key == "trust_remote_code":
                    if engine_args[key]:
                        out.append(_remote_code(f"{prefix}.engine_args.trust_remote_code"))
                elif key not in SAFE_ENGINE_ARGS:
                    out.append(
                        Finding(
                            f"{prefix}.engine_args.{key}",
                            f"engine_args.{key} is not among the engine arguments a config may "
                            f"set (SAFE_ENGINE_ARGS); it needs SIE_ALLOW_TRUST_REMOTE_CODE "
                            f"({SECURITY_DOC})",
                        )
                    )
        gguf = loadtime.get("gguf_file")
        if isinstance(gguf, str) and (
            not gguf
            or "/" in gguf
            or "\\" in gguf
            or gguf in (".", "..")
            or posixpath.basename(gguf) != gguf
        ):
            out.append(
                Finding(
                    f"{prefix}.gguf_file",
                    f"gguf_file {gguf!r} must be a file name inside the weights directory",
                )
            )
        for key in ("base_url", "metrics_url"):
            url = loadtime.get(key)
            if isinstance(url, str) and not self.upstream_allowed(url):
                out.append(
                    Finding(
                        f"{prefix}.{key}",
                        f"{key} {url!r} is not an upstream the operator allows "
                        f"(SIE_UPSTREAM_BASE_URLS; {SECURITY_DOC})",
                    )
                )
        env = loadtime.get("api_key_env")
        if env is not None and (not isinstance(env, str) or env not in self.upstream_api_key_envs):
            out.append(
                Finding(
                    f"{prefix}.api_key_env",
                    f"api_key_env {env!r} is not among the variables the operator lets configs "
                    f"name (SIE_UPSTREAM_API_KEY_ENVS; {SECURITY_DOC})",
                )
            )
        return out

    def check(self, config: ModelConfig, profiles: Iterable[str] | None = None) -> None:
        """The write-time check (config authority), before anything is persisted.

        Raises:
            ValidationFailed: (422) ``field`` is the first refusal, ``errors`` lists all.
        """
        found = self.findings(config, profiles)
        if found:
            raise ValidationFailed(
                f"model {config.sie_id!r}: " + "; ".join(f"{f.field}: {f.message}" for f in found),
                field=found[0].field,
                errors=[f"{f.field}: {f.message}" for f in found],
            )

    def check_load(self, config: ModelConfig, profile: ResolvedProfile) -> None:
        """The load-time check (worker), before an engine is built or imported.

        Raises:
            ModelLoadFailed: (``error_class`` CONFIG, permanent) naming every refusal;
                ``config_field`` is the first.
        """
        if profile.name in config.profiles:
            found = self.findings(config, [profile.name])
        else:  # not one of the config's own profiles: check what will run
            found = self._top_findings(config) + self.loadtime_findings(
                profile.loadtime, f"profiles.{profile.name}.{_LOADTIME}"
            )
        if found:
            raise ModelLoadFailed(
                f"model {config.sie_id!r} refused by this worker's trust settings: "
                + "; ".join(f"{f.field}: {f.message}" for f in found),
                error_class="CONFIG",
                permanent=True,
                config_field=found[0].field,
            )


def _remote_code(field_path: str) -> Finding:
    return Finding(
        field_path,
        "trust_remote_code makes the worker import Python shipped with the weights; the "
        f"operator has not allowed it (SIE_ALLOW_TRUST_REMOTE_CODE; {SECURITY_DOC})",
    )


def _is_repo_id(hf_id: str) -> bool:
    return bool(_HF_ID_RE.fullmatch(hf_id)) and ".." not in hf_id


def _resolved(path: Path) -> Path | None:
    """``path`` with ``~`` expanded and symlinks/``..`` resolved; None when it cannot be
    (no home directory, a NUL byte, a symlink loop)."""
    try:
        return path.expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return None


# ------------------------------------------------------------------ client-visible errors

#: An absolute (or ``~``) path token: not preceded by a word character, ``.``, ``:``,
#: ``/`` or ``~`` (so ``org/name`` ids and ``http://host/path`` URLs are left alone).
_PATH_RE = re.compile(r"(?<![\w.:/~@-])~?/[^\s'\"`,;:()\[\]{}<>]*")


def redact_paths(text: str, keep: Sequence[str] = ()) -> str:
    """``text`` with every absolute or ``~`` path replaced by ``<path>``, except a path
    equal to, or inside, one of ``keep`` (what the config writer sent: ``weights_path``)."""
    kept = [k for k in keep if k and k.startswith(("/", "~"))]

    def sub(m: re.Match[str]) -> str:
        token = m.group(0)
        bare = token.rstrip(".")
        for k in kept:
            inner = k.rstrip("/")
            # inside the writer's own directory, but never "everything under /"
            if bare in (k, inner) or (inner and bare.startswith(inner + "/")):
                return token
        return "<path>" + token[len(bare) :]

    return _PATH_RE.sub(sub, text)


def redact_error(exc: Any, keep: Sequence[str] = ()) -> Any:
    """A copy of the ``SieError`` ``exc`` whose message and string fields (and lists of
    strings) went through ``redact_paths``; ``exc`` itself is left as is (for the log)."""
    out = copy.copy(exc)
    out.message = redact_paths(exc.message, keep)
    out.args = (out.message,)
    fields: dict[str, Any] = {}
    for k, v in exc.fields.items():
        if isinstance(v, str):
            fields[k] = redact_paths(v, keep)
        elif isinstance(v, list | tuple) and all(isinstance(x, str) for x in v):
            fields[k] = [redact_paths(x, keep) for x in v]
        else:
            fields[k] = v
    out.fields = fields
    return out
