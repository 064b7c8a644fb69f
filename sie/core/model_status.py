"""One model's entry in a worker's heartbeat (docs/architecture.md §6, §8.1): its load
state, counts, memory, a generation engine's scheduler reading and which engine a
load-time-picking profile serves; the msgpack / JSON map and its checked decoding.
``sie.core.wire.Heartbeat`` carries a list of them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from sie.core.admission import EngineState
from sie.core.errors import WireError, echo

__all__ = ["MAX_ENGINE_NAME_CHARS", "ModelLoadState", "ModelStatus"]

#: A model's load state as a worker reports it (docs/architecture.md §6).
ModelLoadState = Literal["available", "loading", "loaded", "unloading", "failed"]
_LOAD_STATES = frozenset(("available", "loading", "loaded", "unloading", "failed"))
#: longest ``ModelStatus.engine`` a heartbeat may carry
MAX_ENGINE_NAME_CHARS = 64


@dataclass(slots=True, frozen=True)
class ModelStatus:
    """One model in a worker's heartbeat (docs/architecture.md §6, §8.1).

    ``state``: ``ModelLoadState``; ``loads`` / ``evictions``: counts since the worker
    started; ``bytes``: memory the loaded model holds (0 unless loaded);
    ``engine_state``: a generation engine's scheduler reading (admission-gate.md),
    None for other engines or when unreadable; ``last_error``: the envelope of the
    last failed load (``code``, ``message``, ``error_class``, ``attempts``,
    ``permanent``, ...), None when none failed; ``engine``: which engine serves a
    loaded model whose profile picks one at load (``fastest``: ``onnx-int8``,
    ``onnx-float32``, ``torch``...; at most ``MAX_ENGINE_NAME_CHARS``), None otherwise.
    """

    name: str
    state: str = "available"
    loads: int = 0
    evictions: int = 0
    bytes: int = 0
    engine_state: EngineState | None = None
    last_error: dict[str, Any] | None = None
    engine: str | None = None

    def to_map(self) -> dict[str, Any]:
        """The msgpack / JSON map (the shape ``/health`` shows)."""
        out: dict[str, Any] = {
            "name": self.name,
            "state": self.state,
            "loads": self.loads,
            "evictions": self.evictions,
            "bytes": self.bytes,
        }
        if self.engine_state is not None:
            out["engine_state"] = asdict(self.engine_state)
        if self.last_error is not None:
            out["last_error"] = self.last_error
        if self.engine is not None:
            out["engine"] = self.engine
        return out

    @classmethod
    def from_map(cls, data: Any) -> ModelStatus:
        """Decode and check one entry.

        Raises:
            WireError: not a map, a field of the wrong type, an unknown state, or an
                ``engine_state`` that is not a valid reading.
        """
        if not isinstance(data, dict):
            raise WireError(f"ModelStatus: expected a map, got {type(data).__name__}")
        name, state = data.get("name"), data.get("state", "available")
        if not isinstance(name, str) or not name:
            raise WireError("ModelStatus.name: expected a non-empty string")
        if state not in _LOAD_STATES:
            raise WireError(f"ModelStatus.state: unknown state {echo(state)}")
        loads, evictions, size = (data.get(k, 0) for k in ("loads", "evictions", "bytes"))
        counts = (loads, evictions, size)
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
            raise WireError("ModelStatus: loads, evictions and bytes must be integers >= 0")
        es, err = data.get("engine_state"), data.get("last_error")
        if err is not None and not isinstance(err, dict):
            raise WireError("ModelStatus.last_error: expected a map")
        engine = data.get("engine")
        if engine is not None and not (
            isinstance(engine, str) and 0 < len(engine) <= MAX_ENGINE_NAME_CHARS
        ):
            raise WireError(
                f"ModelStatus.engine: expected a string of 1-{MAX_ENGINE_NAME_CHARS} characters"
            )
        return cls(
            name=name,
            state=state,
            loads=loads,
            evictions=evictions,
            bytes=size,
            engine_state=_engine_state(es),
            last_error=err,
            engine=engine,
        )


def _engine_state(data: Any) -> EngineState | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise WireError("ModelStatus.engine_state: expected a map")
    try:
        return EngineState(**{k: data[k] for k in _ENGINE_STATE_FIELDS if k in data})
    except (TypeError, ValueError) as exc:
        raise WireError(f"ModelStatus.engine_state: {exc}") from exc


_ENGINE_STATE_FIELDS = tuple(f.name for f in fields(EngineState))
