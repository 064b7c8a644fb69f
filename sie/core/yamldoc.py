"""Bounded YAML documents: the one YAML reader and writer of SIE (docs/security.md
"Limits", "Config role").

``load_yaml``, the reader of config writes, seed files, stored models, exports and
deltas, stops composing a document as soon as it passes ``MAX_YAML_NODES`` nodes or
``MAX_YAML_DEPTH`` nested collections, so a hostile document costs time and memory in
proportion to the limit, not to its size; once aliases are expanded it may hold at
most ``MAX_YAML_NODES`` nodes and ``MAX_YAML_CHARS`` characters of keys and strings.
``check_document_size`` holds a merged model config to the same bounds, so whatever
the authority stores, dumps and publishes loads again everywhere.
"""

from __future__ import annotations

import io
import math
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.composer import Composer
from ruamel.yaml.error import YAMLError
from ruamel.yaml.events import MappingStartEvent, SequenceStartEvent
from ruamel.yaml.scanner import Scanner

from sie.core.errors import ParseError, ValidationFailed, echo

__all__ = [
    "MAX_YAML_CHARS",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "check_document_size",
    "document_size",
    "dump_yaml",
    "load_yaml",
    "structural_tokens",
]


def _yaml() -> YAML:
    y = YAML(typ="safe", pure=True)
    y.default_flow_style = False
    return y


#: Most nodes one config document may have: scalars (mapping keys included), sequences,
#: mappings and aliases, as written and again once aliases are expanded. The largest
#: shipped config has 45 nodes, its profile 18 (every option block present): 256 such
#: profiles are about 4,700. Parsing costs 50-100 µs of pure Python per node, so the
#: limit bounds one document's parse to about 1-2 s of one thread.
MAX_YAML_NODES = 20_000
#: Deepest nesting of sequences and mappings a config document may have (shipped: 5).
MAX_YAML_DEPTH = 32
#: Most characters of mapping keys and string scalars one document may hold once
#: aliases are expanded (an alias repeats a string without its bytes on the wire).
MAX_YAML_CHARS = 1024 * 1024

#: Line breaks as ruamel's scanner sees them (``\r\n`` is one). Its block parser breaks
#: lines at ``\n``, ``\r`` and ``\r\n`` only, but NEL, LS and PS end scalars: counting
#: them too can only over-count.
_BREAKS = ("\n", "\r", "\x85", "\u2028", "\u2029")
_FLOW_SEPARATORS = (",", "[", "{")


def structural_tokens(text: str) -> int:
    """Line breaks plus flow separators (``,``, ``[``, ``{``) in ``text``: an upper bound
    on the entries a YAML document can hold per nesting level, counted with
    ``str.count`` (C speed) before any pure-Python parsing. Line breaks: ``\\n``,
    ``\\r``, ``\\r\\n`` (once), and NEL ``\\x85``, LS ``\\u2028``, PS ``\\u2029``
    (not block line breaks to ruamel, but they end scalars: counted to be safe)."""
    breaks = sum(text.count(c) for c in _BREAKS) - text.count("\r\n")
    return breaks + sum(text.count(c) for c in _FLOW_SEPARATORS)


class _Bound(Exception):
    """A document passed ``MAX_YAML_NODES`` or ``MAX_YAML_DEPTH`` while being composed."""


class _BoundedComposer(Composer):
    """ruamel's composer, counting as it goes. ruamel scans and parses lazily, one
    event per request, so raising here stops the whole parse: a hostile document
    costs at most ``MAX_YAML_NODES`` nodes of pure-Python work, however long it is."""

    def __init__(self, loader: Any = None) -> None:
        super().__init__(loader)
        self._sie_nodes = 0
        self._sie_nesting = 0

    def _where(self) -> str:
        mark = getattr(self.parser.peek_event(), "start_mark", None)
        return f" (line {mark.line + 1})" if mark is not None else ""

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._sie_nodes += 1
        if self._sie_nodes > MAX_YAML_NODES:
            raise _Bound(f"more than {MAX_YAML_NODES} YAML nodes{self._where()}")
        if not self.parser.check_event(SequenceStartEvent, MappingStartEvent):
            return super().compose_node(parent, index)
        self._sie_nesting += 1
        if self._sie_nesting > MAX_YAML_DEPTH:
            raise _Bound(f"nested deeper than {MAX_YAML_DEPTH} levels{self._where()}")
        try:
            return super().compose_node(parent, index)
        finally:
            self._sie_nesting -= 1


class _BoundedScanner(Scanner):
    """ruamel's scanner, refusing flow collections (``[``, ``{``) nested past
    ``MAX_YAML_DEPTH``. The scanner reads up to about 1,000 tokens ahead of the
    composer inside flow collections and keeps simple-key state per flow level, so
    ``[[[[...`` would cost seconds (quadratic) before the composer saw the depth."""

    def fetch_flow_collection_start(self, TokenClass: Any, to_push: str) -> None:
        if len(self.flow_context) >= MAX_YAML_DEPTH:
            line = self.reader.get_mark().line + 1
            raise _Bound(f"nested deeper than {MAX_YAML_DEPTH} levels (line {line})")
        super().fetch_flow_collection_start(TokenClass, to_push)


def _loader() -> YAML:
    y = YAML(typ="safe", pure=True)
    y.Scanner = _BoundedScanner
    y.Composer = _BoundedComposer
    return y


def _path(parts: tuple[str | int, ...]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{echo(p)}" if out else echo(p))
    return out


def _check_plain(
    value: Any, parts: tuple[str | int, ...], budget: list[int], active: set[int]
) -> None:
    """JSON-representable data only: str keys, finite numbers, no timestamps or binary,
    no self-referencing aliases; once aliases are expanded, at most ``MAX_YAML_NODES``
    nodes (keys included), ``MAX_YAML_DEPTH`` nesting and ``MAX_YAML_CHARS`` characters.
    ``budget`` is ``[nodes left, characters left]``; paths are built only for errors."""
    budget[0] -= 1
    if budget[0] < 0:
        raise ParseError(
            f"document expands to more than {MAX_YAML_NODES} nodes (alias bomb?)", field="body"
        )
    if isinstance(value, (dict, list)):
        if len(active) >= MAX_YAML_DEPTH:
            where = _path(parts) or "(top level)"
            raise ParseError(
                f"{where}: nested deeper than {MAX_YAML_DEPTH} levels",
                field=_path(parts) or "body",
            )
        if id(value) in active:
            where = _path(parts) or "(top level)"
            raise ParseError(f"{where}: recursive YAML alias", field=_path(parts) or "body")
        active.add(id(value))
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise ParseError(
                        f"{_path(parts) or '(top level)'}: mapping key {echo(repr(k))} "
                        "must be a string",
                        field=_path(parts) or "body",
                    )
                budget[0] -= 1
                budget[1] -= len(k)
                _check_text(k, (*parts, k))
                _check_plain(v, (*parts, k), budget, active)
        else:
            for i, v in enumerate(value):
                _check_plain(v, (*parts, i), budget, active)
        active.discard(id(value))
    elif isinstance(value, str):
        budget[1] -= len(value)
        _check_text(value, parts)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ParseError(f"{_path(parts)}: non-finite number {value!r}", field=_path(parts))
    elif value is not None and not isinstance(value, (int, bool)):
        raise ParseError(
            f"{_path(parts)}: unsupported YAML value of type {type(value).__name__} "
            "(quote it as a string)",
            field=_path(parts),
        )
    if budget[1] < 0:
        raise ParseError(
            f"document expands to more than {MAX_YAML_CHARS} characters (alias bomb?)",
            field="body",
        )


def _check_text(text: str, parts: tuple[str | int, ...]) -> None:
    """Refuse a string UTF-8 cannot encode: YAML's ``"\\ud800"`` escape names a lone
    surrogate, which every later step (the store, the hashes, the deltas) would fail
    to write."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        # a key may hold the surrogate itself: escaped, so the error can be encoded
        where = (_path(parts) or "body").encode("utf-8", "backslashreplace").decode()
        raise ParseError(
            f"{where}: contains an unpaired surrogate at position {exc.start} "
            "(not valid Unicode text)",
            field=where,
        ) from None


def load_yaml(
    text: str | bytes, *, what: str = "document", max_tokens: int | None = None
) -> dict[str, Any]:
    """Parse one YAML mapping of plain JSON-representable data, within the bounds of
    docs/security.md "Limits": the one YAML reader of every config path.

    Args:
        text: the document; bytes must be UTF-8 (a leading BOM is allowed).
        what: names the document in messages (``"body"``, ``"stored model 'org/m'"``).
        max_tokens: also refuse, before any parsing, more than this many
            ``structural_tokens`` (line breaks and flow separators): config writes pass
            ``MAX_CONFIG_TOKENS``. None: no such pre-count (seed files, stored models,
            deltas, whose long strings may be wrapped over many lines).

    Cost: the pre-count is C speed; the parse stops at the first node past
    ``MAX_YAML_NODES`` or collection nested past ``MAX_YAML_DEPTH`` (50-100 µs of
    pure Python per node), before the rest of the document is even scanned.

    Raises:
        ParseError: 400, ``field`` ``body`` (or the offending path): not valid UTF-8
            YAML, not a mapping, more than ``max_tokens`` structural tokens, more than
            ``MAX_YAML_NODES`` nodes or ``MAX_YAML_DEPTH`` levels as written or once
            aliases are expanded, more than ``MAX_YAML_CHARS`` characters once
            expanded, or a value JSON cannot carry (timestamps, binary, non-string
            keys, NaN, a string with an unpaired surrogate).
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(f"{what}: not valid UTF-8: {exc}", field="body") from exc
    if max_tokens is not None:
        tokens = structural_tokens(text)
        if tokens > max_tokens:
            raise ParseError(
                f"{what}: {tokens} lines/items exceeds the limit of {max_tokens} for one "
                "document (line breaks: \\n, \\r, \\r\\n, \\x85, \\u2028, \\u2029; and , [ {)",
                field="body",
                limit=max_tokens,
            )
    try:
        data = _loader().load(text)
    except _Bound as exc:
        raise ParseError(f"{what}: {exc}", field="body") from None
    except (YAMLError, ValueError, RecursionError) as exc:
        raise ParseError(f"{what}: invalid YAML: {exc}", field="body") from exc
    if not isinstance(data, dict):
        raise ParseError(
            f"{what}: expected a YAML mapping, got {type(data).__name__}", field="body"
        )
    _check_plain(data, (), [MAX_YAML_NODES, MAX_YAML_CHARS], set())
    return data


def document_size(data: Any, stop_after_nodes: int | None = None) -> tuple[int, int]:
    """``(nodes, characters)`` of plain data as ``load_yaml`` counts them once aliases
    are expanded: one node per scalar, mapping key, sequence and mapping; characters of
    keys and strings. Iterative; stops counting past ``stop_after_nodes``."""
    nodes = chars = 0
    stack = [data]
    while stack:
        value = stack.pop()
        nodes += 1
        if isinstance(value, dict):
            nodes += len(value)
            chars += sum(len(k) for k in value if isinstance(k, str))
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, str):
            chars += len(value)
        if stop_after_nodes is not None and nodes > stop_after_nodes:
            break
    return nodes, chars


def check_document_size(data: dict[str, Any], *, what: str, field: str = "profiles") -> None:
    """Hold a document built in memory (a merged model config) to the ``load_yaml``
    bounds, so that once dumped it loads again everywhere (docs/security.md "Limits").

    Raises:
        ValidationFailed: 422 naming ``field``: more than ``MAX_YAML_NODES`` nodes or
            ``MAX_YAML_CHARS`` characters.
    """
    nodes, chars = document_size(data, stop_after_nodes=MAX_YAML_NODES)
    if nodes > MAX_YAML_NODES:
        raise ValidationFailed(
            f"{what}: the merged config would have more than {MAX_YAML_NODES} YAML nodes",
            field=field,
            limit=MAX_YAML_NODES,
        )
    if chars > MAX_YAML_CHARS:
        raise ValidationFailed(
            f"{what}: the merged config would hold {chars} characters, more than {MAX_YAML_CHARS}",
            field=field,
            limit=MAX_YAML_CHARS,
        )


def dump_yaml(data: dict[str, Any]) -> str:
    """Serialise a mapping as block YAML (ruamel.yaml, pure Python: about 50 µs per node;
    callers on an event loop run big documents in a thread, see ``sie.control.catalog``)."""
    buf = io.StringIO()
    _yaml().dump(data, buf)
    return buf.getvalue()
