"""Helpers of the workflow tests: a store on each SQL engine, a settable clock, a schedule recorder."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from flask_harvest.jobs.base import JobBackend, JobRef
from flask_harvest.workflows import SqlWorkflowStore, TerminalHooks

from .conftest import STORE_KINDS

#: The SQL engines every workflow test runs on.
SQL_KINDS = [p for p in STORE_KINDS if p.id != "memory"]

START = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)

# Rows that steps and hooks write, outside the harvest tables (a metadata of the tests' own).
test_metadata = sa.MetaData()
runs_table = sa.Table(
    "wf_test_runs",
    test_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("label", sa.String(100), nullable=False),
)


def workflow_store(request: pytest.FixtureRequest, kind: str) -> SqlWorkflowStore:
    """A store on the ``sqlite`` or ``postgres`` engine fixture, with the test table emptied."""
    engine: sa.Engine = request.getfixturevalue(f"{kind}_engine")
    test_metadata.create_all(engine, checkfirst=True)
    with engine.begin() as conn:
        conn.execute(runs_table.delete())
    return SqlWorkflowStore(engine, hooks=TerminalHooks())


def record_run(engine: sa.Engine, label: str) -> None:
    """Count one run of ``label`` in the test table (what a step's side effect looks like)."""
    with engine.begin() as conn:
        conn.execute(runs_table.insert().values(label=label))


def run_counts(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(runs_table.c.label, sa.func.count()).group_by(runs_table.c.label)).all()
    return {label: count for label, count in rows}


class Clock:
    """A clock the test moves by hand; thread-safe, since the heartbeat thread reads it."""

    def __init__(self, now: datetime = START) -> None:
        self._now = now
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, **kwargs: float) -> datetime:
        with self._lock:
            self._now += timedelta(**kwargs)
            return self._now


class Scheduled(JobBackend):
    """A job backend that records the runner's jobs as ``(execution_id, due)`` instead of running
    them; none of them counts as live, as if Redis had lost every one."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, datetime | None]] = []

    def enqueue(self, refs: Sequence[JobRef]) -> None:
        self.calls.extend((ref.id, ref.due) for ref in refs)

    def schedule(self, ref: JobRef, *, at_front: bool = False) -> None:
        self.calls.append((ref.id, ref.due))

    def live_jobs(self, refs: Sequence[JobRef]) -> set[JobRef]:
        return set()


class SimulatedCrash(BaseException):
    """Stands for a worker dying mid-step: not an ``Exception``, so nothing in the runner handles it."""
