"""Child runs under real faults: ``flask harvest worker`` processes (RQ, the group's Redis,
PostgreSQL) running the parent and child workflows of ``children_app.py``.

* a parent whose worker is SIGKILLed after it started its children resumes on another worker and
  starts none of them again: exactly 3 child rows;
* a parent waiting for held children while every worker is SIGKILLed resumes once new workers run
  the children, and a child's failure reaches it as an exception it catches;
* the wake-up race: many parents and children over concurrent workers, and no parent is left
  waiting on a child that has closed (the sweeper's safety scan is kept out of the way).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from flask_harvest import ExecutionState
from flask_harvest.workflows import SqlWorkflowStore

from ..pipeline import close_later
from . import children_app, workflow_app
from .conftest import FaultEnv, wait_until
from .test_workflow_faults import RECOVERY_WAIT, WORKFLOW_CONFIG, WorkflowFaults

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]
TIME_LIMIT_SECONDS = 180

S = ExecutionState
APP_SPEC = "tests.faults.children_app:create_app"


class ChildFaults(WorkflowFaults):
    def worker(self, *, restart: bool = False, **overrides: Any) -> Any:
        return self.env.start_worker(app=APP_SPEC, concurrency=2, restart=restart, **overrides)

    def children(self, parent_id: str) -> list[Any]:
        page, _ = self.service.children(parent_id, limit=500)
        return page


@pytest.fixture
def cf(faults: FaultEnv) -> Iterator[ChildFaults]:
    assert children_app.kid is not None  # the workflows are registered on the fault app
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
        yield ChildFaults(faults, app)


def test_a_parent_killed_after_starting_its_children_starts_none_again(cf: ChildFaults) -> None:
    """Starting a child is checkpointed with its row: a replay after a SIGKILL returns the same
    children, so there are exactly 3 child rows."""
    workers = [cf.worker(), cf.worker()]
    parent = cf.start("brood", {"hold": True})
    cf.wait_effect(parent, "between:start")
    [pid] = cf.effect_pids(parent, "between:start")
    [doomed] = [w for w in workers if w.pid == pid]
    doomed.kill()
    cf.release(parent)
    cf.wait_state([parent], S.COMPLETED)
    done = cf.get(parent)
    assert done.output == [0, 10, 20] and done.recovery_count == 1
    kids = cf.children(parent)
    assert len(kids) == 3 and {k.state for k in kids} == {S.COMPLETED}
    for kid in kids:
        # Once each; twice only for a kid whose step the doomed worker was running when it died
        # (its effect committed, its checkpoint not yet): steps are at least once.
        pids = cf.effect_pids(kid.execution_id, "kid")
        assert len(pids) == 1 or (len(pids) == 2 and pids[0] == doomed.pid != pids[1]), pids
    with cf.env.inspector.connect() as conn:
        rows = conn.execute(sa.text("SELECT count(*) FROM harvest_workflow_executions")).scalar_one()
    assert rows == 4


def test_a_waiting_parent_survives_its_workers_and_catches_a_childs_failure(cf: ChildFaults) -> None:
    """A parent waiting on its children holds no worker: SIGKILL every worker, start new ones, and
    the children's ends wake it; the failed child reaches it as ChildFailedError."""
    workers = [cf.worker(), cf.worker()]
    parent = cf.start("brood", {"hold_kids": True, "fail": 1})
    cf.wait_effect(parent, "kid:start", count=2)  # two kids held, on the two workers
    wait_until(lambda: cf.get(parent).waiting_on is not None, RECOVERY_WAIT, "the parent waiting")
    waiting = cf.get(parent)
    assert waiting.state is S.PENDING and waiting.lease_token is None and waiting.next_run_at is None
    for worker in workers:
        worker.kill()
    cf.worker()
    cf.release(parent)  # the kids' held steps go on (one flag per parent)
    cf.wait_state([parent], S.COMPLETED, timeout=90)
    assert cf.get(parent).output == [0, "Failed: ValueError: kid 1 failed", 20]
    kids = cf.children(parent)
    assert len(kids) == 3
    assert sorted(k.state.value for k in kids) == ["Completed", "Completed", "Failed"]


def test_no_parent_is_left_waiting_on_a_closed_child(cf: ChildFaults) -> None:
    """The wake-up race: each child's terminal transaction wakes its parent, whatever the
    interleaving with the parent's suspend, without the sweeper's safety scan."""
    # The sweeper runs once at start only: every wake-up below is a child's terminal hook's.
    for _ in range(2):
        cf.worker(HARVEST_SWEEP_INTERVAL_SECONDS=3600, HARVEST_WORKFLOW_CONCURRENCY=8)
    parents = [cf.start("brood", {"count": 5}) for _ in range(30)]
    cf.wait_state(parents, S.COMPLETED, timeout=150)
    for parent in parents:
        assert cf.get(parent).output == [0, 10, 20, 30, 40]
    with cf.env.inspector.connect() as conn:
        stuck = conn.execute(
            sa.text(
                "SELECT count(*) FROM harvest_workflow_executions p WHERE p.state = 'Pending'"
                " AND p.waiting_on IS NOT NULL"
            )
        ).scalar_one()
        kids = conn.execute(
            sa.text("SELECT count(*) FROM harvest_workflow_executions WHERE parent_execution_id IS NOT NULL")
        ).scalar_one()
    assert stuck == 0 and kids == 150
