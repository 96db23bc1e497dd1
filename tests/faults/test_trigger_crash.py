"""A worker process killed inside the source's terminal transaction, after the trigger hook fired:
nothing of the fire survives (the ledger row and the target commit with the terminal state, or not
at all), and after recovery exactly one target runs. On SQLite and PostgreSQL."""

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

from flask_harvest.triggers import CompletionTrigger
from flask_harvest.triggers.firing import TriggerFiring, target_workflow_id
from flask_harvest.triggers.store import SqlTriggerStore
from flask_harvest.workflows import (
    ExecutionState,
    SqlWorkflowStore,
    WorkflowContext,
    WorkflowRegistry,
    WorkflowRunner,
)

from ..workflow_support import SQL_KINDS, Scheduled
from .conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]
LEASE = 1.0

# The worker: runs the source with the trigger hook and, after it, a hook that kills the process
# (SIGKILL: no cleanup, no rollback message) while the terminal transaction is still open.
WORKER = textwrap.dedent(
    """
    import os, signal, sys
    import sqlalchemy as sa
    from flask_harvest.jobs.base import JobBackend
    from flask_harvest.triggers.firing import TriggerFiring
    from flask_harvest.triggers.store import SqlTriggerStore
    from flask_harvest.workflows import SqlWorkflowStore, WorkflowRegistry, WorkflowRunner

    class NoJobs(JobBackend):
        def enqueue(self, refs): pass
        def schedule(self, ref): pass
        def live_jobs(self, refs): return set()

    url, execution_id, lease = sys.argv[1], sys.argv[2], float(sys.argv[3])
    engine = sa.create_engine(url)
    registry = WorkflowRegistry()
    registry.workflow("source")(lambda ctx, data: {"total": data["n"] * 2})
    registry.workflow("target")(lambda ctx, data: data)
    store = SqlWorkflowStore(engine)
    runner = WorkflowRunner(store, registry, NoJobs(), lease_seconds=lease, heartbeat_interval=0)
    firing = TriggerFiring(
        SqlTriggerStore(engine), runner.start, knows=registry.__contains__,
        max_chain_depth=16, max_input_bytes=10000,
    )
    store.hooks.register(firing)

    def die(conn, execution):
        fired = conn.exec_driver_sql("SELECT count(*) FROM harvest_completion_trigger_fires").scalar()
        print(f"fired rows in the open transaction: {fired}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    store.hooks.register(die)
    runner.run(execution_id)
    print("not killed", flush=True)
    """
)


@pytest.mark.parametrize("kind", SQL_KINDS)
def test_a_worker_killed_in_the_terminal_transaction_leaves_exactly_one_target_after_recovery(
    request: pytest.FixtureRequest, kind: Any, tmp_path: Path
) -> None:
    engine: sa.Engine = request.getfixturevalue(f"{kind}_engine")
    store = SqlWorkflowStore(engine)
    triggers = SqlTriggerStore(engine)
    triggers.ensure_schema()
    registry = WorkflowRegistry()

    def source(ctx: WorkflowContext, data: Any) -> Any:
        return {"total": data["n"] * 2}

    def target(ctx: WorkflowContext, data: Any) -> Any:
        return data

    registry.workflow("source")(source)
    registry.workflow("target")(target)
    scheduled = Scheduled()
    runner = WorkflowRunner(store, registry, scheduled, lease_seconds=LEASE, heartbeat_interval=0)
    store.on_started = runner.schedule_started
    firing = TriggerFiring(
        triggers, runner.start, knows=registry.__contains__, max_chain_depth=16, max_input_bytes=10000
    )
    store.hooks.register(firing)
    try:
        now = datetime.now(timezone.utc)
        trigger = triggers.upsert(CompletionTrigger("source", "target"), now=now)
        execution, _ = store.start("source", {"n": 21}, now=now)

        script = tmp_path / "worker.py"
        script.write_text(WORKER)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        url = engine.url.render_as_string(hide_password=False)
        done = subprocess.run(
            [sys.executable, str(script), url, execution.execution_id, str(LEASE)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
        # The fire was made inside the transaction the kill cut short...
        assert "fired rows in the open transaction: 1" in done.stdout
        # ... and none of it committed: the source is still running, no target, no ledger row.
        assert store.get(execution.execution_id).state is ExecutionState.RUNNING  # type: ignore[union-attr]
        assert store.list_executions(name="target") == []
        assert triggers.fires() == []

        # Recovery: the lease expires, the sweeper requeues the run, a live worker completes it.
        wait_until(lambda: runner.sweep_once().released == 1, 30, "the lease to expire")
        assert store.get(execution.execution_id).state is ExecutionState.PENDING  # type: ignore[union-attr]
        ended = runner.run(execution.execution_id)
        assert ended is not None and ended.state is ExecutionState.COMPLETED
        [started] = store.list_executions(name="target")
        assert started.workflow_id == target_workflow_id(trigger.id, execution.execution_id)
        assert started.input == {"total": 42}
        [fire] = triggers.fires()
        assert (fire.outcome, fire.target_execution_id) == (None, started.execution_id)
        # Evaluating the terminal transition again changes nothing.
        with engine.begin() as conn:
            [again] = firing.evaluate(conn, ended)
        assert again.outcome.value == "deduped"
        assert len(store.list_executions(name="target")) == 1
    finally:
        firing.close()
