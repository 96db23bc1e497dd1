"""Durable workflows under real faults: real ``flask harvest worker`` processes (RQ, the group's own
Redis, PostgreSQL) running the workflows of ``workflow_app.py``, whose steps count their side
effects in a table.

* a worker SIGKILLed inside step 3 of 5: another worker resumes the run, steps 1 and 2 never run
  again, the run completes with the right output;
* ``FLUSHDB`` while runs are asleep, and while runs wait for a worker: the sweeper queues them all
  again and they complete;
* a durable sleep survives its worker being killed: a worker started after the wake time finishes
  the run without repeating the step before the sleep;
* timeouts of a sleeping and of a busy run end them ``TimedOut``; the busy step's checkpoint and the
  steps after it never land;
* a poison pill (a run that kills its worker every time) ends ``Failed`` after
  ``HARVEST_WORKFLOW_MAX_RECOVERY_ATTEMPTS`` recoveries, while other runs complete beside it;
* the same poison pill run beside innocent runs in one process (several runs at once): the death
  charges none of them and quarantines them all; the innocent runs complete, each alone, never
  charged; the pill is charged only for its deaths while alone, and fails after the same number of
  them as when every run is alone;
* cancel and terminate of a running run, and of a sleeping one: cancel ends ``Cancelled`` at the next
  boundary after the running step is checkpointed, terminate ends ``Terminated`` at once and no
  checkpoint lands after it; neither ever ends as the other; a cancelled run whose worker is
  killed ends ``Cancelled`` at the next sweep without running again;
* a worker asked to stop (SIGTERM) inside a step finishes the run first and exits 0.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_harvest import ExecutionState, workflow_service
from flask_harvest.workflows import Execution, SqlWorkflowStore, StepRecord
from flask_harvest.workflows.errors import ExecutionEndedError
from flask_harvest.workflows.models import Isolation
from flask_harvest.workflows.service import WorkflowService

from ..pipeline import close_later
from . import workflow_app
from .conftest import FaultEnv, Worker, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]
TIME_LIMIT_SECONDS = 120

S = ExecutionState
APP_SPEC = "tests.faults.workflow_app:create_app"
LEASE_SECONDS = 4
MAX_RECOVERY_ATTEMPTS = 2
WORKFLOW_CONFIG: dict[str, Any] = {
    "HARVEST_WORKFLOW_LEASE_SECONDS": LEASE_SECONDS,
    "HARVEST_WORKFLOW_MAX_RECOVERY_ATTEMPTS": MAX_RECOVERY_ATTEMPTS,
}
#: Long enough for a lease to expire, a sweep to notice and a worker to start and replay.
RECOVERY_WAIT = 60.0


@dataclass
class WorkflowFaults:
    """The fault environment with the workflow app in this (the "web") process."""

    env: FaultEnv
    app: Flask

    @property
    def service(self) -> WorkflowService:
        return workflow_service(self.app)

    def worker(self, *, restart: bool = False, **overrides: Any) -> Worker:
        return self.env.start_worker(app=APP_SPEC, concurrency=2, restart=restart, **overrides)

    def start(self, name: str, value: Any = None) -> str:
        with self.app.app_context():
            handle, _ = self.service.start(name, value)
        return handle.execution_id

    def get(self, execution_id: str) -> Execution:
        return self.service.get(execution_id)

    def steps(self, execution_id: str) -> list[StepRecord]:
        return self.service.steps(execution_id)

    def states(self, ids: Iterable[str]) -> dict[str, S]:
        return {i: self.get(i).state for i in ids}

    def wait_state(self, ids: Iterable[str], state: S, timeout: float = RECOVERY_WAIT) -> None:
        ids = list(ids)

        def described() -> str:
            return f"{len(ids)} run(s) {state.value}: {Counter(s.value for s in self.states(ids).values())}"

        wait_until(lambda: all(s is state for s in self.states(ids).values()), timeout, described)

    def wait_asleep(self, ids: Iterable[str]) -> None:
        ids = list(ids)

        def asleep(execution_id: str) -> bool:
            steps = self.steps(execution_id)  # before the state: see workflow_app.wait_for
            execution = self.get(execution_id)
            return execution.state is S.PENDING and any(s.name == "harvest:sleep" for s in steps)

        wait_until(lambda: all(asleep(i) for i in ids), RECOVERY_WAIT, f"{len(ids)} run(s) asleep")

    def effects(self, execution_id: str) -> Counter[str]:
        """How often each side effect of the run happened."""
        table = workflow_app.effects_table
        with self.env.inspector.connect() as conn:
            labels = conn.execute(sa.select(table.c.label).where(table.c.execution_id == execution_id))
            return Counter(labels.scalars())

    def effect_pids(self, execution_id: str, label: str) -> list[int]:
        table = workflow_app.effects_table
        with self.env.inspector.connect() as conn:
            rows = conn.execute(
                sa.select(table.c.pid)
                .where(table.c.execution_id == execution_id, table.c.label == label)
                .order_by(table.c.id)
            )
            return list(rows.scalars())

    def wait_effect(self, execution_id: str, label: str, count: int = 1) -> None:
        wait_until(
            lambda: self.effects(execution_id)[label] >= count,
            RECOVERY_WAIT,
            lambda: f"{label} x{count} of {execution_id} ({dict(self.effects(execution_id))})",
        )

    def release(self, execution_id: str) -> None:
        """Let the run's held step go on."""
        with self.env.inspector.begin() as conn:
            conn.execute(
                workflow_app.flags_table.insert().values(name=workflow_app.release_flag(execution_id))
            )

    def drain(self) -> None:
        """Wait until the workers finished what they were running: a fresh run completes after it
        (each worker runs one workflow job at a time)."""
        sentinel = self.start("five_steps", {"n": -1})
        self.wait_state([sentinel], S.COMPLETED)


@pytest.fixture
def wf(faults: FaultEnv) -> Iterator[WorkflowFaults]:
    faults.config.update(WORKFLOW_CONFIG)
    SqlWorkflowStore(faults.engine).ensure_schema()
    workflow_app.fault_metadata.create_all(faults.engine, checkfirst=True)
    tables = [
        "harvest_workflow_steps",
        "harvest_workflow_executions",
        *(t.name for t in workflow_app.fault_metadata.sorted_tables),
    ]
    with faults.engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE " + ", ".join(f'"{name}"' for name in tables) + " RESTART IDENTITY")
    url = faults.database_url.render_as_string(hide_password=False)
    app = close_later(workflow_app.make_app(faults.settings(), url))
    with app.app_context():
        yield WorkflowFaults(faults, app)


def test_a_worker_killed_in_step_3_is_replaced_and_steps_1_and_2_never_run_again(wf: WorkflowFaults) -> None:
    workers = [wf.worker(), wf.worker()]
    eid = wf.start("five_steps", {"n": 7, "hold": True})
    wf.wait_effect(eid, "s3:start")
    [pid] = wf.effect_pids(eid, "s3:start")
    [doomed] = [w for w in workers if w.pid == pid]
    [survivor] = [w for w in workers if w is not doomed]
    doomed.kill()
    wf.release(eid)

    wf.wait_state([eid], S.COMPLETED)
    done = wf.get(eid)
    assert done.output == {"steps": ["s1", "s2", "s3", "s4", "s5"], "n": 7}
    assert done.recovery_count == 1 and done.attempt == 2
    # Steps 1 and 2 ran once; step 3 started twice (it had no checkpoint) and finished once.
    assert wf.effects(eid) == Counter({"s1": 1, "s2": 1, "s3:start": 2, "s3": 1, "s4": 1, "s5": 1})
    assert wf.effect_pids(eid, "s3:start") == [doomed.pid, survivor.pid]
    assert [s.name for s in wf.steps(eid)] == ["s1", "s2", "s3", "s4", "s5"]


def test_flushdb_loses_no_sleeping_and_no_waiting_run(wf: WorkflowFaults) -> None:
    first = wf.worker()
    # Long enough a sleep for all four to be asleep at once, even on a busy machine.
    sleepers = [wf.start("napper", {"sleep": 8, "n": n}) for n in range(4)]
    wf.wait_asleep(sleepers)
    wf.env.redis_server.flushdb()  # their scheduled wake-up jobs are gone
    wf.wait_state(sleepers, S.COMPLETED)
    for n, eid in enumerate(sleepers):
        assert wf.get(eid).output == ["before", "after", n]
        assert wf.effects(eid) == Counter({"before": 1, "after": 1})

    assert first.stop() == 0
    waiting = [wf.start("five_steps", {"n": n}) for n in range(5)]
    assert set(wf.states(waiting).values()) == {S.PENDING}
    wf.env.redis_server.flushdb()  # their jobs are gone before any worker took them
    wf.worker()
    wf.wait_state(waiting, S.COMPLETED)
    for eid in waiting:
        assert wf.effects(eid) == Counter({f"s{k}": 1 for k in range(1, 6)})


def test_a_durable_sleep_survives_its_worker_being_killed(wf: WorkflowFaults) -> None:
    first = wf.worker()
    eid = wf.start("napper", {"sleep": 5, "n": 1})
    wf.wait_asleep([eid])
    first.kill()
    wake_at = wf.get(eid).next_run_at
    assert wake_at is not None
    wait_until(lambda: datetime.now(timezone.utc) > wake_at, 30, "the wake time")
    assert wf.get(eid).state is S.PENDING  # no worker: nothing ran it

    wf.worker()
    wf.wait_state([eid], S.COMPLETED)
    assert wf.get(eid).output == ["before", "after", 1]
    assert wf.effects(eid) == Counter({"before": 1, "after": 1})


def test_a_sleeping_and_a_busy_run_time_out(wf: WorkflowFaults) -> None:
    wf.worker()
    wf.drain()  # the worker is up: the deadlines start counting when the runs start
    sleeping = wf.start("sleeps_past_deadline")
    wait_until(
        lambda: any(s.name == "harvest:sleep" for s in wf.steps(sleeping)), RECOVERY_WAIT, "the run asleep"
    )
    busy = wf.start("busy_past_deadline")
    wf.wait_effect(busy, "busy:start")
    # The deadline passes while one sleeps and the other is inside its step: the sweep ends both.
    wf.wait_state([sleeping, busy], S.TIMED_OUT)
    for eid in (sleeping, busy):
        assert "deadline" in (wf.get(eid).error or "")
    wf.release(busy)  # the busy step ends after the run did
    wf.wait_effect(busy, "busy")
    wf.drain()
    assert wf.states([sleeping, busy]) == {sleeping: S.TIMED_OUT, busy: S.TIMED_OUT}
    assert wf.effects(sleeping) == Counter({"before": 1})
    # The busy step's side effect happened, but its checkpoint and everything after it did not.
    assert wf.effects(busy) == Counter({"busy:start": 1, "busy": 1})
    assert wf.steps(busy) == []


def test_a_poison_pill_fails_after_the_recovery_attempts_and_blocks_no_one(wf: WorkflowFaults) -> None:
    # One run at a time per process: every run is alone, and every death is charged.
    workers = [wf.worker(restart=True, HARVEST_WORKFLOW_CONCURRENCY=1) for _ in range(2)]
    pill = wf.start("poison")
    others = [wf.start("five_steps", {"n": n}) for n in range(6)]
    wf.wait_state(others, S.COMPLETED)
    wf.wait_state([pill], S.FAILED, timeout=90)
    failed = wf.get(pill)
    assert "poison pill" in (failed.error or "")
    assert "HARVEST_WORKFLOW_MAX_RECOVERY_ATTEMPTS" in (failed.error or "")
    assert failed.recovery_count == failed.charged_recoveries == MAX_RECOVERY_ATTEMPTS
    # It killed a worker on its first run and on each recovery, then was given up.
    assert wf.effects(pill) == Counter({"fine": 1, "crash": MAX_RECOVERY_ATTEMPTS + 1})
    wait_until(
        lambda: sum(len(w.exits) for w in workers) >= MAX_RECOVERY_ATTEMPTS + 1,
        30,
        "the supervisor restarting each killed worker",
    )
    for eid in others:
        assert wf.effects(eid) == Counter({f"s{k}": 1 for k in range(1, 6)})
    wf.drain()  # the workers still work
    assert wf.get(pill).state is S.FAILED


def test_a_poison_pill_beside_innocent_runs_charges_none_of_them(wf: WorkflowFaults) -> None:
    worker = wf.worker(restart=True, HARVEST_WORKFLOW_CONCURRENCY=4)
    innocents = [wf.start("held") for _ in range(3)]
    for eid in innocents:
        wf.wait_effect(eid, "two:start")  # all three inside their held step, in the one process
    pill = wf.start("poison")  # claimed into the fourth slot, beside them
    wf.wait_effect(pill, "crash")
    for eid in innocents:
        wf.release(eid)
    wf.wait_state(innocents, S.COMPLETED)
    wf.wait_state([pill], S.FAILED, timeout=120)

    for eid in innocents:
        done = wf.get(eid)
        assert done.output == ["one", "two", "three"]
        # Requeued (once, or again if it waited at the gate while the pill ran alone), never charged.
        assert done.recovery_count >= 1 and done.charged_recoveries == 0
        assert done.isolation == Isolation.ALONE.value  # it completed alone, in quarantine
        assert wf.effects(eid) == Counter({"one": 1, "two:start": 2, "two": 1, "three": 1})
    failed = wf.get(pill)
    assert "poison pill" in (failed.error or "")
    assert failed.charged_recoveries == MAX_RECOVERY_ATTEMPTS
    # One death beside the innocent runs (free), then MAX + 1 deaths alone: the same count as when
    # every run is alone (the test above).
    assert wf.effects(pill) == Counter({"fine": 1, "crash": 1 + MAX_RECOVERY_ATTEMPTS + 1})
    wait_until(lambda: len(worker.exits) >= MAX_RECOVERY_ATTEMPTS + 2, 30, "the worker restarted")
    wf.drain()  # the worker still works, several runs at once again


def test_cancel_of_a_running_run_ends_it_cancelled_at_the_next_boundary(wf: WorkflowFaults) -> None:
    wf.worker()
    eid = wf.start("held")
    wf.wait_effect(eid, "two:start")
    requested = wf.service.cancel(eid, "customer withdrew")
    # Cooperative: the run goes on until its step ends.
    assert requested.state is S.RUNNING and requested.cancel_requested
    wf.release(eid)
    wf.wait_state([eid], S.CANCELLED)
    cancelled = wf.get(eid)
    assert cancelled.error == "customer withdrew" and cancelled.output is None
    # The running step finished and was checkpointed; the next one never ran.
    assert [s.name for s in wf.steps(eid)] == ["one", "two"]
    assert wf.effects(eid) == Counter({"one": 1, "two:start": 1, "two": 1})


def test_terminate_of_a_running_run_ends_it_at_once_and_nothing_lands_after(wf: WorkflowFaults) -> None:
    wf.worker()
    eid = wf.start("held")
    wf.wait_effect(eid, "two:start")
    terminated = wf.service.terminate(eid, "operator pulled the plug")
    assert terminated.state is S.TERMINATED and terminated.error == "operator pulled the plug"
    wf.release(eid)
    wf.wait_effect(eid, "two")
    wf.drain()
    after = wf.get(eid)
    assert after.state is S.TERMINATED and after.error == "operator pulled the plug"
    assert after.completed_at == terminated.completed_at
    # The held step's side effect happened, its checkpoint was refused, and nothing ran after it.
    assert [s.name for s in wf.steps(eid)] == ["one"]
    assert wf.effects(eid) == Counter({"one": 1, "two:start": 1, "two": 1})


def test_cancel_and_terminate_of_sleeping_runs_end_them_at_once(wf: WorkflowFaults) -> None:
    wf.worker()
    to_cancel = wf.start("napper", {"sleep": 600, "n": 1})
    to_terminate = wf.start("napper", {"sleep": 600, "n": 2})
    wf.wait_asleep([to_cancel, to_terminate])
    assert wf.service.cancel(to_cancel, "not needed").state is S.CANCELLED
    assert wf.service.terminate(to_terminate).state is S.TERMINATED
    # A cancel or terminate of an ended run is refused and changes nothing: neither becomes the other.
    with pytest.raises(ExecutionEndedError, match="already ended Cancelled"):
        wf.service.terminate(to_cancel)
    with pytest.raises(ExecutionEndedError, match="already ended Terminated"):
        wf.service.cancel(to_terminate)
    assert wf.get(to_cancel).state is S.CANCELLED and wf.get(to_terminate).state is S.TERMINATED
    assert wf.get(to_cancel).error == "not needed"
    for eid in (to_cancel, to_terminate):
        assert wf.effects(eid) == Counter({"before": 1})


def test_a_cancelled_run_whose_worker_is_killed_ends_cancelled_without_running_again(
    wf: WorkflowFaults,
) -> None:
    workers = [wf.worker(), wf.worker()]
    eid = wf.start("held")
    wf.wait_effect(eid, "two:start")
    [pid] = wf.effect_pids(eid, "two:start")
    [doomed] = [w for w in workers if w.pid == pid]
    assert wf.service.cancel(eid, "customer withdrew").state is S.RUNNING
    doomed.kill()  # before the held step ended: no boundary will ever see the request
    wf.release(eid)
    wf.wait_state([eid], S.CANCELLED)
    cancelled = wf.get(eid)
    # The surviving worker's sweep ended it once the lease expired: no code ran again.
    assert cancelled.error == "customer withdrew" and cancelled.recovery_count == 0
    assert cancelled.attempt == 1
    wf.drain()
    assert [s.name for s in wf.steps(eid)] == ["one"]
    assert wf.effects(eid) == Counter({"one": 1, "two:start": 1})


def test_a_worker_asked_to_stop_finishes_the_workflow_step_it_runs(wf: WorkflowFaults) -> None:
    worker = wf.worker()
    eid = wf.start("held")
    wf.wait_effect(eid, "two:start")
    os.killpg(worker.pid, signal.SIGTERM)  # a deploy: the process manager asks the worker to stop
    wf.release(eid)
    wait_until(lambda: not worker.alive(), 60, "the worker to stop")
    assert worker.process.returncode == 0
    # The run went on to its end in that worker: nothing to recover.
    done = wf.get(eid)
    assert done.state is S.COMPLETED and done.output == ["one", "two", "three"]
    assert done.recovery_count == 0
    assert wf.effects(eid) == Counter({"one": 1, "two:start": 1, "two": 1, "three": 1})
