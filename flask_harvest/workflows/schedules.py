"""Scheduled workflows: the sweeper starts one run per cron tick, across every worker.

A workflow declared with ``schedule="*/5 * * * *"`` gets a row in ``harvest_workflow_schedules``.
Each sweep (the one sweeper, in every worker) plans the ticks that fell since the row's
``last_tick_at`` (:func:`~flask_harvest.workflows.cron.plan_ticks`), then, in one transaction,
moves ``last_tick_at`` with a guarded UPDATE and starts the ticks' runs. Of two sweeps that read the
same row only one moves it; the run of a tick has the ``workflow_id`` ``"<name>@<tick>"`` and is
started under ``RejectDuplicate``, which is the second line of defence.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from .._input import id_problem
from .._time import utcnow
from ..errors import HarvestError, StoreError
from ..sweeper import SweepReport
from ._schedule_store import ScheduleNotFoundError, ScheduleRow, SqlScheduleStore
from .cron import MAX_COUNTED, CronSchedule, plan_ticks, tick_iso
from .errors import WorkflowIdReusedError
from .models import Execution, IdReusePolicy
from .service import WorkflowService
from .store import SqlWorkflowStore

__all__ = [
    "ScheduleNotFoundError",
    "ScheduleView",
    "WorkflowSchedules",
    "schedule_grace",
    "schedule_to_dict",
    "scheduled_workflow_id",
]

logger = logging.getLogger(__name__)

#: The least lateness that still counts a tick as on time, whatever the sweep interval.
MIN_GRACE = timedelta(seconds=2)


def schedule_grace(sweep_interval_seconds: float) -> timedelta:
    """How late a sweep may see a tick and still count it on time: three sweep intervals, and at
    least :data:`MIN_GRACE`. A later tick was missed (no worker swept while it was due)."""
    return max(MIN_GRACE, timedelta(seconds=3 * sweep_interval_seconds))


def scheduled_workflow_id(name: str, tick: datetime) -> str:
    """The ``workflow_id`` of the run of ``name``'s schedule at ``tick``: one per tick."""
    return f"{name}@{tick_iso(tick)}"


@dataclass(frozen=True)
class ScheduleView:
    """A schedule as the CLI, the HTTP API and the dashboard show it.

    :param declared: whether this app declares it (a schedule removed from the code is inert).
    :param next_tick_at: the next tick that starts a run (``None`` while paused or inert).
    """

    name: str
    cron: str
    paused: bool
    last_tick_at: datetime
    next_tick_at: datetime | None
    updated_at: datetime
    declared: bool


def schedule_to_dict(view: ScheduleView) -> dict[str, Any]:
    """A schedule's JSON form."""
    return {
        "name": view.name,
        "cron": view.cron,
        "paused": view.paused,
        "declared": view.declared,
        "last_tick_at": view.last_tick_at.isoformat(),
        "next_tick_at": view.next_tick_at.isoformat() if view.next_tick_at is not None else None,
        "updated_at": view.updated_at.isoformat(),
    }


class WorkflowSchedules:
    """The schedules of one engine's workflows: sync, the sweeper step, list, pause and resume.

    :param store: the schedules table, in the workflow store's database.
    :param workflows: starts the runs (its registry says which workflows have a schedule).
    :param catchup: missed ticks a sweep starts at most per schedule (the most recent ones).
    :param grace: see :func:`schedule_grace`.
    """

    def __init__(
        self,
        store: SqlScheduleStore,
        workflows: WorkflowService,
        *,
        catchup: int,
        grace: timedelta,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.store = store
        self.workflows = workflows
        self.catchup = catchup
        self.grace = grace
        self.clock = clock
        # What this process has written into the table: a sweep syncs only what is new since.
        self._synced: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"<WorkflowSchedules {sorted(self.declared())}>"

    def declared(self) -> dict[str, CronSchedule]:
        """The schedules this app's workflows declare, by workflow name."""
        return {d.name: d.schedule for d in self.workflows.registry if d.schedule is not None}

    def sync(self) -> None:
        """Write the declared schedules into the table: a new one starts with the next tick; a known
        one gets the declared cron text and keeps ``paused`` and ``last_tick_at``. A row whose
        workflow is no longer declared stays, inert."""
        now = self.clock()
        for name, cron in self.declared().items():
            if self._synced.get(name) == cron.text:
                continue
            self.store.sync(name, cron.text, cron.last_at_or_before(now) or now, now=now)
            self._synced[name] = cron.text

    def sweep(self) -> SweepReport:
        """The sweeper's ``workflow-schedules`` step: start the due ticks' runs of every declared,
        unpaused schedule.

        :raises StoreError: the database failed (the other schedules were not swept).
        """
        declared = self.declared()
        if not declared:
            return SweepReport()  # no query at all for an app without schedules
        self.sync()
        started = 0
        for row in self.store.all():
            if row.paused or row.name not in declared:
                continue
            try:
                started += self._tick(row)
            except StoreError:
                raise
            except HarvestError:
                # One schedule's bad row (cron text written by another version) must not stop the
                # others; it is tried again at the next sweep.
                logger.exception("harvest: could not start the runs of schedule %r", row.name)
        return SweepReport(scheduled=started)

    def _tick(self, row: ScheduleRow) -> int:
        now = self.clock()
        cron = CronSchedule.parse(row.cron)
        plan = plan_ticks(cron, row.last_tick_at, now, catchup=self.catchup, grace=self.grace)
        if plan.last is None:
            return 0
        runner = self.workflows.runner
        callbacks = self.workflows.prepared_callbacks(None)

        def start(tick: datetime, conn: Connection | None) -> Execution | None:
            # Refused: this tick's run was started (and maybe has ended) already.
            with contextlib.suppress(WorkflowIdReusedError):
                execution, new = runner.start(
                    row.name,
                    {"scheduled_at": tick_iso(tick)},
                    workflow_id=scheduled_workflow_id(row.name, tick),
                    policy=IdReusePolicy.REJECT_DUPLICATE,
                    completion_callbacks=callbacks,
                    conn=conn,
                )
                return execution if new else None
            return None

        created: list[str] = []
        with self.store.db.transaction("start scheduled workflow runs") as conn:
            # A tick whose run lives on another shard cannot join this transaction: it starts on
            # its own first, so a crash before the advance below commits leaves the tick to the
            # next sweep, whose start of the same workflow_id is refused as a duplicate.
            elsewhere = [
                t
                for t in plan.start
                if not self.workflows.store.can_start_in(conn, scheduled_workflow_id(row.name, t))
            ]
            created += [e.execution_id for t in elsewhere if (e := start(t, None)) is not None]
            if not self.store.advance(conn, row, plan.last, now=now):
                return 0  # another sweep handled these ticks
            try:
                for tick in plan.start:
                    if tick not in elsewhere:
                        start(tick, conn)
            finally:
                here = SqlWorkflowStore.started_in(conn)
        runner.schedule_started(here)
        created += here
        if plan.skipped:
            more = "or more " if plan.skipped >= MAX_COUNTED else ""
            logger.warning(
                "harvest: schedule %r missed %d %stick(s) up to %s while no worker swept; skipped "
                "them (HARVEST_WORKFLOW_SCHEDULE_CATCHUP starts at most %d missed ticks)",
                row.name,
                plan.skipped,
                more,
                tick_iso(plan.skipped_until) if plan.skipped_until else "?",
                self.catchup,
            )
        return len(created)

    # -- operators -----------------------------------------------------------------------------

    def list_schedules(self) -> list[ScheduleView]:
        """Every schedule in the table, by name, with its next tick."""
        self.sync()
        now = self.clock()
        declared = self.declared()
        return [self._view(row, declared, now) for row in self.store.all()]

    def get(self, name: str) -> ScheduleView:
        """The schedule ``name``.

        :raises ScheduleNotFoundError: there is none.
        """
        return self._view(self.store.get(self._check(name)), self.declared(), self.clock())

    def pause(self, name: str) -> ScheduleView:
        """Pause ``name``: no tick starts a run until it is resumed.

        :raises ScheduleNotFoundError: there is none.
        """
        self.sync()
        row = self.store.pause(self._check(name), now=self.clock())
        return self._view(row, self.declared(), self.clock())

    def resume(self, name: str) -> ScheduleView:
        """Resume ``name``: the next tick from now starts a run; the ticks that fell while it was
        paused are not started.

        :raises ScheduleNotFoundError: there is none.
        """
        self.sync()
        now = self.clock()

        def last_tick(cron_text: str) -> datetime:
            try:
                return CronSchedule.parse(cron_text).last_at_or_before(now) or now
            except HarvestError:
                return now

        row = self.store.resume(self._check(name), last_tick, now=now)
        return self._view(row, self.declared(), now)

    @staticmethod
    def _check(name: object) -> str:
        # A name no row can have (not text, a NUL, too long) is unknown, not a database error.
        if not isinstance(name, str) or id_problem(name, max_chars=255) is not None:
            raise ScheduleNotFoundError(name)
        return name

    @staticmethod
    def _view(row: ScheduleRow, declared: dict[str, CronSchedule], now: datetime) -> ScheduleView:
        next_tick = None
        if not row.paused and row.name in declared:
            try:
                next_tick = CronSchedule.parse(row.cron).next_after(max(row.last_tick_at, now))
            except HarvestError:
                next_tick = None
        return ScheduleView(
            row.name, row.cron, row.paused, row.last_tick_at, next_tick, row.updated_at, row.name in declared
        )
