"""Forks ("retry from step N") through the runner, on SQLite and PostgreSQL: the three modes,
recorded results and side effects, sleeps, non-determinism, completion triggers, bad input."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest.errors import InvalidFieldError
from flask_harvest.triggers import CompletionTrigger
from flask_harvest.triggers.firing import TriggerFiring
from flask_harvest.triggers.service import TriggerService
from flask_harvest.triggers.store import SqlTriggerStore
from flask_harvest.workflows import (
    Execution,
    ExecutionNotFoundError,
    ExecutionState,
    ForkMode,
    SqlWorkflowStore,
    UnknownWorkflowError,
    WorkflowContext,
    WorkflowRegistry,
    WorkflowRunner,
)
from flask_harvest.workflows._schema import NAME_LENGTH, executions_table, steps_table
from flask_harvest.workflows.forks import FORK_SEPARATOR, check_from_step, fork_workflow_id
from flask_harvest.workflows.forks import NAME_LENGTH as FORK_NAME_LENGTH
from flask_harvest.workflows.service import WorkflowService

from .properties import BUDGET
from .workflow_support import SQL_KINDS, Clock, Scheduled, record_run, run_counts, workflow_store

S = ExecutionState
M = ForkMode


class Harness:
    """A runner, a workflow service and the completion-trigger hook on one database."""

    def __init__(self, store: SqlWorkflowStore) -> None:
        self.store = store
        self.registry = WorkflowRegistry()
        self.clock = Clock()
        self.scheduled = Scheduled()
        self.runner = WorkflowRunner(
            store, self.registry, self.scheduled, max_input_bytes=1000, heartbeat_interval=0, clock=self.clock
        )
        store.on_started = self.runner.schedule_started
        self.service = WorkflowService(store, self.registry, self.runner, store.hooks)
        self.triggers = SqlTriggerStore(store.engine)
        self.triggers.ensure_schema()
        self.firing = TriggerFiring(
            self.triggers,
            self.runner.start,
            knows=self.registry.__contains__,
            max_chain_depth=16,
            max_input_bytes=1000,
            clock=self.clock,
        )
        store.hooks.register(self.firing)
        self.trigger_service = TriggerService(self.triggers, self.firing, self.service, clock=self.clock)
        #: What the ``flaky`` workflow's second step does: raise, or return this.
        self.fixed: str | None = None
        #: The name the ``changing`` workflow gives its second step.
        self.second = "b"
        self._register()

    def count(self, label: str) -> Callable[[], str]:
        def step() -> str:
            record_run(self.store.engine, label)
            return f"{label}-result"

        return step

    def _register(self) -> None:
        @self.registry.workflow("counted")
        def counted(ctx: WorkflowContext, data: Any) -> Any:
            return [ctx.step(name, self.count(name)) for name in ("a", "b", "c")]

        @self.registry.workflow("flaky")
        def flaky(ctx: WorkflowContext, data: Any) -> Any:
            first = ctx.step("a", self.count("a"))

            def second() -> str:
                record_run(self.store.engine, "b")
                if self.fixed is None:
                    raise RuntimeError("the payment service is down")
                return self.fixed

            return [first, ctx.step("b", second)]

        @self.registry.workflow("changing")
        def changing(ctx: WorkflowContext, data: Any) -> Any:
            return [ctx.step("a", self.count("a")), ctx.step(self.second, self.count(self.second))]

        @self.registry.workflow("napping")
        def napping(ctx: WorkflowContext, data: Any) -> Any:
            first = ctx.step("a", self.count("a"))
            ctx.sleep(timedelta(hours=1))
            return [first, ctx.step("b", self.count("b"))]

        @self.registry.workflow("target")
        def target(ctx: WorkflowContext, data: Any) -> Any:
            return data

    def run(self, name: str, data: Any = None) -> Execution:
        """Start ``name`` and run it until it ends or sleeps; return the row."""
        execution, _ = self.runner.start(name, data)
        return self.drive(execution.execution_id)

    def drive(self, execution_id: str) -> Execution:
        """Run an execution's queued job (if it is due) and return its row."""
        self.runner.run(execution_id)
        found = self.store.get(execution_id)
        assert found is not None
        return found

    def fork(self, source: Execution, from_step: int, mode: ForkMode) -> Execution:
        handle = self.service.fork(source.execution_id, from_step, mode)
        assert (handle.execution_id, None) in self.scheduled.calls  # queued at once
        return self.drive(handle.execution_id)

    def steps(self, execution_id: str) -> list[tuple[int, str, Any, str | None]]:
        return [(s.seq, s.name, s.output, s.error) for s in self.store.list_steps(execution_id)]

    def rows(self) -> tuple[int, int]:
        with self.store.engine.connect() as conn:
            executions = conn.execute(sa.select(sa.func.count()).select_from(executions_table)).scalar_one()
            steps = conn.execute(sa.select(sa.func.count()).select_from(steps_table)).scalar_one()
        return executions, steps


@pytest.fixture(params=SQL_KINDS)
def h(request: pytest.FixtureRequest) -> Iterator[Harness]:
    harness = Harness(workflow_store(request, request.param))
    yield harness
    harness.firing.close()


# -- what a fork is ---------------------------------------------------------------------------------


def test_a_fork_is_a_new_run_linked_to_its_source_with_the_first_checkpoints_copied(h: Harness) -> None:
    source = h.run("counted", {"order": 7})
    assert source.state is S.COMPLETED
    handle = h.service.fork(source.execution_id, 2, M.LIVE)
    fork = handle.execution()
    assert fork.execution_id != source.execution_id
    assert fork.state is S.PENDING and fork.workflow_name == "counted" and fork.input == {"order": 7}
    assert (fork.forked_from, fork.fork_from_step, fork.fork_mode) == (source.execution_id, 2, "live")
    assert fork.workflow_id == f"{source.workflow_id}{FORK_SEPARATOR}{fork.execution_id}"
    assert handle.workflow_id == fork.workflow_id
    assert fork.trigger_depth == source.trigger_depth
    # Positions below the fork point are the source's, copied when the fork was created.
    assert h.steps(fork.execution_id) == h.steps(source.execution_id)[:2]


def test_the_source_is_unchanged_by_any_fork(h: Harness) -> None:
    """A fork leaves its source as it was: row and checkpoints."""
    source = h.run("counted")
    before = (h.store.get(source.execution_id), h.steps(source.execution_id))
    for mode in M:
        h.fork(source, 1, mode)
    assert (h.store.get(source.execution_id), h.steps(source.execution_id)) == before


def test_the_extension_and_the_service_take_the_mode_as_text_too(h: Harness) -> None:
    source = h.run("counted")
    fork = h.service.fork(source.execution_id, 0, "live_quiet").execution()
    assert fork.fork_mode == "live_quiet"
    assert h.service.fork(source.execution_id, 3).execution().fork_mode == "recorded"  # the default


# -- the modes ------------------------------------------------------------------------------------


def test_a_recorded_fork_returns_the_source_results_and_runs_no_step(h: Harness) -> None:
    """Recorded: steps at or after the fork point return the source run's recorded results (the
    fork checkpoints them as its own); no step runs again."""
    source = h.run("counted")
    assert run_counts(h.store.engine) == {"a": 1, "b": 1, "c": 1}
    fork = h.fork(source, 1, M.RECORDED)
    assert fork.state is S.COMPLETED
    assert fork.output == source.output == ["a-result", "b-result", "c-result"]
    assert run_counts(h.store.engine) == {"a": 1, "b": 1, "c": 1}
    assert h.steps(fork.execution_id) == h.steps(source.execution_id)


@pytest.mark.parametrize("mode", [M.LIVE, M.LIVE_QUIET])
def test_live_forks_run_the_steps_from_the_fork_point_for_real(h: Harness, mode: ForkMode) -> None:
    """Live and live_quiet: steps at or after the fork point run for real; the ones before it
    return the copied checkpoints."""
    source = h.run("counted")
    fork = h.fork(source, 1, mode)
    assert fork.state is S.COMPLETED
    assert run_counts(h.store.engine) == {"a": 1, "b": 2, "c": 2}
    assert h.fork(source, 0, mode).state is S.COMPLETED
    assert run_counts(h.store.engine) == {"a": 2, "b": 3, "c": 3}


def test_retry_from_the_failed_step_after_a_fix(h: Harness) -> None:
    """The runbook: a run failed at step 1; a recorded fork fails the same way, a live fork from
    step 1 runs it again (and not step 0) once the cause is fixed."""
    source = h.run("flaky")
    assert source.state is S.FAILED and "the payment service is down" in (source.error or "")
    assert run_counts(h.store.engine) == {"a": 1, "b": 1}
    recorded = h.fork(source, 1, M.RECORDED)
    assert recorded.state is S.FAILED and recorded.error == source.error
    assert run_counts(h.store.engine) == {"a": 1, "b": 1}
    h.fixed = "paid"
    live = h.fork(source, 1, M.LIVE)
    assert live.state is S.COMPLETED and live.output == ["a-result", "paid"]
    assert run_counts(h.store.engine) == {"a": 1, "b": 2}


def test_a_recorded_fork_replays_the_recorded_wake_time_and_stops_where_the_source_stopped(
    h: Harness,
) -> None:
    """Recorded: a sleep replays the source's wake time; a position the source never recorded
    fails the fork with a clear error instead of running a step for real."""
    source = h.run("napping")  # step a, then asleep for an hour: open, with 2 checkpoints
    assert source.state is S.PENDING and len(h.steps(source.execution_id)) == 2
    wake_at = source.next_run_at
    assert wake_at is not None
    # An open run can be forked: what it has checkpointed now is what the fork copies.
    fork = h.fork(source, 1, M.RECORDED)
    assert fork.state is S.PENDING and fork.next_run_at == wake_at
    assert (fork.execution_id, wake_at) in h.scheduled.calls
    h.clock.advance(hours=1, seconds=1)
    fork = h.drive(fork.execution_id)
    assert fork.state is S.FAILED
    assert fork.error is not None and "never recorded" in fork.error and "live" in fork.error
    assert run_counts(h.store.engine) == {"a": 1}  # step b never ran
    # The source goes on as if nothing happened.
    assert h.drive(source.execution_id).state is S.COMPLETED
    assert run_counts(h.store.engine) == {"a": 1, "b": 1}


def test_a_recorded_fork_of_a_run_whose_code_now_differs_fails_with_the_non_determinism_error(
    h: Harness,
) -> None:
    """Recorded: a step name that does not match the source's at its position fails the fork with
    the non-determinism error."""
    source = h.run("changing")
    h.second = "renamed"
    fork = h.fork(source, 1, M.RECORDED)
    assert fork.state is S.FAILED
    assert fork.error is not None and fork.error.startswith("non-deterministic workflow")
    assert "'b'" in fork.error and "'renamed'" in fork.error
    assert run_counts(h.store.engine) == {"a": 1, "b": 1}


@pytest.mark.parametrize("mode", list(M))
def test_a_copied_checkpoint_that_the_code_no_longer_calls_fails_any_fork(h: Harness, mode: ForkMode) -> None:
    source = h.run("changing")
    h.second = "renamed"
    fork = h.fork(source, 2, mode)
    assert fork.state is S.FAILED
    assert fork.error is not None and fork.error.startswith("non-deterministic workflow")
    assert "renamed" not in run_counts(h.store.engine)


def test_a_recorded_fork_that_crashes_resumes_from_its_own_checkpoints(h: Harness) -> None:
    source = h.run("counted")
    handle = h.service.fork(source.execution_id, 1, M.RECORDED)
    claimed = h.store.claim(handle.execution_id, now=h.clock(), lease_seconds=30)
    assert claimed is not None  # a worker claimed it and died before its first step
    h.clock.advance(seconds=31)
    h.runner.sweep_once()
    fork = h.drive(handle.execution_id)
    assert fork.state is S.COMPLETED and fork.output == source.output and fork.attempt == 2
    assert run_counts(h.store.engine) == {"a": 1, "b": 1, "c": 1}


# -- completion triggers ----------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "fires"), [(M.RECORDED, False), (M.LIVE, True), (M.LIVE_QUIET, False)])
def test_only_a_live_fork_fires_completion_triggers(h: Harness, mode: ForkMode, fires: bool) -> None:
    """A recorded fork fires no trigger, so it starts no target execution; a live fork fires
    triggers as usual; a live_quiet fork fires none."""
    h.trigger_service.register(CompletionTrigger("counted", "target"))
    source = h.run("counted")
    assert len(h.trigger_service.fires(source_exec_id=source.execution_id)) == 1
    fork = h.fork(source, 1, mode)
    assert fork.state is S.COMPLETED
    ledger = h.trigger_service.fires(source_exec_id=fork.execution_id)
    targets = h.store.list_executions(name="target")
    if fires:
        assert len(ledger) == 1 and ledger[0].target_execution_id is not None
        assert {t.execution_id for t in targets} >= {ledger[0].target_execution_id}
        assert len(targets) == 2
    else:
        assert ledger == []
        assert len(targets) == 1  # the source's only


# -- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize("from_step", [-1, 4, 10**30, "1", 1.0, True, None, [1]])
def test_a_fork_point_outside_the_recorded_steps_is_refused_and_creates_nothing(
    h: Harness, from_step: Any
) -> None:
    source = h.run("counted")
    before = h.rows()
    with pytest.raises(InvalidFieldError) as caught:
        h.service.fork(source.execution_id, from_step, M.LIVE)
    assert caught.value.field == "from_step"
    assert h.rows() == before


@pytest.mark.parametrize("mode", ["", "Recorded", "replay", None, 1])
def test_an_unknown_mode_is_refused_and_creates_nothing(h: Harness, mode: Any) -> None:
    source = h.run("counted")
    before = h.rows()
    with pytest.raises(InvalidFieldError) as caught:
        h.service.fork(source.execution_id, 1, mode)
    assert caught.value.field == "mode"
    assert h.rows() == before


@pytest.mark.parametrize("ident", ["00000000-0000-0000-0000-000000000000", "nope", "", "\x00", "\ud800"])
def test_an_unknown_source_is_not_found_and_creates_nothing(h: Harness, ident: str) -> None:
    h.run("counted")
    before = h.rows()
    with pytest.raises(ExecutionNotFoundError):
        h.service.fork(ident, 0)
    assert h.rows() == before


# -- the fork's workflow_id ---------------------------------------------------------------------------


def test_the_fork_workflow_id_is_derived_and_fits_the_column() -> None:
    column = executions_table.c.workflow_id.type
    assert isinstance(column, sa.String)
    assert FORK_NAME_LENGTH == NAME_LENGTH == column.length
    eid = "0b6f0c52-3f7e-4a4f-9b0b-3f7a3e1c2d11"
    assert fork_workflow_id("order-1", eid) == f"order-1:fork:{eid}"
    long_a, long_b = "x" * 254 + "a", "x" * 254 + "b"
    derived = fork_workflow_id(long_a, eid)
    assert len(derived) == NAME_LENGTH and derived.endswith(f":fork:{eid}")
    assert derived == fork_workflow_id(long_a, eid)  # deterministic
    assert derived != fork_workflow_id(long_b, eid)  # a cut never merges two sources
    assert len(fork_workflow_id("y" * 220, eid)) == NAME_LENGTH


def test_a_fork_of_a_fork_of_a_long_workflow_id_still_fits(h: Harness) -> None:
    execution, _ = h.runner.start("counted", None, workflow_id="k" * NAME_LENGTH)
    source = h.drive(execution.execution_id)
    first = h.fork(source, 3, M.RECORDED)
    second = h.fork(first, 3, M.RECORDED)
    assert len(first.workflow_id) <= NAME_LENGTH and len(second.workflow_id) <= NAME_LENGTH
    assert second.forked_from == first.execution_id and second.state is S.COMPLETED


def test_concurrent_forks_of_one_run_are_distinct_runs_each_with_its_copies(h: Harness) -> None:
    source = h.run("counted")
    results: list[str] = []
    errors: list[BaseException] = []

    def fork_once() -> None:
        try:
            results.append(h.service.fork(source.execution_id, 2, M.LIVE).execution_id)
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=fork_once) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(set(results)) == 4
    for fork_id in results:
        assert h.steps(fork_id) == h.steps(source.execution_id)[:2]
        fork = h.store.get(fork_id)
        assert fork is not None and fork.workflow_id.endswith(fork_id)


@BUDGET
@given(source=st.text(min_size=1, max_size=300), execution_id=st.uuids().map(str))
def test_any_source_workflow_id_gives_a_fork_workflow_id_that_fits_and_ends_with_the_fork(
    source: str, execution_id: str
) -> None:
    derived = fork_workflow_id(source, execution_id)
    assert len(derived) <= NAME_LENGTH and derived == fork_workflow_id(source, execution_id)
    assert derived.endswith(f"{FORK_SEPARATOR}{execution_id}")
    if len(source) + len(FORK_SEPARATOR) + len(execution_id) <= NAME_LENGTH:
        assert derived == f"{source}{FORK_SEPARATOR}{execution_id}"
    else:
        assert derived.startswith(source[:100])


@BUDGET
@given(value=st.one_of(st.integers(), st.floats(), st.text(max_size=5), st.booleans(), st.none()))
def test_a_fork_point_is_a_non_negative_integer_and_anything_else_is_refused(value: Any) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        assert check_from_step(value) == value
        assert check_from_step(value, value) == value
        if value > 3:
            with pytest.raises(InvalidFieldError):
                check_from_step(value, 3)
    else:
        with pytest.raises(InvalidFieldError):
            check_from_step(value)


def test_a_source_whose_workflow_this_process_does_not_know_is_not_forked(h: Harness) -> None:
    ghost, _ = h.store.start("ghost", None, now=h.clock())
    before = h.rows()
    with pytest.raises(UnknownWorkflowError):
        h.service.fork(ghost.execution_id, 0, M.LIVE)
    assert h.rows() == before
