"""``StopMatcher``: cuts a streamed completion at the first stop string, never emitting
any part of one (re-exported by ``sie.engines.generation``; docs/api.md §5)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["StopMatcher"]


class StopMatcher:
    """Cuts a text stream at the first stop string, never emitting any part of it.

    ``feed`` takes the next piece of text and returns what is safe to emit: text
    that could still be the start of a stop string is held back until the stream
    proves otherwise. Once a stop string completes, ``stopped`` is true and the
    text before it (and nothing after) has been emitted. When the stream ends for
    another reason, ``flush`` returns the held-back text.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in dict.fromkeys(stops) if s]
        self._held = ""
        self.stopped = False

    @property
    def held(self) -> str:
        """Text received but not yet emitted."""
        return self._held

    def feed(self, text: str) -> str:
        """Add ``text``; return the part now safe to emit ("" once stopped)."""
        if self.stopped:
            return ""
        buf = self._held + text
        if not self._stops:
            self._held = ""
            return buf
        cut = -1
        for s in self._stops:
            i = buf.find(s)
            if i != -1 and (cut == -1 or i < cut):
                cut = i
        if cut != -1:
            self.stopped = True
            self._held = ""
            return buf[:cut]
        keep = self._longest_partial(buf)
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """The held-back text, when the stream ended without a stop string."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out

    def _longest_partial(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop."""
        best = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best
