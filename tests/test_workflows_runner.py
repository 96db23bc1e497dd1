"""The workflow runner on SQLite and PostgreSQL: replay from checkpoints after a crash, non-determinism,
durable sleep, cancel, terminate, timeouts, poison pills, step errors and retries."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from flask_harvest.errors import InvalidFieldError, StoreError
from flask_harvest.workflows import (
    Execution,
    ExecutionState,
    InputTooLargeError,
    NonDeterminismError,
    SqlWorkflowStore,
    StepFailedError,
    UnknownWorkflowError,
    WorkflowContext,
    WorkflowRegistry,
    WorkflowRunner,
)

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
LEASE = 30.0


class Harness:
    """A runner on a store, with a hand-moved clock and recorded schedules and retry waits."""

    def __init__(self, store: SqlWorkflowStore, max_recovery_attempts: int = 5) -> None:
        self.store = store
        self.registry = WorkflowRegistry()
        self.clock = Clock()
        self.scheduled = Scheduled()
        self.waits: list[float] = []
        self.runner = WorkflowRunner(
            store,
            self.registry,
            self.scheduled,
            lease_seconds=LEASE,
            max_recovery_attempts=max_recovery_attempts,
            max_input_bytes=1000,
            heartbeat_interval=0,
            clock=self.clock,
            wait=self.waits.append,
        )

    def count(self, label: str) -> Callable[[], str]:
        """A step function that counts its runs in the database and returns its label."""

        def step() -> str:
            record_run(self.store.engine, label)
            return label

        return step

    def recover(self) -> None:
        """What the sweeper does after a worker died: the lease expires and the run is requeued."""
        self.clock.advance(seconds=LEASE + 1)
        self.runner.sweep_once()


@pytest.fixture(params=SQL_KINDS)
def h(request: pytest.FixtureRequest) -> Harness:
    return Harness(workflow_store(request, request.param))


def state_of(h: Harness, execution_id: str) -> ExecutionState:
    execution = h.store.get(execution_id)
    assert execution is not None
    return execution.state


def test_start_validates_and_schedules(h: Harness) -> None:
    h.registry.workflow("noop", timeout=timedelta(minutes=10))(lambda ctx, value: value)
    execution, created = h.runner.start("noop", {"a": 1}, workflow_id="k")
    assert created and h.scheduled.calls == [(execution.execution_id, None)]
    assert execution.deadline == h.clock() + timedelta(minutes=10)
    again, created = h.runner.start("noop", {"a": 1}, workflow_id="k")
    assert not created and again == execution and len(h.scheduled.calls) == 1
    with pytest.raises(UnknownWorkflowError, match="'nope'"):
        h.runner.start("nope", 1)
    with pytest.raises(InputTooLargeError, match="HARVEST_WORKFLOW_MAX_INPUT_BYTES"):
        h.runner.start("noop", "x" * 1000)
    with pytest.raises(InvalidFieldError):
        h.runner.start("noop", {"a": {1, 2}})
    assert len(h.store.list_executions()) == 1


def test_a_crash_in_step_3_resumes_without_repeating_steps_1_and_2(h: Harness) -> None:
    crash = {"armed": True}

    def step3() -> str:
        record_run(h.store.engine, "s3")
        if crash.pop("armed", False):
            raise SimulatedCrash
        return "s3"

    @h.registry.workflow("four")
    def four(ctx: WorkflowContext, value: Any) -> Any:
        results = [ctx.step("one", h.count("s1")), ctx.step("two", h.count("s2"))]
        results.append(ctx.step("three", step3))
        results.append(ctx.step("four", h.count("s4")))
        return {"input": value, "results": results}

    execution, _ = h.runner.start("four", 7)
    with pytest.raises(SimulatedCrash):
        h.runner.run(execution.execution_id)
    assert state_of(h, execution.execution_id) is S.RUNNING
    assert h.runner.run(execution.execution_id) is None  # still leased by the dead worker
    h.recover()
    done = h.runner.run(execution.execution_id)
    assert done is not None and done.state is S.COMPLETED
    assert done.output == {"input": 7, "results": ["s1", "s2", "s3", "s4"]}
    assert run_counts(h.store.engine) == {"s1": 1, "s2": 1, "s3": 2, "s4": 1}
    assert done.attempt == 2 and done.recovery_count == 1
    assert [s.name for s in h.store.list_steps(execution.execution_id)] == ["one", "two", "three", "four"]


def test_a_different_step_at_a_checkpointed_position_fails_the_run(h: Harness) -> None:
    version = {"name": "charge"}

    @h.registry.workflow("drift")
    def drift(ctx: WorkflowContext, value: Any) -> Any:
        ctx.step(version["name"], lambda: 1)
        raise SimulatedCrash

    execution, _ = h.runner.start("drift", None)
    with pytest.raises(SimulatedCrash):
        h.runner.run(execution.execution_id)
    version["name"] = "refund"
    h.recover()
    failed = h.runner.run(execution.execution_id)
    assert failed is not None and failed.state is S.FAILED
    assert failed.error is not None and "non-deterministic" in failed.error
    assert "'charge'" in failed.error and "'refund'" in failed.error


def test_non_determinism_fails_the_run_even_if_the_code_catches_it(h: Harness) -> None:
    version = {"name": "a"}

    @h.registry.workflow("sloppy")
    def sloppy(ctx: WorkflowContext, value: Any) -> Any:
        try:
            ctx.step(version["name"], lambda: 1)
        except NonDeterminismError:
            return "swallowed"
        raise SimulatedCrash

    execution, _ = h.runner.start("sloppy", None)
    with pytest.raises(SimulatedCrash):
        h.runner.run(execution.execution_id)
    version["name"] = "b"
    h.recover()
    failed = h.runner.run(execution.execution_id)
    assert failed is not None and failed.state is S.FAILED and "non-deterministic" in (failed.error or "")


def test_a_durable_sleep_gives_the_worker_back_and_resumes_at_the_wake_time(h: Harness) -> None:
    @h.registry.workflow("nap")
    def nap(ctx: WorkflowContext, value: Any) -> Any:
        before = ctx.step("before", h.count("before"))
        ctx.sleep(timedelta(minutes=5))
        return [before, ctx.step("after", h.count("after"))]

    execution, _ = h.runner.start("nap", None)
    eid = execution.execution_id
    assert h.runner.run(eid) is None
    wake = h.clock() + timedelta(minutes=5)
    asleep = h.store.get(eid)
    assert asleep is not None and asleep.state is S.PENDING and asleep.next_run_at == wake
    assert h.scheduled.calls[-1] == (eid, wake)
    h.clock.advance(minutes=4)
    assert h.runner.run(eid) is None  # not due yet: nothing happens
    assert run_counts(h.store.engine) == {"before": 1}
    h.clock.advance(minutes=1)
    done = h.runner.run(eid)
    assert done is not None and done.state is S.COMPLETED and done.output == ["before", "after"]
    assert run_counts(h.store.engine) == {"before": 1, "after": 1}


def test_cancel_of_a_running_execution_ends_it_at_the_next_boundary(h: Harness) -> None:
    @h.registry.workflow("cancellable")
    def cancellable(ctx: WorkflowContext, value: Any) -> Any:
        ctx.step(
            "one", lambda: h.store.request_cancel(ctx.execution_id, "customer withdrew", now=h.clock()).state
        )
        ctx.step("two", h.count("two"))
        return "finished"

    execution, _ = h.runner.start("cancellable", None)
    assert h.runner.run(execution.execution_id) is None
    cancelled = h.store.get(execution.execution_id)
    assert cancelled is not None and cancelled.state is S.CANCELLED
    assert cancelled.error == "customer withdrew" and cancelled.output is None
    assert run_counts(h.store.engine) == {}
    assert [s.output for s in h.store.list_steps(execution.execution_id)] == ["Running"]


def test_a_pending_cancel_request_found_at_claim_ends_the_run_cancelled(h: Harness) -> None:
    h.registry.workflow("w")(lambda ctx, value: ctx.step("s", h.count("s")))
    execution, _ = h.runner.start("w", None)
    # A cancel requested while Running whose worker then died, landing after the sweep's
    # cancel_expired (which would end it at once) and before its expired_leases: requeued with the
    # flag set.
    h.store.claim(execution.execution_id, now=h.clock(), lease_seconds=LEASE)
    h.store.request_cancel(execution.execution_id, "changed my mind", now=h.clock())
    h.clock.advance(seconds=LEASE + 1)
    assert h.store.expired_leases(now=h.clock(), max_recovery_attempts=5).requeued == [execution.execution_id]
    ended = h.runner.run(execution.execution_id)
    assert ended is not None and ended.state is S.CANCELLED and ended.error == "changed my mind"
    assert run_counts(h.store.engine) == {}


def test_terminate_stops_a_running_execution_and_no_checkpoint_lands_after_it(h: Harness) -> None:
    @h.registry.workflow("doomed")
    def doomed(ctx: WorkflowContext, value: Any) -> Any:
        ctx.step("one", h.count("one"))

        def two() -> str:
            # The operator's terminate commits while this step runs.
            h.store.terminate(ctx.execution_id, "operator pulled the plug", now=h.clock())
            record_run(h.store.engine, "two")
            return "two"

        ctx.step("two", two)
        ctx.step("three", h.count("three"))
        return "finished"

    execution, _ = h.runner.start("doomed", None)
    assert h.runner.run(execution.execution_id) is None
    ended = h.store.get(execution.execution_id)
    assert ended is not None and ended.state is S.TERMINATED
    assert ended.error == "operator pulled the plug" and ended.output is None
    assert [s.name for s in h.store.list_steps(execution.execution_id)] == ["one"]
    assert run_counts(h.store.engine) == {"one": 1, "two": 1}


def test_a_sleeping_workflow_times_out_through_the_sweep(h: Harness) -> None:
    @h.registry.workflow("slow", timeout=timedelta(minutes=10))
    def slow(ctx: WorkflowContext, value: Any) -> Any:
        ctx.sleep(timedelta(hours=1))
        return "woke"

    execution, _ = h.runner.start("slow", None)
    assert h.runner.run(execution.execution_id) is None
    h.clock.advance(minutes=11)
    assert h.runner.sweep_once().timed_out == 1
    ended = h.store.get(execution.execution_id)
    assert ended is not None and ended.state is S.TIMED_OUT and "deadline" in (ended.error or "")


def test_a_busy_workflow_times_out_at_its_next_boundary(h: Harness) -> None:
    @h.registry.workflow("busy", timeout=timedelta(minutes=10))
    def busy(ctx: WorkflowContext, value: Any) -> Any:
        ctx.step("long", lambda: h.clock.advance(minutes=11).isoformat())
        ctx.step("never", h.count("never"))
        return "done"

    execution, _ = h.runner.start("busy", None)
    assert h.runner.run(execution.execution_id) is None
    assert state_of(h, execution.execution_id) is S.TIMED_OUT
    assert run_counts(h.store.engine) == {}


def test_a_worker_that_keeps_dying_makes_a_poison_pill(request: pytest.FixtureRequest) -> None:
    h = Harness(workflow_store(request, "sqlite"), max_recovery_attempts=2)

    @h.registry.workflow("deadly")
    def deadly(ctx: WorkflowContext, value: Any) -> Any:
        ctx.step("ok", h.count("ok"))
        raise SimulatedCrash

    execution, _ = h.runner.start("deadly", None)
    reports = []
    for _ in range(3):
        with pytest.raises(SimulatedCrash):
            h.runner.run(execution.execution_id)
        h.clock.advance(seconds=LEASE + 1)
        reports.append(h.runner.sweep_once())
    # Requeued twice (its lease released, a job queued), then failed as a poison pill.
    assert [(r.released, r.requeued, r.poisoned) for r in reports] == [(1, 1, 0), (1, 1, 0), (0, 0, 1)]
    failed = h.store.get(execution.execution_id)
    assert failed is not None and failed.state is S.FAILED and "poison pill" in (failed.error or "")
    assert run_counts(h.store.engine) == {"ok": 1}


def test_an_exception_escaping_the_workflow_fails_it_with_the_message(h: Harness) -> None:
    def boom(ctx: WorkflowContext, value: Any) -> Any:
        raise ValueError("no such order")

    h.registry.workflow("boom")(boom)
    execution, _ = h.runner.start("boom", None)
    failed = h.runner.run(execution.execution_id)
    assert failed is not None and failed.state is S.FAILED and failed.error == "ValueError: no such order"


def test_a_non_json_result_fails_the_run(h: Harness) -> None:
    h.registry.workflow("setty")(lambda ctx, value: {1, 2})
    execution, _ = h.runner.start("setty", None)
    failed = h.runner.run(execution.execution_id)
    assert failed is not None and failed.state is S.FAILED and "not a JSON value" in (failed.error or "")


def test_a_failed_step_raises_the_same_error_on_replay_without_running_again(h: Harness) -> None:
    crash = {"armed": True}

    def charge() -> None:
        record_run(h.store.engine, "charge")
        raise ValueError("card declined")

    def notify() -> str:
        if crash.pop("armed", False):
            raise SimulatedCrash
        return "notified"

    @h.registry.workflow("declined")
    def declined(ctx: WorkflowContext, value: Any) -> Any:
        try:
            ctx.step("charge", charge)
        except StepFailedError as exc:
            message = exc.message
        return [message, ctx.step("notify", notify)]

    execution, _ = h.runner.start("declined", None)
    with pytest.raises(SimulatedCrash):
        h.runner.run(execution.execution_id)
    h.recover()
    done = h.runner.run(execution.execution_id)
    assert done is not None and done.output == ["ValueError: card declined", "notified"]
    assert run_counts(h.store.engine) == {"charge": 1}


def test_a_step_retries_with_backoff(h: Harness) -> None:
    tries = []

    def flaky() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise ConnectionError("try again")
        return "ok"

    h.registry.workflow("flaky")(lambda ctx, value: ctx.step("call", flaky, retries=2))
    execution, _ = h.runner.start("flaky", None)
    done = h.runner.run(execution.execution_id)
    assert done is not None and done.output == "ok" and len(tries) == 3
    assert len(h.waits) == 2 and all(0 <= w <= 2.0 for w in h.waits)


def test_a_step_that_keeps_failing_fails_the_run_after_its_retries(h: Harness) -> None:
    def broken() -> None:
        record_run(h.store.engine, "broken")
        raise ConnectionError("down")

    h.registry.workflow("broken")(lambda ctx, value: ctx.step("call", broken, retries=1))
    execution, _ = h.runner.start("broken", None)
    failed = h.runner.run(execution.execution_id)
    assert failed is not None and failed.state is S.FAILED
    assert failed.error == "StepFailedError: step 'call' failed: ConnectionError: down"
    assert run_counts(h.store.engine) == {"broken": 2}
    assert [s.error for s in h.store.list_steps(execution.execution_id)] == ["ConnectionError: down"]


def test_steps_cannot_nest(h: Harness) -> None:
    h.registry.workflow("nested")(lambda ctx, value: ctx.step("outer", lambda: ctx.step("inner", lambda: 1)))
    execution, _ = h.runner.start("nested", None)
    failed = h.runner.run(execution.execution_id)
    assert failed is not None and failed.state is S.FAILED
    assert "ctx.step cannot be called inside a step" in (failed.error or "")
    assert [s.name for s in h.store.list_steps(execution.execution_id)] == ["outer"]


def test_a_job_that_fires_before_the_wake_time_reschedules_itself(h: Harness) -> None:
    @h.registry.workflow("nap")
    def nap(ctx: WorkflowContext, value: Any) -> Any:
        ctx.sleep(60)
        return "up"

    execution, _ = h.runner.start("nap", None)
    h.runner.run(execution.execution_id)
    wake = h.clock() + timedelta(seconds=60)
    h.scheduled.calls.clear()
    h.clock.advance(seconds=59)
    assert h.runner.run(execution.execution_id) is None
    assert h.scheduled.calls == [(execution.execution_id, wake)]


def test_the_heartbeat_thread_renews_the_lease_while_a_step_runs(request: pytest.FixtureRequest) -> None:
    h = Harness(workflow_store(request, "sqlite"))
    h.runner.heartbeat_interval = 0.02

    @h.registry.workflow("long")
    def long(ctx: WorkflowContext, value: Any) -> Any:
        def wait_for_a_heartbeat() -> bool:
            target = h.clock.advance(seconds=20) + timedelta(seconds=LEASE)
            for _ in range(200):
                current = h.store.get(ctx.execution_id)
                if current is not None and current.lease_expires_at == target:
                    return True
                time.sleep(0.01)
            return False

        return ctx.step("long", wait_for_a_heartbeat)

    execution, _ = h.runner.start("long", None)
    done = h.runner.run(execution.execution_id)
    assert done is not None and done.output is True


def test_a_terminal_hook_starts_a_workflow_in_the_transition_and_it_is_scheduled_after_commit(
    h: Harness,
) -> None:
    h.registry.workflow("source")(lambda ctx, value: {"region": "EU"})
    h.registry.workflow("target")(lambda ctx, value: value)
    started: list[list[str]] = []
    h.store.on_started = started.append
    fail = {"armed": False}

    def trigger(conn: sa.Connection, execution: Execution) -> None:
        if execution.workflow_name != "source":
            return
        h.runner.start(
            "target",
            execution.output,
            workflow_id=f"after-{execution.execution_id}",
            trigger_depth=execution.trigger_depth + 1,
            conn=conn,
        )
        assert started == []  # not before the commit
        if fail["armed"]:
            raise RuntimeError("hook failed after starting")

    h.store.hooks.register(trigger)
    broken, _ = h.runner.start("source", None)
    fail["armed"] = True
    with pytest.raises(RuntimeError):
        h.runner.run(broken.execution_id)
    assert h.store.get_by_workflow_id(f"after-{broken.execution_id}") is None and started == []

    fail["armed"] = False
    execution, _ = h.runner.start("source", None)
    h.runner.run(execution.execution_id)
    target = h.store.get_by_workflow_id(f"after-{execution.execution_id}")
    assert target is not None and target.input == {"region": "EU"} and target.trigger_depth == 1
    assert started == [[target.execution_id]]
    done = h.runner.run(target.execution_id)
    assert done is not None and done.output == {"region": "EU"}


def test_a_database_failure_leaves_the_run_open_for_recovery(h: Harness) -> None:
    broken = {"armed": True}

    def drop_the_steps_table() -> str:
        if broken.pop("armed", False):
            with h.store.engine.begin() as conn:
                conn.execute(sa.text("DROP TABLE harvest_workflow_steps"))
        return "ok"

    h.registry.workflow("fragile")(lambda ctx, value: ctx.step("drop", drop_the_steps_table))
    execution, _ = h.runner.start("fragile", None)
    with pytest.raises(StoreError, match="ensure_schema"):
        h.runner.run(execution.execution_id)
    still = h.store.get(execution.execution_id)
    assert still is not None and still.state is S.RUNNING and still.error is None
    h.store.ensure_schema()
    h.recover()
    done = h.runner.run(execution.execution_id)
    assert done is not None and done.state is S.COMPLETED and done.output == "ok"
