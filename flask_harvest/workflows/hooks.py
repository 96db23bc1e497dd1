"""The terminal hooks: what runs in the same transaction as an execution's terminal transition.

Completion callbacks and completion triggers register here. A hook gets the open SQLAlchemy
``Connection`` of the transition's transaction and the execution as it is after the transition; what
it writes commits with the state change, and if it raises, the state change rolls back with it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import Connection

from .models import Execution

logger = logging.getLogger(__name__)

__all__ = ["TerminalHook", "TerminalHooks", "after_commit", "known_childless", "run_after_commit"]

#: ``conn.info`` key of the functions to call once the transaction has committed.
_AFTER_COMMIT = "harvest_after_commit"


def after_commit(conn: Connection, fn: Callable[[], object]) -> None:
    """Call ``fn`` once ``conn``'s transaction has committed (never if it rolls back).

    For a terminal hook whose rows need a job (completion callbacks): queueing it inside the
    transaction could run it before the rows are visible. The store runs these after committing a
    transaction it owns; in a caller's transaction (``conn=``) call :func:`run_after_commit` after
    the commit. A lost call is harmless when a sweeper step covers the same rows.
    """
    conn.info.setdefault(_AFTER_COMMIT, []).append(fn)


def pop_after_commit(conn: Connection) -> list[Callable[[], object]]:
    """Return (and forget) the functions :func:`after_commit` registered on ``conn``."""
    pending: list[Callable[[], object]] = conn.info.pop(_AFTER_COMMIT, [])
    return pending


def run_after_commit(conn: Connection) -> None:
    """Run what :func:`after_commit` registered on ``conn``; errors are logged, never raised."""
    for fn in pop_after_commit(conn):
        try:
            fn()
        except Exception:
            logger.warning("harvest: an after-commit action failed; the sweeper covers it", exc_info=True)


#: ``conn.info`` key of the runs ending in this transaction that are known to have no child runs.
_CHILDLESS = "harvest_childless_ends"


@contextmanager
def ending_childless(conn: Connection, execution_id: str, childless: bool) -> Iterator[None]:
    """While the block runs the end's hooks, tell them whether the run is known to have no
    child runs (its runner saw every checkpoint of it, and no child start)."""
    if not childless:
        yield
        return
    ends: set[str] = conn.info.setdefault(_CHILDLESS, set())
    ends.add(execution_id)
    try:
        yield
    finally:
        ends.discard(execution_id)


def known_childless(conn: Connection, execution_id: str) -> bool:
    """Whether the run ending in ``conn``'s transaction is known to have no child runs, so a
    hook need not look for them (unknown: ``False``)."""
    return execution_id in conn.info.get(_CHILDLESS, ())


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
