"""Races between a running workflow and a cancel, terminate or deadline that lands in the gap between
a boundary's look at the row and the durable sleep's suspend (SQLite and PostgreSQL).

The gap is made deterministic by a store that lets the other party act right after the sleep's
checkpoint is written (after the boundary, before the suspend), exactly as if its transaction had
committed there.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from flask_harvest.errors import StoreError
from flask_harvest.workflows import (
    ExecutionState,
    SqlWorkflowStore,
    TerminalHooks,
    WorkflowContext,
    WorkflowRunner,
)
from flask_harvest.workflows import context as workflow_context
from flask_harvest.workflows.context import SLEEP_STEP

from .test_workflows_runner import Harness
from .workflow_support import SQL_KINDS, run_counts, workflow_store

S = ExecutionState


class GapStore(SqlWorkflowStore):
    """A store that runs ``before_suspend`` (the racing party) once a sleep's checkpoint landed."""

    before_suspend: Callable[[str], object] | None = None

    def checkpoint(self, execution_id: str, token: str, seq: int, name: str, **kwargs: Any) -> Any:
        lease = super().checkpoint(execution_id, token, seq, name, **kwargs)
        if lease is not None and name == SLEEP_STEP and self.before_suspend is not None:
            self.before_suspend(execution_id)
        return lease


@pytest.fixture(params=SQL_KINDS)
def h(request: pytest.FixtureRequest) -> Harness:
    plain = workflow_store(request, request.param)
    return Harness(GapStore(plain.engine, hooks=TerminalHooks()))


def napper(h: Harness, timeout: timedelta | None = None) -> str:
    @h.registry.workflow("nap", timeout=timeout)
    def nap(ctx: WorkflowContext, value: Any) -> Any:
        ctx.step("before", h.count("before"))
        ctx.sleep(timedelta(hours=1))
        return ctx.step("after", h.count("after"))

    execution, _ = h.runner.start("nap", None)
    return execution.execution_id


def gap(h: Harness) -> GapStore:
    assert isinstance(h.store, GapStore)
    return h.store


def test_a_cancel_between_the_boundary_and_the_suspend_ends_the_run_cancelled_at_once(h: Harness) -> None:
    eid = napper(h)
    gap(h).before_suspend = lambda execution_id: h.store.request_cancel(
        execution_id, "customer withdrew", now=h.clock()
    )
    assert h.runner.run(eid) is None
    ended = h.store.get(eid)
    # Not Pending with cancel_requested until the wake time an hour later.
    assert ended is not None and ended.state is S.CANCELLED and ended.error == "customer withdrew"
    assert ended.next_run_at is None and ended.lease_token is None
    assert h.runner.run(eid) is None  # a job at the wake time finds nothing to do
    assert [s.name for s in h.store.list_steps(eid)] == ["before", "harvest:sleep"]


def test_a_terminate_between_the_boundary_and_the_suspend_ends_the_run_terminated(h: Harness) -> None:
    eid = napper(h)
    gap(h).before_suspend = lambda execution_id: h.store.terminate(execution_id, "stop", now=h.clock())
    assert h.runner.run(eid) is None
    ended = h.store.get(eid)
    assert ended is not None and ended.state is S.TERMINATED and ended.error == "stop"
    assert not h.scheduled.calls[1:], "a terminated run is not scheduled to wake"


def test_a_deadline_passing_between_the_boundary_and_the_suspend_ends_the_run_timed_out(h: Harness) -> None:
    eid = napper(h, timeout=timedelta(minutes=10))
    gap(h).before_suspend = lambda execution_id: h.clock.advance(minutes=11)
    assert h.runner.run(eid) is None
    ended = h.store.get(eid)
    # Without the sweeper's timeout scan: the run itself ends it instead of going to sleep.
    assert ended is not None and ended.state is S.TIMED_OUT and "deadline" in (ended.error or "")


def test_a_cancel_after_the_suspend_ends_the_sleeping_run_at_once(h: Harness) -> None:
    eid = napper(h)
    assert h.runner.run(eid) is None
    cancelled = h.store.request_cancel(eid, "no longer needed", now=h.clock())
    assert cancelled.state is S.CANCELLED and cancelled.error == "no longer needed"


def test_suspend_refuses_a_run_with_a_cancel_request_or_past_its_deadline(h: Harness) -> None:
    store = h.store
    now = h.clock()
    wake = now + timedelta(hours=1)
    for deadline, cancel in ((None, True), (now - timedelta(seconds=1), False), (now, False), (None, False)):
        execution, _ = store.start("w", None, now=now, deadline=deadline)
        claimed = store.claim(execution.execution_id, now=now, lease_seconds=30)
        assert claimed is not None and claimed.lease_token is not None
        if cancel:
            store.request_cancel(execution.execution_id, now=now)
        slept = store.suspend(execution.execution_id, claimed.lease_token, wake_at=wake, now=now)
        # Only a run with no cancel request whose deadline has not passed goes to sleep.
        assert slept is (not cancel and (deadline is None or deadline >= now))
        assert store.get(execution.execution_id).state is (S.PENDING if slept else S.RUNNING)  # type: ignore[union-attr]


def test_a_cancel_requested_before_the_worker_died_ends_the_run_cancelled_at_the_sweep(h: Harness) -> None:
    runner = WorkflowRunner(
        h.store, h.registry, h.scheduled, lease_seconds=30, max_recovery_attempts=0, heartbeat_interval=0,
        clock=h.clock,
    )  # fmt: skip
    execution, _ = h.store.start("w", None, now=h.clock())
    eid = execution.execution_id
    assert h.store.claim(eid, now=h.clock(), lease_seconds=30) is not None
    h.store.request_cancel(eid, "customer withdrew", now=h.clock())
    h.clock.advance(seconds=31)  # the worker died: its lease expired
    report = runner.sweep_once()
    # Cancelled, not requeued to run the code again, nor failed as a poison pill.
    assert (report.cancelled, report.released, report.requeued, report.poisoned) == (1, 1, 0, 0)
    ended = h.store.get(eid)
    assert ended is not None and ended.state is S.CANCELLED and ended.error == "customer withdrew"


class FlakyStore(SqlWorkflowStore):
    """A store whose next ``renew`` or ``checkpoint`` fails as a database outage would."""

    fail_next: str | None = None

    def _maybe_fail(self, call: str) -> None:
        if self.fail_next == call:
            self.fail_next = None
            raise StoreError(f"could not {call}: the database went away")

    def renew(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("renew")
        return super().renew(*args, **kwargs)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("checkpoint")
        return super().checkpoint(*args, **kwargs)


@pytest.mark.parametrize("call", ["renew", "checkpoint"])
def test_workflow_code_cannot_mistake_a_database_failure_for_a_failed_step(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    # Every boundary reads the row (none reuses the claim's fresh read), so the renew is reached.
    monkeypatch.setattr(workflow_context, "FRESH_SECONDS", -1.0)
    plain = workflow_store(request, "sqlite")
    flaky = FlakyStore(plain.engine, hooks=TerminalHooks())
    h = Harness(flaky)

    @h.registry.workflow("charge_or_compensate")
    def charge_or_compensate(ctx: WorkflowContext, value: Any) -> Any:
        try:
            return ctx.step("charge", h.count("charge"))
        except Exception:  # a failed charge is compensated: a step error, never the engine's
            return ctx.step("compensate", h.count("compensate"))

    execution, _ = h.runner.start("charge_or_compensate", None)
    flaky.fail_next = call  # the boundary before the charge, or the charge's checkpoint
    with pytest.raises(StoreError, match="the database went away"):
        h.runner.run(execution.execution_id)
    still = h.store.get(execution.execution_id)
    assert still is not None and still.state is S.RUNNING and h.store.list_steps(execution.execution_id) == []
    assert "compensate" not in run_counts(h.store.engine)
    h.recover()
    done = h.runner.run(execution.execution_id)
    assert done is not None and done.state is S.COMPLETED and done.output == "charge"
    assert "compensate" not in run_counts(h.store.engine)
