"""Child runs on SQLite and PostgreSQL: the checkpointed start, the durable wait and its wake-up,
a child's failure as an exception, and the parent-close policies under every way a parent ends."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from flask_harvest.errors import InvalidFieldError, InvalidStateError
from flask_harvest.workflows import (
    ChildFailedError,
    ChildHandle,
    ExecutionState,
    ParentClosePolicy,
    SqlWorkflowStore,
    StepFailedError,
    UnknownWorkflowError,
    WorkflowContext,
    WorkflowRegistry,
    WorkflowRunner,
)
from flask_harvest.workflows._children import ChildStart
from flask_harvest.workflows._schema import executions_table

from .workflow_support import (
    SQL_KINDS,
    Clock,
    Scheduled,
    SimulatedCrash,
    record_run,
    run_counts,
    workflow_store,
)

S = ExecutionState
P = ParentClosePolicy
LEASE = 30.0


class Harness:
    """A runner on a store with the children's terminal hook, a hand-moved clock and a drain."""

    def __init__(self, store: SqlWorkflowStore) -> None:
        self.store = store
        self.registry = WorkflowRegistry()
        self.clock = Clock()
        self.scheduled = Scheduled()
        self.runner = WorkflowRunner(
            store,
            self.registry,
            self.scheduled,
            lease_seconds=LEASE,
            max_input_bytes=1000,
            heartbeat_interval=0,
            clock=self.clock,
            wait=lambda seconds: None,
        )
        store.hooks.register(store.children_hook)
        store.on_started = self.runner.schedule_started

    def drain(self, rounds: int = 50) -> None:
        """Run every due execution until none is left (what the workers do)."""
        for _ in range(rounds):
            due = self.store.due_executions(now=self.clock())
            if not due:
                return
            for execution_id, _ in due:
                self.runner.run(execution_id)
        raise AssertionError("executions kept becoming due")

    def get(self, execution_id: str) -> Any:
        execution = self.store.get(execution_id)
        assert execution is not None
        return execution

    def children(self, parent_id: str) -> list[Any]:
        return self.store.list_children(parent_id)


@pytest.fixture(params=SQL_KINDS)
def h(request: pytest.FixtureRequest) -> Harness:
    return Harness(workflow_store(request, request.param))


def fan_out(h: Harness, policy: ParentClosePolicy = P.TERMINATE, count: int = 3) -> None:
    """``parent`` starts ``count`` ``child`` runs and returns the sum of their outputs."""

    @h.registry.workflow("child")
    def child(ctx: WorkflowContext, value: Any) -> Any:
        return ctx.step("double", lambda: value * 2)

    @h.registry.workflow("parent")
    def parent(ctx: WorkflowContext, value: Any) -> Any:
        handles = [ctx.start_child("child", n, parent_close_policy=policy) for n in range(count)]
        return sum(ctx.wait_child(handle) for handle in handles)


def test_a_parent_waits_durably_for_its_children_and_gets_their_results(h: Harness) -> None:
    """A waiting parent is Pending with no due time, waiting on the child, holding no lease."""
    fan_out(h)
    parent, _ = h.runner.start("parent", None)
    assert h.runner.run(parent.execution_id) is None
    waiting = h.get(parent.execution_id)
    kids = h.children(parent.execution_id)
    assert waiting.state is S.PENDING and waiting.next_run_at is None and waiting.lease_token is None
    assert waiting.waiting_on == f"{parent.execution_id}:0"
    assert sorted(k.workflow_id for k in kids) == [f"{parent.execution_id}:{n}" for n in range(3)]
    assert {k.parent_execution_id for k in kids} == {parent.execution_id}
    assert {k.parent_close_policy for k in kids} == {"Terminate"}
    assert {k.trigger_depth for k in kids} == {0}
    # Not claimable while it waits, even by a job that finds it.
    assert h.runner.run(parent.execution_id) is None
    h.drain()
    done = h.get(parent.execution_id)
    assert done.state is S.COMPLETED and done.output == 0 + 2 + 4
    assert len(h.children(parent.execution_id)) == 3
    names = [s.name for s in h.store.list_steps(parent.execution_id)]
    assert names == ["harvest:child"] * 3 + ["harvest:wait_child"] * 3


def test_the_childs_end_wakes_the_parent_in_its_terminal_transaction(h: Harness) -> None:
    """The child's terminal transaction makes the parent due and queues it after the commit."""
    fan_out(h, count=1)
    parent, _ = h.runner.start("parent", None)
    h.runner.run(parent.execution_id)
    (kid,) = h.children(parent.execution_id)
    h.scheduled.calls.clear()
    h.runner.run(kid.execution_id)
    woken = h.get(parent.execution_id)
    assert woken.state is S.PENDING and woken.waiting_on is None and woken.next_run_at == h.clock()
    assert (parent.execution_id, None) in h.scheduled.calls
    assert h.runner.run(parent.execution_id) is not None
    assert h.get(parent.execution_id).output == 0


def test_a_parent_killed_while_waiting_resumes_and_starts_no_child_again(h: Harness) -> None:
    """A replay returns the same children: exactly one row per start, however often it runs."""
    crash = {"armed": True}

    @h.registry.workflow("child")
    def child(ctx: WorkflowContext, value: Any) -> Any:
        return value

    @h.registry.workflow("parent")
    def parent(ctx: WorkflowContext, value: Any) -> Any:
        handles = [ctx.start_child("child", n) for n in range(3)]

        def maybe_crash() -> int:
            record_run(h.store.engine, "after-starts")
            if crash.pop("armed", False):
                raise SimulatedCrash
            return 1

        ctx.step("after", maybe_crash)
        return [handle.result() for handle in handles]

    execution, _ = h.runner.start("parent", None)
    with pytest.raises(SimulatedCrash):
        h.runner.run(execution.execution_id)
    assert len(h.children(execution.execution_id)) == 3
    h.clock.advance(seconds=LEASE + 1)
    h.runner.sweep_once()
    h.drain()
    assert h.get(execution.execution_id).output == [0, 1, 2]
    assert len(h.children(execution.execution_id)) == 3
    with h.store.engine.connect() as conn:
        total = conn.execute(sa.select(sa.func.count()).select_from(executions_table)).scalar_one()
    assert total == 4
    assert run_counts(h.store.engine) == {"after-starts": 2}


def test_a_child_failure_reaches_the_parent_as_an_exception_it_may_catch(h: Harness) -> None:
    """A child that ended Failed raises ChildFailedError in the parent, again on every replay."""
    seen: list[tuple[str, str | None]] = []

    @h.registry.workflow("bad")
    def bad(ctx: WorkflowContext, value: Any) -> Any:
        raise ValueError("no stock")

    @h.registry.workflow("parent")
    def parent(ctx: WorkflowContext, value: Any) -> Any:
        handle = ctx.start_child("bad", None, workflow_id="bad-1")
        try:
            handle.result()
        except ChildFailedError as exc:
            seen.append((exc.state, exc.error))
            ctx.sleep(1)  # a replay meets the recorded failure again
            return "compensated"
        return "unreachable"

    execution, _ = h.runner.start("parent", None)
    h.drain()
    h.clock.advance(seconds=2)
    h.drain()
    assert h.get(execution.execution_id).output == "compensated"
    assert seen == [("Failed", "ValueError: no stock")] * 2
    (kid,) = h.children(execution.execution_id)
    assert kid.workflow_id == "bad-1" and kid.state is S.FAILED


def test_start_child_refuses_an_unknown_workflow_a_bad_policy_and_a_step(h: Harness) -> None:
    """The child workflow must be registered; start_child is refused inside a step."""
    errors: list[BaseException] = []

    @h.registry.workflow("parent")
    def parent(ctx: WorkflowContext, value: Any) -> Any:
        for attempt in (
            lambda: ctx.start_child("nope", None),
            lambda: ctx.start_child("parent", None, parent_close_policy="Sometimes"),
            lambda: ctx.step("s", lambda: ctx.start_child("parent", None)),
            lambda: ctx.wait_child("not a handle"),  # type: ignore[arg-type]
            lambda: ctx.start_child("parent", {1, 2}),
            lambda: ctx.start_child("parent", "x" * 2000),
            lambda: ctx.start_child("parent", None, workflow_id=""),
        ):
            try:
                attempt()
            except Exception as exc:
                errors.append(exc)
        return "ok"

    execution, _ = h.runner.start("parent", None)
    assert h.runner.run(execution.execution_id) is not None
    assert isinstance(errors[0], UnknownWorkflowError)
    assert isinstance(errors[1], InvalidFieldError)
    assert isinstance(errors[2], StepFailedError) and "InvalidStateError" in errors[2].message
    assert isinstance(errors[3], InvalidFieldError)
    assert [type(e).__name__ for e in errors[4:]] == [
        "InvalidFieldError",
        "InputTooLargeError",
        "InvalidFieldError",
    ]
    assert h.children(execution.execution_id) == []
    with pytest.raises(InvalidStateError, match=r"ctx\.wait_child"):
        ChildHandle("x", "y").result()


def _open_children(h: Harness, policy: ParentClosePolicy) -> str:
    """A parent with 3 open (never run) children under ``policy``, itself waiting on the first."""
    fan_out(h, policy)
    h.registry.workflow("slow", timeout=timedelta(minutes=5))(h.registry.get("parent").fn)
    parent, _ = h.runner.start("slow", None)
    assert h.runner.run(parent.execution_id) is None
    return parent.execution_id


ENDINGS = ["complete", "cancel", "terminate", "timeout"]


@pytest.mark.parametrize("policy", list(ParentClosePolicy))
@pytest.mark.parametrize("ending", ENDINGS)
def test_the_parent_close_policy_applies_to_open_children(
    h: Harness, policy: ParentClosePolicy, ending: str
) -> None:
    """The parent-close cascade: Terminate ends the children Terminated, RequestCancel ends a
    Pending child Cancelled, Abandon leaves them running on their own."""
    if ending == "complete":

        @h.registry.workflow("child")
        def child(ctx: WorkflowContext, value: Any) -> Any:
            return value

        @h.registry.workflow("parent")
        def parent(ctx: WorkflowContext, value: Any) -> Any:
            for n in range(3):
                ctx.start_child("child", n, parent_close_policy=policy)
            return "done without waiting"

        execution, _ = h.runner.start("parent", None)
        ended = h.runner.run(execution.execution_id)
        assert ended is not None and ended.state is S.COMPLETED
        parent_id = execution.execution_id
        expected_parent = S.COMPLETED
    else:
        parent_id = _open_children(h, policy)
        if ending == "cancel":
            h.store.request_cancel(parent_id, "stop", now=h.clock())
            expected_parent = S.CANCELLED
        elif ending == "terminate":
            h.store.terminate(parent_id, "stop", now=h.clock())
            expected_parent = S.TERMINATED
        else:
            h.clock.advance(minutes=6)
            h.runner.sweep_once()
            expected_parent = S.TIMED_OUT
    assert h.get(parent_id).state is expected_parent
    kids = h.children(parent_id)
    assert len(kids) == 3
    expected = {P.TERMINATE: S.TERMINATED, P.REQUEST_CANCEL: S.CANCELLED, P.ABANDON: S.PENDING}[policy]
    assert {k.state for k in kids} == {expected}
    if policy is not P.ABANDON:
        assert all(k.error == f"parent {parent_id} ended {expected_parent.value}" for k in kids)


def test_request_cancel_flags_a_running_child_which_ends_cancelled_at_its_boundary(h: Harness) -> None:
    """RequestCancel on a Running child flags it, as a cancel request does."""
    parent_id = _open_children(h, P.REQUEST_CANCEL)
    kid = h.children(parent_id)[0]
    claimed = h.store.claim(kid.execution_id, now=h.clock(), lease_seconds=LEASE)
    assert claimed is not None
    h.store.terminate(parent_id, None, now=h.clock())
    flagged = h.get(kid.execution_id)
    assert flagged.state is S.RUNNING and flagged.cancel_requested
    assert flagged.cancel_reason == f"parent {parent_id} ended Terminated"


def test_the_cascade_recurses_through_grandchildren(h: Harness) -> None:
    """A terminated child's own children follow their policy in the same transaction."""

    @h.registry.workflow("leaf")
    def leaf(ctx: WorkflowContext, value: Any) -> Any:
        return value

    @h.registry.workflow("middle")
    def middle(ctx: WorkflowContext, value: Any) -> Any:
        return ctx.wait_child(ctx.start_child("leaf", 1))

    @h.registry.workflow("top")
    def top(ctx: WorkflowContext, value: Any) -> Any:
        return ctx.wait_child(ctx.start_child("middle", None))

    execution, _ = h.runner.start("top", None)
    h.runner.run(execution.execution_id)
    (mid,) = h.children(execution.execution_id)
    h.runner.run(mid.execution_id)
    (leaf_run,) = h.children(mid.execution_id)
    h.store.terminate(execution.execution_id, None, now=h.clock())
    assert h.get(mid.execution_id).state is S.TERMINATED
    assert h.get(leaf_run.execution_id).state is S.TERMINATED


def test_a_cancelled_waiting_parent_ends_at_once(h: Harness) -> None:
    """Cancel of a waiting parent ends it Cancelled at once, as any Pending run."""
    parent_id = _open_children(h, P.ABANDON)
    ended = h.store.request_cancel(parent_id, None, now=h.clock())
    assert ended.state is S.CANCELLED
    h.drain()  # the children run on, and waking an ended parent changes nothing
    assert h.get(parent_id).state is S.CANCELLED
    assert {k.state for k in h.children(parent_id)} == {S.COMPLETED}


def test_a_parent_that_continued_as_new_hands_its_open_children_to_its_successor(h: Harness) -> None:
    """On a ContinuedAsNew end the open children are re-pointed to the successor, not closed."""
    parent_id = _open_children(h, P.TERMINATE)
    successor, _ = h.store.start("slow", None, workflow_id="successor", now=h.clock())
    with h.store.engine.begin() as conn:
        conn.execute(
            sa.update(executions_table)
            .where(executions_table.c.execution_id == parent_id)
            .values(continued_to=successor.execution_id)
        )
    ended = h.store.finish(parent_id, S.CONTINUED_AS_NEW, now=h.clock())
    assert ended is not None and ended.state is S.CONTINUED_AS_NEW
    assert h.children(parent_id) == []
    moved = h.children(successor.execution_id)
    assert len(moved) == 3 and {k.state for k in moved} == {S.PENDING}
    h.store.terminate(successor.execution_id, None, now=h.clock())
    assert {k.state for k in h.children(successor.execution_id)} == {S.TERMINATED}


def test_wait_follows_a_child_that_continued_as_new(h: Harness) -> None:
    """The wait follows continued_to and records the outcome of the chain's last run."""
    fan_out(h, count=1)
    parent, _ = h.runner.start("parent", None)
    h.runner.run(parent.execution_id)
    (kid,) = h.children(parent.execution_id)
    # The child's run hands over to a successor of the same workflow_id and the same parent.
    with h.store.engine.begin() as conn:
        conn.execute(
            sa.update(executions_table)
            .where(executions_table.c.execution_id == kid.execution_id)
            .values(state="ContinuedAsNew", continued_to="00000000-0000-0000-0000-000000000001")
        )
        conn.execute(
            executions_table.insert().values(
                execution_id="00000000-0000-0000-0000-000000000001",
                workflow_name="child",
                workflow_id=kid.workflow_id,
                input="21",
                state="Pending",
                created_at=h.clock(),
                next_run_at=h.clock(),
                attempt=0,
                recovery_count=0,
                cancel_requested=False,
                trigger_depth=0,
                parent_execution_id=parent.execution_id,
                parent_close_policy="Terminate",
                continued_from=kid.execution_id,
            )
        )
    h.drain()
    assert h.get(parent.execution_id).output == 42


def test_a_wake_up_lost_with_a_rolled_back_transaction_is_covered_by_the_sweeper(h: Harness) -> None:
    """A parent left waiting on a child that has ended is woken by the sweeper's scan."""
    fan_out(h, count=1)
    parent, _ = h.runner.start("parent", None)
    h.runner.run(parent.execution_id)
    (kid,) = h.children(parent.execution_id)
    h.store.hooks.unregister(h.store.children_hook)
    h.runner.run(kid.execution_id)
    h.store.hooks.register(h.store.children_hook)
    assert h.get(parent.execution_id).waiting_on == kid.workflow_id
    assert h.store.wake_stranded(now=h.clock()) == [parent.execution_id]
    assert h.store.wake_stranded(now=h.clock()) == []
    h.drain()
    assert h.get(parent.execution_id).state is S.COMPLETED


def test_a_child_with_an_explicit_workflow_id_collapses_into_its_open_run(h: Harness) -> None:
    """A child's start is start-or-load: an open run of its workflow_id is returned as it is."""

    @h.registry.workflow("child")
    def child(ctx: WorkflowContext, value: Any) -> Any:
        return value

    @h.registry.workflow("parent")
    def parent(ctx: WorkflowContext, value: Any) -> Any:
        first = ctx.start_child("child", 1, workflow_id="shared")
        second = ctx.start_child("child", 2, workflow_id="shared")
        return [first.execution_id == second.execution_id, ctx.wait_child(second)]

    execution, _ = h.runner.start("parent", None)
    h.drain()
    assert h.get(execution.execution_id).output == [True, 1]


def _race_once(h: Harness, round_number: int) -> None:
    parent, _ = h.store.start("parent", None, workflow_id=f"race-parent-{round_number}", now=h.clock())
    claimed = h.store.claim(parent.execution_id, now=h.clock(), lease_seconds=LEASE)
    assert claimed is not None and claimed.lease_token is not None
    token = claimed.lease_token
    start = ChildStart(
        0, str(uuid.uuid4()), "child", str(round_number), f"race-child-{round_number}", P.ABANDON, None
    )
    started = h.store.record_children(parent.execution_id, token, [start], now=h.clock())
    assert started is not None
    child = h.store.claim(started[0][0].execution_id, now=h.clock(), lease_seconds=LEASE)
    assert child is not None and child.lease_token is not None
    barrier = threading.Barrier(2)
    waited: list[Any] = []

    def wait() -> None:
        barrier.wait()
        waited.append(
            h.store.wait_child(
                parent.execution_id, token, 1, child.execution_id, child.workflow_id, now=h.clock()
            )
        )

    def end() -> None:
        barrier.wait()
        h.store.finish(
            child.execution_id, S.COMPLETED, output=round_number, now=h.clock(), token=child.lease_token
        )

    threads = [threading.Thread(target=wait), threading.Thread(target=end)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (result,) = waited
    after = h.get(parent.execution_id)
    if result.outcome is not None:
        assert result.outcome == {"state": "Completed", "output": round_number, "error": None}
        assert after.state is S.RUNNING
    else:
        assert result.suspended
        assert after.state is S.PENDING and after.waiting_on is None and after.next_run_at is not None


def test_a_childs_end_racing_its_parents_suspend_never_strands_the_parent(h: Harness) -> None:
    """The wake-up race, head on: the parent's wait and the child's terminal transaction start
    together, many times; the parent either records the outcome or is woken, never left waiting."""
    h.registry.workflow("child")(lambda ctx, value: value)
    for round_number in range(40):
        _race_once(h, round_number)


def test_children_are_written_together_before_the_next_step_and_on_a_failure(h: Harness) -> None:
    """Children started in a row are written in one transaction before the next step runs, and
    before the run ends, even when it fails: an abandoned child of a failed parent runs on."""
    seen: list[int] = []

    @h.registry.workflow("child")
    def child(ctx: WorkflowContext, value: Any) -> Any:
        return value

    @h.registry.workflow("parent")
    def parent(ctx: WorkflowContext, value: Any) -> Any:
        for n in range(3):
            ctx.start_child("child", n, parent_close_policy=P.ABANDON)
        ctx.step("count", lambda: seen.append(len(h.children(ctx.execution_id))))
        ctx.start_child("child", 3, parent_close_policy=P.ABANDON)
        raise ValueError("gave up")

    execution, _ = h.runner.start("parent", None)
    ended = h.runner.run(execution.execution_id)
    assert ended is not None and ended.state is S.FAILED
    assert seen == [3]
    kids = h.children(execution.execution_id)
    assert len(kids) == 4 and {k.state for k in kids} == {S.PENDING}
    names = [s.name for s in h.store.list_steps(execution.execution_id)]
    assert names == ["harvest:child"] * 3 + ["count", "harvest:child"]
    h.drain()
    assert {k.state for k in h.children(execution.execution_id)} == {S.COMPLETED}


def test_an_unrecorded_wait_for_an_ended_child_replays_to_the_same_outcome(h: Harness) -> None:
    """The outcome of an ended child is checkpointed with the next write; a parent that dies
    before it reads the same outcome again on its replay (an ended run never changes)."""
    crash = {"armed": True}

    @h.registry.workflow("child")
    def child(ctx: WorkflowContext, value: Any) -> Any:
        if value == 1:
            raise ValueError("one failed")
        return value * 10

    @h.registry.workflow("parent")
    def parent(ctx: WorkflowContext, value: Any) -> Any:
        handles = [ctx.start_child("child", n) for n in range(3)]
        ctx.sleep(1)  # the children end meanwhile
        results: list[Any] = []
        for handle in handles:
            try:
                results.append(handle.result())
            except ChildFailedError as exc:
                results.append(exc.state)
        if crash.pop("armed", False):
            raise SimulatedCrash
        return results

    execution, _ = h.runner.start("parent", None)
    h.drain()
    h.clock.advance(seconds=2)
    with pytest.raises(SimulatedCrash):
        h.drain()
    names = [s.name for s in h.store.list_steps(execution.execution_id)]
    assert "harvest:wait_child" not in names
    h.clock.advance(seconds=LEASE + 1)
    h.runner.sweep_once()
    h.drain()
    assert h.get(execution.execution_id).output == [0, "Failed", 20]
    names = [s.name for s in h.store.list_steps(execution.execution_id)]
    assert names.count("harvest:wait_child") == 3


# -- the end of a run without children ---------------------------------------------------------


def _children_lookups(h: Harness, work: Any) -> int:
    """How many statements ``work()`` sends that look for a run's children."""
    seen: list[str] = []

    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "parent_execution_id =" in statement:
            seen.append(statement)

    sa.event.listen(h.store.engine, "before_cursor_execute", on_execute)
    try:
        work()
    finally:
        sa.event.remove(h.store.engine, "before_cursor_execute", on_execute)
    return len(seen)


def test_a_run_that_began_no_child_ends_without_looking_for_children(h: Harness) -> None:
    fan_out(h)
    h.registry.workflow("plain")(lambda ctx, value: ctx.step("one", lambda: 1))
    plain, _ = h.runner.start("plain", None)
    parent, _ = h.runner.start("parent", None)
    assert _children_lookups(h, lambda: h.runner.run(plain.execution_id)) == 0
    assert h.get(plain.execution_id).state is S.COMPLETED
    # A run that began children looks for them at its end (here they had all ended).
    assert _children_lookups(h, h.drain) >= 1
    assert h.get(parent.execution_id).output == 0 + 2 + 4


def test_a_replay_that_does_not_start_its_child_again_still_closes_it(h: Harness) -> None:
    """The children a run began in an earlier attempt are known from its checkpoints, whatever
    the code does in this one."""
    attempts = {"count": 0}

    @h.registry.workflow("child")
    def child(ctx: WorkflowContext, value: Any) -> Any:
        return value

    @h.registry.workflow("parent")
    def parent(ctx: WorkflowContext, value: Any) -> Any:
        attempts["count"] += 1
        if attempts["count"] == 1:
            ctx.start_child("child", 1)
            ctx.step("crash", lambda: (_ for _ in ()).throw(SimulatedCrash()))
        return "the second attempt starts nothing"

    execution, _ = h.runner.start("parent", None)
    with pytest.raises(SimulatedCrash):
        h.runner.run(execution.execution_id)
    (kid,) = h.children(execution.execution_id)
    h.clock.advance(seconds=LEASE + 1)
    h.runner.sweep_once()
    ended = h.runner.run(execution.execution_id)
    assert ended is not None and ended.state is S.COMPLETED
    assert h.get(kid.execution_id).state is S.TERMINATED


def test_a_successor_closes_the_children_it_inherited(h: Harness) -> None:
    @h.registry.workflow("child")
    def child(ctx: WorkflowContext, value: Any) -> Any:
        return value

    @h.registry.workflow("parent")
    def parent(ctx: WorkflowContext, value: Any) -> Any:
        if value == "first":
            ctx.start_child("child", 1)
            ctx.continue_as_new("second")
        return "the successor starts nothing"

    execution, _ = h.runner.start("parent", "first")
    h.runner.run(execution.execution_id)
    assert h.get(execution.execution_id).state is S.CONTINUED_AS_NEW
    successor_id = h.get(execution.execution_id).continued_to
    (kid,) = h.children(successor_id)
    assert h.get(kid.execution_id).state is S.PENDING
    ended = h.runner.run(successor_id)
    assert ended is not None and ended.state is S.COMPLETED
    assert h.get(kid.execution_id).state is S.TERMINATED
