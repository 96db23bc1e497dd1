"""The terminal hooks: what runs in the same transaction as an execution's terminal transition.

Completion callbacks and completion triggers register here. A hook gets the open SQLAlchemy
``Connection`` of the transition's transaction and the execution as it is after the transition; what
it writes commits with the state change, and if it raises, the state change rolls back with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sqlalchemy import Connection

from .models import Execution

__all__ = ["TerminalHook", "TerminalHooks"]

#: ``hook(conn, execution)``: runs inside the terminal transaction, after the state change landed.
TerminalHook = Callable[[Connection, Execution], None]


class TerminalHooks:
    """An ordered registry of terminal hooks; they run in registration order.

    A hook must not commit or roll back the connection, and should not raise for a condition it can
    record instead (a hook that raises makes the execution's terminal transition fail, so the
    execution stays open until its lease expires and is retried).
    """

    def __init__(self) -> None:
        self._hooks: list[TerminalHook] = []
        self._lock = threading.Lock()

    def register(self, hook: TerminalHook) -> TerminalHook:
        """Add ``hook`` (once: registering it again changes nothing) and return it, as a decorator."""
        with self._lock:
            if hook not in self._hooks:
                self._hooks.append(hook)
        return hook

    def unregister(self, hook: TerminalHook) -> None:
        """Remove ``hook`` if it is registered."""
        with self._lock:
            if hook in self._hooks:
                self._hooks.remove(hook)

    def __len__(self) -> int:
        return len(self._hooks)

    def run(self, conn: Connection, execution: Execution) -> None:
        """Run every hook on ``execution`` in the caller's transaction; an exception propagates."""
        for hook in list(self._hooks):
            hook(conn, execution)
