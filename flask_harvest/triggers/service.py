"""What an app does with completion triggers: register, list, read, delete, read fires, re-evaluate.

The admin API and the CLI are thin over :class:`TriggerService`; :func:`flask_harvest.engine.add_triggers`
builds it and plugs its :class:`~.firing.TriggerFiring` into the workflow store's terminal hooks.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from .._input import id_problem
from .._time import utcnow
from ..errors import InvalidFieldError, InvalidStateError, NotFoundError
from ..http.cursor import decode_position, encode_position
from ..workflows.errors import ExecutionNotFoundError
from ..workflows.hooks import pop_after_commit
from ..workflows.service import WorkflowService
from ..workflows.store import SqlWorkflowStore
from .definitions import CompletionTrigger, trigger_to_json
from .firing import FireEvent, TriggerCounters, TriggerFiring
from .store import Fire, SqlTriggerStore, StoredTrigger

__all__ = ["TriggerNotFoundError", "TriggerService", "fire_to_json", "stored_to_json"]

logger = logging.getLogger(__name__)

#: The most rows (fires or triggers) one listing returns.
MAX_LIST_LIMIT = 500
#: Longer than any id column: a longer id is unknown without a query.
_MAX_ID = 64


class TriggerNotFoundError(NotFoundError):
    """No completion trigger has this id."""

    def __init__(self, trigger_id: str) -> None:
        super().__init__(f"no completion trigger with id {trigger_id!r}")
        self.trigger_id = trigger_id


def stored_to_json(stored: StoredTrigger) -> dict[str, Any]:
    """The admin API's form of a stored trigger; a row that no longer parses is shown as stored,
    with ``invalid`` saying why (the terminal hook skips it, failing closed)."""
    try:
        return trigger_to_json(stored.parse())
    except InvalidFieldError as exc:
        return {
            "id": stored.id,
            "source_workflow_name": stored.source_workflow_name,
            "terminal_states": stored.terminal_states,
            "target_workflow_name": stored.target_workflow_name,
            "input_mapping": stored.input_mapping,
            "condition": stored.condition,
            "created_at": stored.created_at.isoformat().replace("+00:00", "Z"),
            "updated_at": stored.updated_at.isoformat().replace("+00:00", "Z"),
            "invalid": str(exc),
        }


def fire_to_json(fire: Fire) -> dict[str, Any]:
    """The admin API's form of a fires-ledger row."""
    return {
        "source_exec_id": fire.source_exec_id,
        "trigger_id": fire.trigger_id,
        "fired_at": fire.fired_at.isoformat().replace("+00:00", "Z"),
        "outcome": fire.outcome,
        "target_execution_id": fire.target_execution_id,
    }


class TriggerService:
    """The completion triggers of one engine.

    :param retention_seconds: fires rows older than this whose source execution is gone are purged
        by :meth:`purge_fires`; ``None`` keeps every row.
    """

    def __init__(
        self,
        store: SqlTriggerStore,
        firing: TriggerFiring,
        workflows: WorkflowService,
        *,
        retention_seconds: float | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.store = store
        self.firing = firing
        self.workflows = workflows
        self.retention_seconds = retention_seconds
        self.clock = clock
        #: The ids of the triggers declared in code (synced at start-up): the dashboard shows them
        #: read-only, since the next start-up writes them over again.
        self.code_defined: set[str] = set()

    def __repr__(self) -> str:
        return f"<TriggerService {self.store!r}>"

    @property
    def counters(self) -> TriggerCounters:
        """The in-process fires and skipped counts."""
        return self.firing.counters

    def register(
        self, trigger: CompletionTrigger, *, allow_unknown_workflows: bool = False
    ) -> CompletionTrigger:
        """Register ``trigger`` (full replacement of a trigger with the same id); return it as stored.

        :param allow_unknown_workflows: accept source and target names that no workflow of this
            process is registered under (workflows that only other processes register).
        :raises InvalidFieldError: ``source_workflow_name`` or ``target_workflow_name`` names no
            registered workflow (a typo would otherwise never fire, or never start its target).
        """
        if not allow_unknown_workflows:
            for field in ("source_workflow_name", "target_workflow_name"):
                name = getattr(trigger, field)
                if name not in self.workflows.registry:
                    raise InvalidFieldError(
                        field,
                        f"no workflow named {name!r} is registered in this app (registered: "
                        f"{_some(self.workflows.registry.names())}); if only other "
                        "processes register it, allow unknown workflow names (--allow-unknown, "
                        "?allow_unknown_workflows=true)",
                    )
        return self.store.upsert(trigger, now=self.clock())

    def sync(self, triggers: Sequence[CompletionTrigger]) -> list[CompletionTrigger]:
        """Upsert the statically registered triggers (at start-up)."""
        synced = self.store.sync(triggers, now=self.clock())
        self.code_defined.update(trigger.id for trigger in triggers)
        return synced

    def list_triggers(self) -> list[StoredTrigger]:
        """Every stored trigger, oldest first."""
        return self.store.list_triggers()

    def triggers_page(
        self, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[StoredTrigger], str | None]:
        """Return one page of stored triggers, oldest first, and the cursor of the next page (or
        ``None``): a keyset walk, never a count.

        :raises InvalidFieldError: ``limit`` is not between 1 and 500, or a bad cursor.
        """
        _check_limit(limit)
        rows = self.store.list_triggers(limit=limit + 1, after=decode_position(cursor) if cursor else None)
        page = rows[:limit]
        return page, encode_position(page[-1].created_at, page[-1].id) if len(rows) > limit else None

    def get(self, trigger_id: str) -> StoredTrigger:
        """:raises TriggerNotFoundError: no trigger has this id."""
        known = id_problem(trigger_id, max_chars=_MAX_ID) is None
        stored = self.store.get(_canonical(trigger_id)) if known else None
        if stored is None:
            raise TriggerNotFoundError(trigger_id)
        return stored

    def delete(self, trigger_id: str) -> None:
        """Delete a trigger and its fires rows.

        :raises TriggerNotFoundError: no trigger has this id.
        """
        known = id_problem(trigger_id, max_chars=_MAX_ID) is None
        if not (known and self.store.delete(_canonical(trigger_id))):
            raise TriggerNotFoundError(trigger_id)

    def fires(
        self, *, trigger_id: str | None = None, source_exec_id: str | None = None, limit: int = 100
    ) -> list[Fire]:
        """Fires-ledger rows, newest first.

        :raises InvalidFieldError: ``limit`` is not between 1 and 500.
        """
        _check_limit(limit)
        if any(key is not None and id_problem(key) is not None for key in (trigger_id, source_exec_id)):
            return []  # no row has such an id, and the database driver would fail on some
        return self.store.fires(trigger_id=trigger_id, source_exec_id=source_exec_id, limit=limit)

    def evaluate(self, execution_id: str) -> list[FireEvent]:
        """Evaluate the triggers of an ended execution again, in a transaction of its own.

        Pairs the ledger has decided are ``deduped``; a pair left undecided (``condition_invalid``)
        or whose target failed to start (``validation_failed``, ``payload_too_large``, recorded in
        the ledger) can fire now. This is how an operator recovers
        a lost fire after fixing a trigger.

        :raises ExecutionNotFoundError: no execution has this id.
        :raises InvalidStateError: the execution has not ended.
        """
        if id_problem(execution_id, max_chars=_MAX_ID) is not None:
            raise ExecutionNotFoundError(execution_id)
        execution = self.workflows.get(execution_id)
        if not execution.terminal:
            raise InvalidStateError(
                f"workflow execution {execution_id} is {execution.state.value}: triggers fire when it ends"
            )
        # On the source's shard: its ledger rows and a same-shard target live there.
        db = self.store.of_execution(execution.execution_id).db
        with db.transaction("evaluate completion triggers") as conn:
            events = self.firing.evaluate(conn, execution)
            started = SqlWorkflowStore.started_in(conn)
            after = pop_after_commit(conn)
        self.workflows.runner.schedule_started(started)
        for action in after:  # a cross-shard start's first attempt; the sweeper covers a failure
            try:
                action()
            except Exception:
                logger.warning("harvest: an after-commit action failed; the sweeper covers it", exc_info=True)
        return events

    def purge_fires(self) -> int:
        """Delete fires rows older than the retention horizon whose source execution is gone and
        whose cross-shard start is not waiting in the outbox; with no horizon, none.
        :returns: how many were deleted."""
        if self.retention_seconds is None:
            return 0
        return self.store.purge_fires(before=self.clock() - timedelta(seconds=self.retention_seconds))


def _some(names: Sequence[str], shown: int = 10) -> str:
    """Up to ``shown`` names, for an error message."""
    if not names:
        return "none"
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


def _check_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
        raise InvalidFieldError("limit", f"must be an integer between 1 and {MAX_LIST_LIMIT}")


def _canonical(trigger_id: str) -> str:
    """Registration stores a UUID in its canonical form: look it up the same way (``ABC...`` too)."""
    try:
        return str(uuid.UUID(trigger_id))
    except ValueError:
        return trigger_id
