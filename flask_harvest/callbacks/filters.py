"""Which terminal states fire a completion callback: ``CompletedOnly``, ``AnyTerminal``, ``States``. Pure.

JSON shapes: ``{"type": "CompletedOnly"}``, ``{"type": "AnyTerminal"}`` and
``{"type": "States", "data": ["Failed", "TimedOut"]}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidFieldError
from ..workflows.models import TERMINAL_STATES, ExecutionState

__all__ = ["ANY_TERMINAL", "COMPLETED_ONLY", "EventFilter"]

_TYPES = ("CompletedOnly", "AnyTerminal", "States")
_TERMINAL_NAMES = ", ".join(s.value for s in TERMINAL_STATES)


@dataclass(frozen=True)
class EventFilter:
    """A terminal-state filter. ``states`` is the canonical set (terminal order, no repeats).

    Build one with :meth:`completed_only`, :meth:`any_terminal`, :meth:`of_states` or
    :meth:`from_json`; two filters that fire on the same states but are spelled differently
    (``AnyTerminal`` and ``States`` of all five) stay distinct, as their JSON differs.
    """

    type: str
    states: tuple[ExecutionState, ...]

    @classmethod
    def completed_only(cls) -> EventFilter:
        return cls("CompletedOnly", (ExecutionState.COMPLETED,))

    @classmethod
    def any_terminal(cls) -> EventFilter:
        return cls("AnyTerminal", TERMINAL_STATES)

    @classmethod
    def of_states(cls, states: Any) -> EventFilter:
        """``States([...])``: terminal states by name; at least one, repeats ignored.

        :raises InvalidFieldError: not a non-empty list of terminal state names.
        """
        if not isinstance(states, list | tuple) or not states:
            raise InvalidFieldError(
                "filter.data", f"must be a non-empty list of terminal states ({_TERMINAL_NAMES})"
            )
        chosen = set()
        for item in states:
            try:
                state = ExecutionState(item)
            except (ValueError, TypeError):
                state = None
            if state is None or not state.outcome:  # ContinuedAsNew is no outcome
                raise InvalidFieldError(
                    "filter.data", f"{item!r:.60} is not a terminal state; use {_TERMINAL_NAMES}"
                )
            chosen.add(state)
        return cls("States", tuple(s for s in TERMINAL_STATES if s in chosen))

    @classmethod
    def from_json(cls, data: Any) -> EventFilter:
        """Read the JSON shape; ``None`` means ``AnyTerminal``.

        :raises InvalidFieldError: an unknown type, extra keys, or bad ``data``.
        """
        if data is None:
            return cls.any_terminal()
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            raise InvalidFieldError("filter", f"must be an object with a type ({', '.join(_TYPES)})")
        kind = data["type"]
        allowed = {"type", "data"} if kind == "States" else {"type"}
        extra = sorted(str(k) for k in data if k not in allowed)
        if extra:
            raise InvalidFieldError("filter", f"unknown key(s) {', '.join(extra)!s:.100} for {kind!r:.40}")
        if kind == "CompletedOnly":
            return cls.completed_only()
        if kind == "AnyTerminal":
            return cls.any_terminal()
        if kind == "States":
            return cls.of_states(data.get("data"))
        raise InvalidFieldError("filter.type", f"{kind!r:.60} is not one of {', '.join(_TYPES)}")

    def to_json(self) -> dict[str, Any]:
        if self.type == "States":
            return {"type": "States", "data": [s.value for s in self.states]}
        return {"type": self.type}

    def matches(self, state: ExecutionState | str) -> bool:
        """Whether an execution that ended in ``state`` fires this filter (never an open state)."""
        try:
            return ExecutionState(state) in self.states
        except ValueError:
            return False


COMPLETED_ONLY = EventFilter.completed_only()
ANY_TERMINAL = EventFilter.any_terminal()
