"""Model config, profile and bundle types, loaded from YAML with ruamel.yaml.

The model schema is docs/api.md §9 (``extra="forbid"`` at every level) plus the
top-level ``pool`` of architecture §16.3 and ``tasks.encode.dense.matryoshka``
(ours: marks a model whose dense vector may be truncated for OpenAI
``dimensions``). Bundles are docs/api.md §9.

Errors: every parse or validation failure raises ``ConfigError`` whose message
names the offending key path (e.g. ``profiles.default.max_batch_tokenz: unknown key``).

YAML is read and written with the bounds of ``sie.core.yamldoc`` (docs/security.md
"Limits"); its public names are re-exported here.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sie.core.errors import (
    ConfigError,
    InvalidInput,
    InvalidModelId,
    echo,
)
from sie.core.subjects import normalize_model_id
from sie.core.templates import check_template
from sie.core.yamldoc import (
    MAX_YAML_CHARS,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    check_document_size,
    document_size,
    dump_yaml,
    load_yaml,
    structural_tokens,
)

__all__ = [
    "MAX_YAML_CHARS",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "AdapterOptions",
    "Bundle",
    "ModelConfig",
    "Profile",
    "ResolvedProfile",
    "adapter_module",
    "check_document_size",
    "document_size",
    "dump_yaml",
    "load_yaml",
    "parse_bundle",
    "parse_model_config",
    "structural_tokens",
    "validate_model_id",
]

MODEL_ID_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._/-]*$")
POOL_RE = re.compile(r"^[A-Za-z0-9_-]+$")
DEFAULT_PROFILE = "default"
DEFAULT_POOL = "default"


MAX_MODEL_ID_CHARS = 128  # with '/' → '__' and a temp suffix, store file names stay < 255 bytes
PROFILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def validate_model_id(model_id: str) -> str:
    """Check a model id (architecture §3 ``_validate_model_id``, tightened).

    Rules: ``^[a-zA-Z0-9][a-zA-Z0-9._/-]*$``; no ``..`` or ``\\``; not ``status`` and not
    ending in ``/status``; plus ours: at most 128 characters, no empty or ``.`` path
    segment (``a//b``, ``a/``, ``a/.``), and no ``__`` (reserved: the config store maps
    ``/`` to ``__``) — the same rules with or without a store.

    Raises:
        InvalidModelId: naming the rule broken (400).
    """
    if ".." in model_id or "\\" in model_id:
        raise InvalidModelId(
            f"sie_id {echo(model_id)!r}: path traversal ('..' or '\\') is not allowed",
            field="sie_id",
        )
    if len(model_id) > MAX_MODEL_ID_CHARS:
        raise InvalidModelId(
            f"sie_id: {len(model_id)} characters exceeds the limit of {MAX_MODEL_ID_CHARS}",
            field="sie_id",
        )
    if not MODEL_ID_RE.fullmatch(model_id):
        raise InvalidModelId(
            f"sie_id {model_id!r} must match {MODEL_ID_RE.pattern}", field="sie_id"
        )
    if model_id == "status" or model_id.endswith("/status"):
        raise InvalidModelId(f"sie_id {model_id!r} must not be or end in 'status'", field="sie_id")
    if any(seg in ("", ".") for seg in model_id.split("/")):
        raise InvalidModelId(
            f"sie_id {model_id!r}: empty or '.' path segments are not allowed", field="sie_id"
        )
    if "__" in model_id:
        raise InvalidModelId(
            f"sie_id {model_id!r}: '__' is reserved (the config store maps '/' to '__')",
            field="sie_id",
        )
    return model_id


def adapter_module(adapter_path: str) -> str:
    """``"pkg.mod:Class"`` → ``"pkg.mod"`` (the part bundles match, architecture §16.1)."""
    return adapter_path.split(":", 1)[0]


#: Engine modules that moved when ``sie.engines`` was laid out by kind: configs and
#: bundles written with the old module path keep working: the old path stands for the new
#: one wherever a module is matched against a bundle or imported. Stored text is
#: left as written, so a config's hash does not change (docs/architecture.md
#: "Where things go", §7).
RENAMED_ADAPTER_MODULES: dict[str, str] = {
    "sie.engines.sentence_transformers": "sie.engines.encoders.sentence_transformers",
    "sie.engines.cross_encoder": "sie.engines.scorers.cross_encoder",
    "sie.engines.gliner": "sie.engines.extractors.gliner",
    "sie.engines.token_classification": "sie.engines.extractors.token_classification",
    "sie.engines.transformers_gen": "sie.engines.generators.transformers_gen",
    "sie.engines.vllm_engine": "sie.engines.generators.vllm_engine",
    "sie.engines.openai_upstream": "sie.engines.generators.openai_upstream",
}


def canonical_adapter_path(adapter_path: str) -> str:
    """``adapter_path`` (``"module:Class"`` or a bare module) with a renamed module
    replaced by its current path (``RENAMED_ADAPTER_MODULES``); others unchanged."""
    module, sep, cls = adapter_path.partition(":")
    return RENAMED_ADAPTER_MODULES.get(module, module) + sep + cls


class _Strict(BaseModel):
    # strict: no "yes" → True, no true → 1; allow_inf_nan=False: no "1e999" → inf
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Inputs(_Strict):
    text: bool = True
    image: bool = False
    audio: bool = False
    video: bool = False
    document: bool = False


class DenseTask(_Strict):
    dim: int = Field(gt=0, le=2**20, strict=True)
    matryoshka: bool = False


class SparseTask(_Strict):
    dim: int | None = Field(default=None, gt=0, le=2**31)


class MultivectorTask(_Strict):
    dim: int = Field(gt=0, le=2**20, strict=True)


class EncodeTask(_Strict):
    dense: DenseTask | None = None
    sparse: SparseTask | None = None
    multivector: MultivectorTask | None = None


class Tasks(_Strict):
    encode: EncodeTask | None = None
    score: dict[str, Any] | None = None
    extract: dict[str, Any] | None = None
    generate: dict[str, Any] | None = None  # text generation (architecture §2, §8.2)


#: Runtime options every engine understands, with their types (docs/api.md §9). Other
#: keys are engine-specific and passed through.
_RUNTIME_BOOLS = ("normalize", "is_query")
_RUNTIME_TEMPLATES = ("query_template", "doc_template")


class AdapterOptions(_Strict):
    loadtime: dict[str, Any] = Field(default_factory=dict)
    runtime: dict[str, Any] = Field(default_factory=dict)

    @field_validator("loadtime")
    @classmethod
    def _loadtime(cls, v: dict[str, Any]) -> dict[str, Any]:
        if "trust_remote_code" in v and not isinstance(v["trust_remote_code"], bool):
            raise ValueError("loadtime.trust_remote_code must be a boolean")
        return v

    @field_validator("runtime")
    @classmethod
    def _runtime(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in _RUNTIME_BOOLS:
            if key in v and not isinstance(v[key], bool):
                raise ValueError(f"runtime.{key} must be a boolean")
        for key in _RUNTIME_TEMPLATES:
            if key in v and v[key] is not None:
                if not isinstance(v[key], str):
                    raise ValueError(f"runtime.{key} must be a string")
                try:
                    check_template(v[key], field=f"runtime.{key}")
                except InvalidInput as exc:
                    raise ValueError(exc.message) from exc
        if (
            "instruction" in v
            and v["instruction"] is not None
            and not isinstance(v["instruction"], str)
        ):
            raise ValueError("runtime.instruction must be a string")
        return v


class Profile(_Strict):
    """One profile as written in YAML (docs/api.md §9 ProfileConfig)."""

    extends: str | None = None
    adapter_path: str | None = None
    max_batch_tokens: int | None = Field(default=None, gt=0, le=2**31, strict=True)
    #: ``int8``: dynamic int8 quantisation, served by the ONNX engines only (``sie.engines.onnx``)
    compute_precision: Literal["float16", "bfloat16", "float32", "int8"] | None = None
    adapter_options: AdapterOptions | None = None
    adaptive_batching: dict[str, float] | None = None

    @field_validator("adapter_path")
    @classmethod
    def _adapter_path_shape(cls, v: str | None) -> str | None:
        if v is not None and (":" not in v or not all(v.split(":", 1))):
            raise ValueError("adapter_path must be 'module.path:ClassName'")
        return v


class ResolvedProfile(_Strict):
    """A profile with ``extends`` applied: every routable field is concrete."""

    name: str
    adapter_path: str
    max_batch_tokens: int
    compute_precision: str | None
    loadtime: dict[str, Any]
    runtime: dict[str, Any]

    @property
    def adapter_module(self) -> str:
        return adapter_module(self.adapter_path)


class ModelConfig(_Strict):
    """A model config (docs/api.md §9; ``pool`` from architecture §16.3)."""

    sie_id: str
    hf_id: str | None = None
    hf_revision: str | None = None
    weights_path: str | None = None
    package_backed: bool = False
    inputs: Inputs = Field(default_factory=Inputs)
    tasks: Tasks
    max_sequence_length: int | None = Field(default=None, gt=0, le=2**31, strict=True)
    profiles: dict[str, Profile]
    pool: str | None = None

    @field_validator("sie_id")
    @classmethod
    def _valid_id(cls, v: str) -> str:
        try:
            return validate_model_id(v)
        except ConfigError as exc:
            raise ValueError(exc.message) from exc

    @field_validator("pool")
    @classmethod
    def _valid_pool(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        if not POOL_RE.fullmatch(v):
            raise ValueError(f"pool {v!r} must match {POOL_RE.pattern}")
        return v.lower()

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.package_backed:
            if self.hf_id or self.weights_path or self.hf_revision:
                raise ValueError(
                    "package_backed models must not set hf_id, hf_revision or weights_path"
                )
        elif not (self.hf_id or self.weights_path):
            raise ValueError("one of hf_id, weights_path or package_backed is required")
        if DEFAULT_PROFILE not in self.profiles:
            raise ValueError("profiles must contain 'default'")
        tokens: dict[str, str] = {}  # each profile is routed as its own subject token
        for name, p in self.profiles.items():
            if not PROFILE_RE.fullmatch(name):
                raise ValueError(
                    f"profiles.{echo(name)}: profile names must match {PROFILE_RE.pattern}"
                )
            other = tokens.setdefault(normalize_model_id(name), name)
            if other != name:
                raise ValueError(
                    f"profiles.{name}: maps to the same subject token as profile {other!r} "
                    "('.' is spelled '_dot_' in subjects); rename one"
                )
            if p.extends is None:
                if p.adapter_path is None or p.max_batch_tokens is None:
                    raise ValueError(
                        f"profiles.{name}: a profile without 'extends' must set adapter_path and max_batch_tokens"
                    )
            else:
                parent = self.profiles.get(p.extends)
                if parent is None:
                    raise ValueError(f"profiles.{name}.extends: no profile named {p.extends!r}")
                if parent.extends is not None:
                    raise ValueError(
                        f"profiles.{name}.extends: {p.extends!r} itself extends (no chaining)"
                    )
        for name in self.profiles:  # int8 is dynamic quantisation: the ONNX engines only
            resolved = self.resolve_profile(name)
            onnx = (resolved.adapter_path or "").startswith("sie.engines.onnx.")
            if resolved.compute_precision == "int8" and not onnx:
                raise ValueError(
                    f"profiles.{name}.compute_precision: int8 is served by the ONNX engines "
                    "(adapter_path sie.engines.onnx.encoders:...) only"
                )
        return self

    @property
    def effective_pool(self) -> str:
        """The model's routing pool; omitted or empty means ``default`` (§16.3)."""
        return self.pool or DEFAULT_POOL

    @property
    def outputs(self) -> list[str]:
        """Derived capability list (docs/api.md §7): dense/sparse/multivector/score/json."""
        out: list[str] = []
        enc = self.tasks.encode
        if enc is not None:
            out += [k for k in ("dense", "sparse", "multivector") if getattr(enc, k) is not None]
        if self.tasks.score is not None:
            out.append("score")
        if self.tasks.extract is not None:
            out.append("json")
        if self.tasks.generate is not None:
            out.append("text")
        return out

    @property
    def dims(self) -> dict[str, int]:
        enc = self.tasks.encode
        if enc is None:
            return {}
        dims: dict[str, int] = {}
        if enc.dense is not None:
            dims["dense"] = enc.dense.dim
        if enc.sparse is not None and enc.sparse.dim is not None:
            dims["sparse"] = enc.sparse.dim
        if enc.multivector is not None:
            dims["multivector"] = enc.multivector.dim
        return dims

    def resolve_profile(self, name: str = DEFAULT_PROFILE) -> ResolvedProfile:
        """Apply ``extends`` (docs/api.md §9): non-null child scalars override; a
        non-empty child ``loadtime``/``runtime`` dict replaces the parent's.

        Raises:
            ConfigError: unknown profile name.
        """
        prof = self.profiles.get(name)
        if prof is None:
            raise ConfigError(f"model {self.sie_id!r} has no profile {name!r}", field="profile")
        parent = self.profiles[prof.extends] if prof.extends else None

        def pick(field: str) -> Any:
            v = getattr(prof, field)
            return v if v is not None or parent is None else getattr(parent, field)

        child_opts = prof.adapter_options or AdapterOptions()
        parent_opts = (parent.adapter_options if parent else None) or AdapterOptions()
        return ResolvedProfile(
            name=name,
            adapter_path=pick("adapter_path"),
            max_batch_tokens=pick("max_batch_tokens"),
            compute_precision=pick("compute_precision"),
            loadtime=dict(child_opts.loadtime or parent_opts.loadtime),
            runtime=dict(child_opts.runtime or parent_opts.runtime),
        )


class Bundle(_Strict):
    """A bundle (docs/api.md §9): which engine modules a worker deployment runs."""

    name: str
    priority: int = 100
    default: bool = False
    engine: str | None = None
    adapters: list[str] = Field(default_factory=list)
    deps: dict[str, Any] | None = None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        if not POOL_RE.fullmatch(v):
            raise ValueError(f"bundle name {v!r} must match {POOL_RE.pattern}")
        return v

    def runs(self, module: str) -> bool:
        """Whether this bundle lists adapter ``module`` (old and new spellings of a
        renamed module match: ``canonical_adapter_path``)."""
        want = canonical_adapter_path(module)
        return any(canonical_adapter_path(m) == want for m in self.adapters)


#: Most validation errors one ``ConfigError`` lists (the rest are counted).
MAX_LISTED_ERRORS = 20


def _explain(exc: ValidationError, what: str) -> ConfigError:
    errors = exc.errors()
    parts = []
    for err in errors[:MAX_LISTED_ERRORS]:
        loc = ".".join(echo(x) for x in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            parts.append(f"{loc}: unknown key")
        else:
            parts.append(f"{loc}: {msg}" if loc else msg)
    if len(errors) > MAX_LISTED_ERRORS:
        parts.append(f"... and {len(errors) - MAX_LISTED_ERRORS} more")
    first = errors[0]["loc"] if errors else ()
    field = ".".join(echo(x) for x in first) or None
    if field is None and parts:  # model-level checks name their path first: "profiles.x: ..."
        m = re.match(r"^([^:]+): ", parts[0])
        field = m.group(1) if m else None
    return ConfigError(f"{what}: " + "; ".join(parts), errors=parts, field=field)


def parse_model_config(
    data: dict[str, Any] | str | bytes, *, what: str = "model config"
) -> ModelConfig:
    """Validate a model config mapping (or YAML text).

    Raises:
        ConfigError: naming each unknown key or invalid field.
    """
    if not isinstance(data, dict):
        data = load_yaml(data, what=what)
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        raise _explain(exc, what) from exc


def parse_bundle(data: dict[str, Any] | str | bytes, *, default_name: str | None = None) -> Bundle:
    """Validate a bundle mapping (or YAML text); ``name`` defaults to ``default_name``.

    Raises:
        ConfigError: naming each unknown key or invalid field.
    """
    if not isinstance(data, dict):
        data = load_yaml(data, what=f"bundle {default_name or ''}".strip())
    if "name" not in data and default_name:
        data = {**data, "name": default_name}
    try:
        return Bundle.model_validate(data)
    except ValidationError as exc:
        raise _explain(exc, f"bundle {data.get('name', default_name)!r}") from exc
