"""``response_format: {"type": "json_object"}`` for engines that sample themselves (the
transformers engine; docs/api.md §5.1): the completion is constrained, token by token,
to a prefix of one JSON object (RFC 8259 syntax, the top level an object), and ends
when the object closes.

``JsonPrefix`` is an incremental recogniser over UTF-8 bytes (JSON's structure is
ASCII, so a token that ends inside a multi-byte character is checked exactly): ``feed``
a token's bytes to a copy and keep the copy when every byte is accepted. Bytes of
0x80 and above are accepted only inside strings. Whitespace outside strings is
limited to ``MAX_WHITESPACE`` bytes in a row, so a model cannot pad forever.

``token_bytes(tokenizer)``: every token id's bytes (byte-level BPE tokens mapped back
through GPT-2's byte alphabet, others decoded; special tokens none, as the text skips
them), computed once per tokenizer.
``pick(order, state, table, eos)``: the first candidate id (in the caller's order of
preference) whose bytes continue ``state``, with the state it leads to. No torch here.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

__all__ = ["MAX_WHITESPACE", "JsonPrefix", "pick", "token_bytes"]

#: Whitespace bytes allowed in a row outside strings (pretty-printing nests fit).
MAX_WHITESPACE = 32

_WS = frozenset(b" \t\n\r")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = frozenset(b'"\\/bfnrtu')

# states
_TOP, _VALUE, _KEY_OR_END, _KEY, _COLON, _OBJ_NEXT, _ARR_FIRST, _ARR_NEXT = range(8)
_STRING, _ESCAPE, _UNICODE, _NUMBER, _LITERAL, _DONE = range(8, 14)
# number sub-states: which part of  -? int (. frac)? ([eE] [+-]? exp)?  was read last
_N_SIGN, _N_ZERO, _N_INT, _N_DOT, _N_FRAC, _N_E, _N_ESIGN, _N_EXP = range(8)
_N_ENDS = frozenset({_N_ZERO, _N_INT, _N_FRAC, _N_EXP})


class JsonPrefix:
    """A prefix of one JSON object, read byte by byte (module docstring)."""

    __slots__ = ("_after", "_hex", "_lit", "_num", "_stack", "_state", "_ws")

    def __init__(self) -> None:
        self._state = _TOP
        self._stack: list[int] = []  # open containers: ord("{") or ord("[")
        self._after = _OBJ_NEXT  # state after the string being read (key: _COLON)
        self._num = _N_SIGN
        self._lit = b""  # rest of true/false/null
        self._hex = 0  # hex digits left in \\uXXXX
        self._ws = 0

    def copy(self) -> JsonPrefix:
        c = JsonPrefix.__new__(JsonPrefix)
        c._state, c._stack, c._after = self._state, list(self._stack), self._after
        c._num, c._lit, c._hex, c._ws = self._num, self._lit, self._hex, self._ws
        return c

    def next_bytes(self) -> frozenset[int]:
        """The bytes this prefix can take next (each tried on a copy)."""
        out = []
        for b in range(256):
            c = self.copy()
            if c.feed(bytes((b,))):
                out.append(b)
        return frozenset(out)

    @property
    def complete(self) -> bool:
        """The top-level object has closed."""
        return self._state == _DONE

    def feed(self, data: bytes) -> bool:
        """Read ``data``; False (and the state is then unusable) at the first byte that
        cannot continue a JSON object."""
        return all(self._byte(b) for b in data)

    def _close_value(self) -> None:
        if not self._stack:
            self._state = _DONE
        else:
            self._state = _OBJ_NEXT if self._stack[-1] == ord("{") else _ARR_NEXT

    def _space(self, b: int) -> bool:
        if b in _WS:
            self._ws += 1
            return self._ws <= MAX_WHITESPACE
        self._ws = 0
        return False

    def _begin_value(self, b: int) -> bool:
        if b == ord("{"):
            self._stack.append(b)
            self._state = _KEY_OR_END
        elif b == ord("["):
            self._stack.append(b)
            self._state = _ARR_FIRST
        elif b == ord('"'):
            self._state, self._after = _STRING, -1  # a value string
        elif b == ord("-") or b in _DIGITS:
            self._state = _NUMBER
            self._num = _N_SIGN if b == ord("-") else (_N_ZERO if b == ord("0") else _N_INT)
        elif b in b"tfn":
            self._state = _LITERAL
            self._lit = {ord("t"): b"rue", ord("f"): b"alse", ord("n"): b"ull"}[b]
        else:
            return False
        return True

    def _byte(self, b: int) -> bool:
        st = self._state
        if st == _STRING:
            if b == ord('"'):
                if self._after == _COLON:
                    self._state = _COLON
                else:
                    self._close_value()
                return True
            if b == ord("\\"):
                self._state = _ESCAPE
                return True
            return b >= 0x20
        if st == _ESCAPE:
            if b not in _ESCAPES:
                return False
            if b == ord("u"):
                self._state, self._hex = _UNICODE, 4
            else:
                self._state = _STRING
            return True
        if st == _UNICODE:
            if b not in _HEX:
                return False
            self._hex -= 1
            if self._hex == 0:
                self._state = _STRING
            return True
        if st == _LITERAL:
            if not self._lit or b != self._lit[0]:
                return False
            self._lit = self._lit[1:]
            if not self._lit:
                self._close_value()
            return True
        if st == _NUMBER:
            if self._number(b):
                return True
            if self._num not in _N_ENDS:
                return False
            self._close_value()  # the number ended: this byte belongs to what follows
            return self._byte(b)
        if self._space(b):
            return True
        if b in _WS:
            return False  # too much whitespace in a row
        if st == _TOP:
            if b != ord("{"):
                return False
            return self._begin_value(b)
        if st in (_VALUE, _ARR_FIRST):
            if st == _ARR_FIRST and b == ord("]"):
                self._stack.pop()
                self._close_value()
                return True
            return self._begin_value(b)
        if st in (_KEY_OR_END, _KEY):
            if st == _KEY_OR_END and b == ord("}"):
                self._stack.pop()
                self._close_value()
                return True
            if b == ord('"'):
                self._state, self._after = _STRING, _COLON
                return True
            return False
        if st == _COLON:
            if b == ord(":"):
                self._state = _VALUE
                return True
            return False
        if st in (_OBJ_NEXT, _ARR_NEXT):
            close = ord("}") if st == _OBJ_NEXT else ord("]")
            if b == ord(","):
                self._state = _KEY if st == _OBJ_NEXT else _VALUE
                return True
            if b == close:
                self._stack.pop()
                self._close_value()
                return True
            return False
        return False  # _DONE: nothing may follow

    def _number(self, b: int) -> bool:
        n = self._num
        digit = b in _DIGITS
        if n == _N_SIGN and digit:
            self._num = _N_ZERO if b == ord("0") else _N_INT
        elif n == _N_INT and digit:
            pass
        elif n in (_N_ZERO, _N_INT) and b == ord("."):
            self._num = _N_DOT
        elif n in (_N_DOT, _N_FRAC) and digit:
            self._num = _N_FRAC
        elif n in (_N_ZERO, _N_INT, _N_FRAC) and b in b"eE":
            self._num = _N_E
        elif n == _N_E and b in b"+-":
            self._num = _N_ESIGN
        elif n in (_N_E, _N_ESIGN, _N_EXP) and digit:
            self._num = _N_EXP
        else:
            return False
        return True


_BYTE_DECODER: dict[str, int] = {}


def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character -> byte (byte-level BPE vocabularies)."""
    if not _BYTE_DECODER:
        keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
        chars = list(keep)
        extra = 0
        for b in range(256):
            if b not in keep:
                keep.append(b)
                chars.append(256 + extra)
                extra += 1
        _BYTE_DECODER.update({chr(c): b for b, c in zip(keep, chars, strict=True)})
    return _BYTE_DECODER


_TABLES: weakref.WeakKeyDictionary[Any, list[bytes]] = weakref.WeakKeyDictionary()


def token_bytes(tok: Any) -> list[bytes]:
    """Each token id's bytes, for the ids ``0 .. len(tok) - 1`` (computed once per
    tokenizer): a byte-level BPE token through GPT-2's byte alphabet, any other
    token as its decoded text; a special token none (the text skips it)."""
    try:
        return _TABLES[tok]
    except (KeyError, TypeError):
        pass
    dec = _byte_decoder()
    special = set(getattr(tok, "all_special_ids", ()) or ())
    pieces = tok.convert_ids_to_tokens(list(range(len(tok))))
    # GPT-2's alphabet writes a space as "Ġ": a vocabulary without it is not byte-level
    byte_level = any(isinstance(p, str) and "\u0120" in p for p in pieces)
    table: list[bytes] = []
    for i, piece in enumerate(pieces):
        if i in special:  # never part of the text (decoded with skip_special_tokens)
            table.append(b"")
        elif byte_level and isinstance(piece, str) and piece and all(c in dec for c in piece):
            table.append(bytes(dec[c] for c in piece))
        else:
            table.append(tok.decode([i], skip_special_tokens=True).encode("utf-8"))
    try:
        _TABLES[tok] = table
    except TypeError:  # not weakly referenceable: computed each time
        pass
    return table


def pick(
    order: Iterable[int], state: JsonPrefix, table: list[bytes], eos: frozenset[int]
) -> tuple[int, JsonPrefix] | None:
    """The first id of ``order`` whose bytes continue ``state`` (non-empty bytes, never
    an EOS id: the object closing ends the completion), and the state after it; None
    when no candidate of ``order`` fits.

    The first ``_DIRECT`` candidates are tried as they come; past them, a candidate
    whose first byte ``state`` cannot take is skipped without copying the state (the
    same answer, but a request that biases the likely tokens away cannot make each
    step walk the vocabulary through the recogniser)."""
    first: frozenset[int] | None = None
    for n, tid in enumerate(order):
        if tid in eos or tid >= len(table):
            continue
        data = table[tid]
        if not data:
            continue
        if n >= _DIRECT:
            if first is None:
                first = state.next_bytes()
            if data[0] not in first:
                continue
        nxt = state.copy()
        if nxt.feed(data):
            return tid, nxt
    return None


#: candidates ``pick`` tries before it filters by first byte
_DIRECT = 16
