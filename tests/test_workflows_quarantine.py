"""Quarantine, in one process on SQLite and PostgreSQL: a run whose worker died beside other runs
is requeued uncharged and then runs alone (the runner's gate), recorded as such; at one run at a
time every claim is alone. The worker deaths themselves are in tests/faults/test_workflow_faults.py."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from flask_harvest.workflows import (
    ExecutionState,
    SqlWorkflowStore,
    WorkflowContext,
    WorkflowRegistry,
    WorkflowRunner,
)
from flask_harvest.workflows.models import Isolation

from .workflow_support import SQL_KINDS, Clock, Scheduled, workflow_store

S = ExecutionState
LEASE = 30.0


@pytest.fixture(params=SQL_KINDS)
def store(request: pytest.FixtureRequest) -> SqlWorkflowStore:
    return workflow_store(request, request.param)


class Log:
    """Which run entered and left its step, in order (thread-safe)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def add(self, event: str, execution_id: str) -> None:
        with self._lock:
            self.events.append((event, execution_id))


def logging_runner(store: SqlWorkflowStore, log: Log, clock: Clock, concurrency: int) -> WorkflowRunner:
    registry = WorkflowRegistry()

    @registry.workflow("logged")
    def logged(ctx: WorkflowContext, value: Any) -> Any:
        def step() -> int:
            log.add("enter", ctx.execution_id)
            log.add("leave", ctx.execution_id)
            return int(value)

        return ctx.step("only", step)

    return WorkflowRunner(
        store,
        registry,
        Scheduled(),
        lease_seconds=LEASE,
        heartbeat_interval=0,
        concurrency=concurrency,
        clock=clock,
    )


def quarantine(store: SqlWorkflowStore, execution_id: str, clock: Clock) -> None:
    """Claim the run beside others and let its lease expire, as when its worker died."""
    assert store.claim(execution_id, now=clock(), lease_seconds=LEASE) is not None
    now = clock.advance(seconds=LEASE + 1)
    assert store.expired_leases(now=now, max_recovery_attempts=1).requeued == [execution_id]


def test_a_quarantined_run_runs_alone_and_is_recorded_alone(store: SqlWorkflowStore) -> None:
    log, clock = Log(), Clock()
    runner = logging_runner(store, log, clock, concurrency=4)
    ids = [runner.start("logged", n)[0].execution_id for n in range(7)]
    suspect = ids[3]
    quarantine(store, suspect, clock)
    try:
        runner.run_many(ids)
    finally:
        runner.close()
    for execution_id in ids:
        done = store.get(execution_id)
        assert done is not None and done.state is S.COMPLETED
    ran = store.get(suspect)
    assert ran is not None and ran.isolation == Isolation.ALONE.value
    assert ran.recovery_count == 1 and ran.charged_recoveries == 0
    assert all(store.get(i).isolation is None for i in ids if i != suspect)  # type: ignore[union-attr]
    # Nothing else entered or left a step while the suspect was in its own.
    entered = log.events.index(("enter", suspect))
    assert log.events[entered + 1] == ("leave", suspect)


def test_at_one_run_at_a_time_every_claim_is_alone(store: SqlWorkflowStore) -> None:
    log, clock = Log(), Clock()
    runner = logging_runner(store, log, clock, concurrency=1)
    eid = runner.start("logged", 1)[0].execution_id
    claimed = store.claim(eid, now=clock(), lease_seconds=LEASE, alone=True)
    assert claimed is not None and claimed.isolation == Isolation.ALONE.value
    # Its worker died: charged, since it ran alone.
    now = clock.advance(seconds=LEASE + 1)
    assert store.expired_leases(now=now, max_recovery_attempts=1).requeued == [eid]
    requeued = store.get(eid)
    assert requeued is not None and requeued.charged_recoveries == 1
    runner.run(eid)
    done = store.get(eid)
    assert done is not None and done.state is S.COMPLETED and done.isolation == Isolation.ALONE.value


def test_a_quarantined_run_whose_lease_was_taken_over_while_it_waited_does_not_run(
    store: SqlWorkflowStore,
) -> None:
    log, clock = Log(), Clock()
    runner = logging_runner(store, log, clock, concurrency=4)
    eid = runner.start("logged", 1)[0].execution_id
    quarantine(store, eid, clock)
    claimed = store.claim(eid, now=clock(), lease_seconds=LEASE)
    assert claimed is not None and claimed.isolation == Isolation.QUARANTINED.value
    # Another worker took it over (the lease expired meanwhile): this claim's token is stale.
    now = clock.advance(seconds=LEASE + 1)
    store.expired_leases(now=now, max_recovery_attempts=5)
    assert store.claim(eid, now=now + timedelta(seconds=1), lease_seconds=LEASE) is not None
    assert runner._run_claimed(claimed, clock()) is None
    assert log.events == []


def test_a_run_holds_the_gate_until_its_end_is_committed(store: SqlWorkflowStore) -> None:
    """The terminal transition is part of the run: a quarantined run's end is committed before
    the next run may be recorded alone (else a death of the process between the two would be
    charged to both), and a run beside others holds its place until its end too."""
    log, clock = Log(), Clock()
    runner = logging_runner(store, log, clock, concurrency=4)
    seen: dict[str, tuple[bool, int, str | None]] = {}

    def at_the_end(conn: Any, execution: Any) -> None:
        gate = runner._gate.get()
        seen[execution.execution_id] = (gate._alone, gate._beside, execution.isolation)

    store.hooks.register(at_the_end)
    beside, suspect = (runner.start("logged", n)[0].execution_id for n in range(2))
    quarantine(store, suspect, clock)
    try:
        runner.run_many([beside, suspect])
    finally:
        runner.close()
    # In its terminal transaction, each run still held its place in the gate.
    assert seen[suspect] == (True, 0, Isolation.ALONE.value)
    assert seen[beside] == (False, 1, None)


def test_a_stopping_runner_finishes_the_run_under_way_and_gives_back_the_one_waiting(
    store: SqlWorkflowStore,
) -> None:
    """close() waits for the runs under way only: a run handed over that has not begun (here a
    quarantined one waiting for its turn to run alone) goes back to the queue, due, for another
    worker, with its steps untouched."""
    entered, release = threading.Event(), threading.Event()
    ran: list[str] = []
    registry = WorkflowRegistry()

    @registry.workflow("held")
    def held(ctx: WorkflowContext, value: Any) -> Any:
        def step() -> int:
            ran.append(ctx.execution_id)
            if value == "hold":
                entered.set()
                assert release.wait(30)
            return 1

        return ctx.step("only", step)

    clock, backend = Clock(), Scheduled()
    runner = WorkflowRunner(
        store, registry, backend, lease_seconds=LEASE, heartbeat_interval=0, concurrency=3, clock=clock
    )
    under_way = runner.start("held", "hold")[0].execution_id
    waiting = runner.start("held", "go")[0].execution_id
    quarantine(store, waiting, clock)
    runner.submit_many([under_way])
    assert entered.wait(30)
    runner.submit_many([waiting])  # claimed, then waits at the gate for the run under way
    closing = threading.Thread(target=runner.close)
    closing.start()
    assert runner._closing.wait(30)
    release.set()
    closing.join(30)
    assert not closing.is_alive()
    done, back = store.get(under_way), store.get(waiting)
    assert done is not None and done.state is S.COMPLETED
    assert back is not None and back.state is S.PENDING and back.lease_token is None
    assert back.next_run_at is not None and back.next_run_at <= clock()
    assert back.charged_recoveries == 0 and store.list_steps(waiting) == []
    assert ran == [under_way]
    assert (waiting, None) in backend.calls


def wait_until(condition: Any, seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_a_run_that_waited_at_the_gate_runs_only_if_its_claim_is_still_its_own(
    store: SqlWorkflowStore,
) -> None:
    # It waited behind a run alone, with no heartbeat (heartbeat_interval=0): its lease ran out and
    # another worker took the run over meanwhile. It must not run a step the other may have
    # checkpointed already.
    log, clock = Log(), Clock()
    runner = logging_runner(store, log, clock, concurrency=4)
    eid = runner.start("logged", 1)[0].execution_id
    claimed = store.claim(eid, now=clock(), lease_seconds=LEASE)
    assert claimed is not None and claimed.isolation is None
    now = clock.advance(seconds=LEASE + 1)
    store.expired_leases(now=now, max_recovery_attempts=5)
    assert store.claim(eid, now=now, lease_seconds=LEASE) is not None  # the other worker's

    held, release = threading.Event(), threading.Event()

    def hold_alone() -> None:
        with runner._gate.get().alone(LEASE):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_alone, daemon=True)
    holder.start()
    assert held.wait(10)
    results: list[object] = []

    def run() -> None:
        results.append(runner._run_claimed(claimed, clock()))

    waiter = threading.Thread(target=run, daemon=True)
    waiter.start()
    wait_until(lambda: runner._gate.get().waiting_beside == 1)  # it found the gate held
    release.set()
    waiter.join(30)
    holder.join(30)
    assert results == [None]
    assert log.events == []


def test_no_run_waits_at_the_gate_past_its_patience() -> None:
    from flask_harvest.workflows.runner import _Entry, _Gate

    gate = _Gate()
    held, release = threading.Event(), threading.Event()

    def hold(enter: Any) -> None:
        with enter:
            held.set()
            release.wait(30)

    # A run alone holds the gate: a run beside waits its patience, then gives up.
    holder = threading.Thread(target=hold, args=(gate.alone(1.0),), daemon=True)
    holder.start()
    assert held.wait(10)
    with gate.beside(0.05) as entry:
        assert entry is _Entry.GAVE_UP
    release.set()
    holder.join(10)

    # Runs beside hold it: a quarantined run waits its patience, gives up, and the runs that
    # arrived behind it (which wait for it) go on.
    held.clear()
    release.clear()
    holder = threading.Thread(target=hold, args=(gate.beside(1.0),), daemon=True)
    holder.start()
    assert held.wait(10)
    with gate.alone(0.05) as entry:
        assert entry is _Entry.GAVE_UP
    with gate.beside(1.0) as entry:
        assert entry is _Entry.AT_ONCE
    release.set()
    holder.join(10)
    with gate.alone(1.0) as entry:
        assert entry is _Entry.AT_ONCE
