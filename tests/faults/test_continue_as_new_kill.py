"""A worker process SIGKILLed inside continue-as-new: in a terminal hook of the closing transaction,
just before that transaction commits (both writes made), and just after it committed (before the
successor's job was queued). Whatever the point, the chain ends up with exactly one next run, and
after recovery (the sweeper, another worker) it completes with no duplicate successor. On SQLite and
PostgreSQL with a runner process, and with real ``flask harvest worker`` processes (RQ, PostgreSQL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from flask_harvest.workflows import (
    Execution,
    ExecutionState,
    SqlWorkflowStore,
    WorkflowContext,
    WorkflowRegistry,
    WorkflowRunner,
)

from ..workflow_support import SQL_KINDS, Scheduled
from . import workflow_app
from .conftest import wait_until
from .test_workflow_faults import RECOVERY_WAIT, WorkflowFaults
from .test_workflow_faults import wf as wf  # the fixture

pytestmark = [pytest.mark.faults]

ROOT = Path(__file__).resolve().parents[2]
LEASE = 1.0
S = ExecutionState

# The worker: runs the first run of a chain, and kills itself (SIGKILL: no cleanup, no rollback
# message) at the point the test names.
WORKER = textwrap.dedent(
    """
    import os, signal, sys
    import sqlalchemy as sa
    from sqlalchemy import event
    from flask_harvest.jobs.base import JobBackend
    from flask_harvest.workflows import ExecutionState, SqlWorkflowStore, WorkflowRegistry, WorkflowRunner

    url, execution_id, lease, point = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]

    def die(where):
        print(f"killed {where}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    class KillOnEnqueue(JobBackend):
        # The successor's job is queued only after the commit: dying here loses only the job.
        def enqueue(self, refs):
            if point == "after_commit":
                die("after the commit")
        def schedule(self, ref): pass
        def live_jobs(self, refs): return set()

    engine = sa.create_engine(url)

    @event.listens_for(engine, "after_execute")
    def saw(conn, clause, multiparams, params, options, result):
        # The only INSERT into the executions table this worker makes is the successor's.
        table = getattr(getattr(clause, "table", None), "name", "")
        if table == "harvest_workflow_executions" and clause.is_insert:
            conn.info["successor_inserted"] = True

    @event.listens_for(engine, "commit")
    def before_commit(conn):
        if point == "before_commit" and conn.info.pop("successor_inserted", False):
            die("with both writes made, before the commit")

    registry = WorkflowRegistry()

    def relay(ctx, value):
        n = ctx.step("tick", lambda: value)
        if n < 2:
            ctx.continue_as_new(n + 1)
        return n

    registry.workflow("relay")(relay)
    store = SqlWorkflowStore(engine)

    def in_hook(conn, execution):
        if point == "in_hook" and execution.state is ExecutionState.CONTINUED_AS_NEW:
            die("in a terminal hook")

    store.hooks.register(in_hook)
    runner = WorkflowRunner(store, registry, KillOnEnqueue(), lease_seconds=lease, heartbeat_interval=0)
    runner.run(execution_id)
    print("not killed", flush=True)
    """
)


KILLED = {
    "in_hook": "killed in a terminal hook",
    "before_commit": "killed with both writes made, before the commit",
    "after_commit": "killed after the commit",
}


def relay(ctx: WorkflowContext, value: Any) -> Any:
    n = ctx.step("tick", lambda: value)
    if n < 2:
        ctx.continue_as_new(n + 1)
    return n


def runs_of(store: SqlWorkflowStore, workflow_id: str) -> list[Execution]:
    return [e for e in store.list_executions(limit=500) if e.workflow_id == workflow_id]


@pytest.mark.parametrize("point", ["in_hook", "before_commit", "after_commit"])
@pytest.mark.parametrize("kind", SQL_KINDS)
def test_a_worker_killed_inside_continue_as_new_leaves_exactly_one_next_run(
    request: pytest.FixtureRequest, kind: Any, point: str, tmp_path: Path
) -> None:
    """SIGKILL of the worker inside the continue-as-new transition leaves exactly one next run;
    after recovery the chain completes with no duplicate successor."""
    engine: sa.Engine = request.getfixturevalue(f"{kind}_engine")
    store = SqlWorkflowStore(engine)
    registry = WorkflowRegistry()
    registry.workflow("relay")(relay)
    scheduled = Scheduled()
    runner = WorkflowRunner(store, registry, scheduled, lease_seconds=LEASE, heartbeat_interval=0)
    first, _ = store.start("relay", 0, "chain", now=datetime.now(timezone.utc))

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    url = engine.url.render_as_string(hide_password=False)
    done = subprocess.run(
        [sys.executable, str(script), url, first.execution_id, str(LEASE), point],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    assert KILLED[point] in done.stdout, done.stdout + done.stderr

    rows = runs_of(store, "chain")
    if point == "after_commit":
        # The hand-over committed: the old run is closed and exactly one successor waits, due,
        # with no job (the kill took it); the sweeper's due scan queues it.
        assert sorted(e.state.value for e in rows) == ["ContinuedAsNew", "Pending"]
        successor = next(e for e in rows if e.state is S.PENDING)
        assert successor.continued_from == first.execution_id
        wait_until(
            lambda: (runner.sweep_once(), successor.execution_id in [i for i, _ in scheduled.calls])[1],
            30,
            "the sweeper to queue the successor",
        )
        assert runner.run(first.execution_id) is None  # the old run's job again: nothing to do
    else:
        # Nothing of the hand-over committed: the run is still Running under the dead worker's
        # lease, with no successor; the sweeper requeues it and a live worker replays it.
        assert [(e.execution_id, e.state) for e in rows] == [(first.execution_id, S.RUNNING)]
        wait_until(lambda: runner.sweep_once().released == 1, 30, "the lease to expire")
        scheduled.calls.clear()
        assert runner.run(first.execution_id) is None  # it continued as new
        [(queued, _)] = scheduled.calls
        scheduled.calls.clear()
        successor = store.get(queued)  # type: ignore[assignment]
        assert successor is not None and successor.continued_from == first.execution_id
    # The rest of the chain runs on the live worker.
    ended = runner.run(successor.execution_id)
    assert ended is None
    [(third_id, _)] = [c for c in scheduled.calls if c[0] != successor.execution_id]
    last = runner.run(third_id)
    assert last is not None and last.state is S.COMPLETED and last.output == 2
    chain = store.chain(first.execution_id)
    assert [e.state for e in chain] == [S.CONTINUED_AS_NEW, S.CONTINUED_AS_NEW, S.COMPLETED]
    assert len(runs_of(store, "chain")) == 3
    # The first run's step was checkpointed before the kill: no run has more than its one tick.
    assert all([s.name for s in store.list_steps(e.execution_id)] == ["tick"] for e in chain)


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
def test_an_rq_worker_killed_inside_continue_as_new_is_recovered_with_one_successor(
    wf: WorkflowFaults,
) -> None:
    """SIGKILL of a ``flask harvest worker`` inside the continue-as-new transaction: the other worker
    recovers the run once its lease expires, and the chain completes with exactly one run per link."""
    with wf.env.inspector.begin() as conn:
        conn.execute(workflow_app.flags_table.insert().values(name=workflow_app.KILL_IN_CONTINUE))
    workers = [wf.worker(), wf.worker()]
    with wf.app.app_context():
        handle, _ = wf.service.start("relay", {"n": 0, "until": 3}, workflow_id="relay-kill")
    first = handle.execution_id
    doomed = wait_until(lambda: next((w for w in workers if not w.alive()), None), RECOVERY_WAIT, "a kill")
    # Lower the flag at once, so that the worker recovering the run does not die too.
    with wf.env.inspector.begin() as conn:
        conn.execute(
            workflow_app.flags_table.delete().where(
                workflow_app.flags_table.c.name == workflow_app.KILL_IN_CONTINUE
            )
        )
    assert "inside the continue-as-new of " + first in doomed.log()
    # What a process manager does with a dead worker: its whole group goes (RQ's scheduler child,
    # which holds copies of the dead worker's database sockets, so the database would keep its
    # transaction, and the run's row lock, open for as long as that child lives).
    doomed.kill()

    last = wf.service.wait(first, RECOVERY_WAIT)
    assert last.state is S.COMPLETED and last.output == 3, last
    chain = wf.service.chain(first)
    assert [e.state for e in chain] == [S.CONTINUED_AS_NEW] * 3 + [S.COMPLETED]
    assert chain[0].recovery_count == 1 and chain[-1].execution_id == last.execution_id
    rows = [e for e in wf.service.list_executions(limit=500)[0] if e.workflow_id == "relay-kill"]
    assert len(rows) == 4
    # Each run ticked once: the first run's checkpoint survived the kill, and no link ran twice.
    for run in chain:
        assert wf.effects(run.execution_id) == {"tick": 1}
        assert [s.name for s in wf.steps(run.execution_id)] == ["tick"]
