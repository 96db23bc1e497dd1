"""Continue-as-new on SQLite and PostgreSQL: a run hands over to the next run of its ``workflow_id``
in one transaction; the chain, its links, what carries over, and what stops it."""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Connection

from flask_harvest.errors import InvalidFieldError, InvalidStateError
from flask_harvest.workflows import Execution, ExecutionState, WorkflowContext
from flask_harvest.workflows._schema import executions_table
from flask_harvest.workflows.service import WorkflowService

from .test_workflows_runner import Harness
from .workflow_support import SQL_KINDS, SimulatedCrash, run_counts, workflow_store

S = ExecutionState


@pytest.fixture(params=SQL_KINDS)
def h(request: pytest.FixtureRequest) -> Harness:
    return Harness(workflow_store(request, request.param))


def rows_of(h: Harness, workflow_id: str) -> list[Execution]:
    """Every run of ``workflow_id``, oldest first."""
    return sorted(
        (e for e in h.store.list_executions(limit=1000) if e.workflow_id == workflow_id),
        key=lambda e: (e.created_at, e.execution_id),
    )


def open_count(h: Harness, workflow_id: str) -> int:
    with h.store.engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count())
                .select_from(executions_table)
                .where(
                    executions_table.c.workflow_id == workflow_id,
                    executions_table.c.state.in_([S.PENDING.value, S.RUNNING.value]),
                )
            ).scalar_one()
        )


def drain(h: Harness, workflow_id: str, *, max_runs: int = 50, ended: bool = True) -> Execution:
    """Run what is scheduled (due now) until the chain of ``workflow_id`` has no open run (with
    ``ended``); check at each run that at most one run of it is open. Returns its last run."""
    done = 0
    while h.scheduled.calls and done < max_runs:
        execution_id, _ = h.scheduled.calls.pop(0)
        assert open_count(h, workflow_id) <= 1
        h.clock.advance(seconds=1)  # each run created later than the one before it
        h.runner.run(execution_id)
        done += 1
    if ended:
        assert open_count(h, workflow_id) == 0
    last = rows_of(h, workflow_id)[-1]
    return last


def register_counter(h: Harness, *, until: int = 5) -> None:
    @h.registry.workflow("counter", timeout=timedelta(hours=1))
    def counter(ctx: WorkflowContext, value: Any) -> Any:
        n = ctx.step("tick", h.count(f"tick{value['n']}"))
        if value["n"] < until:
            ctx.continue_as_new({"n": value["n"] + 1, "seen": [*value["seen"], n]})
        return {"n": value["n"], "seen": value["seen"]}


def test_five_continues_leave_exactly_six_rows_one_open_at_a_time(h: Harness) -> None:
    """A workflow that continues as new 5 times ends with exactly 6 rows, one open at a time."""
    register_counter(h)
    first, _ = h.runner.start("counter", {"n": 0, "seen": []}, workflow_id="c", completion_callbacks=[])
    last = drain(h, "c")
    runs = rows_of(h, "c")
    assert len(runs) == 6
    assert [r.state for r in runs] == [S.CONTINUED_AS_NEW] * 5 + [S.COMPLETED]
    assert runs[0].execution_id == first.execution_id and runs[0].continued_from is None
    for before, after in itertools.pairwise(runs):
        # Linked both ways, and everything that carries over did.
        assert before.continued_to == after.execution_id and after.continued_from == before.execution_id
        assert after.deadline == first.deadline and after.completion_callbacks == []
        assert after.workflow_name == "counter" and after.input["n"] == before.input["n"] + 1
    assert last.continued_to is None
    assert last.output == {"n": 5, "seen": ["tick0", "tick1", "tick2", "tick3", "tick4"]}
    # No checkpoint carried over: each run ticked once, in its own history.
    assert run_counts(h.store.engine) == {f"tick{i}": 1 for i in range(6)}
    assert all(len(h.store.list_steps(r.execution_id)) == 1 for r in runs)
    assert all(r.output is None and r.error is None for r in runs[:5])


def test_the_chain_and_its_last_run_from_any_run_of_it(h: Harness) -> None:
    register_counter(h, until=3)
    h.runner.start("counter", {"n": 0, "seen": []}, workflow_id="c")
    drain(h, "c")
    runs = rows_of(h, "c")
    ids = [r.execution_id for r in runs]
    for run in runs:
        assert [r.execution_id for r in h.store.chain(run.execution_id)] == ids
        last = h.store.last_run(run.execution_id)
        assert last is not None and last.execution_id == ids[-1]
    # Bounded: the most recent runs of a longer chain.
    assert [r.execution_id for r in h.store.chain(ids[0], limit=2)] == ids[-2:]
    # A later chain of the same workflow_id is another chain.
    h.runner.start("counter", {"n": 3, "seen": []}, workflow_id="c")
    drain(h, "c")
    assert [r.execution_id for r in h.store.chain(ids[1])] == ids
    assert h.store.chain("no-such-run") == [] and h.store.last_run("no-such-run") is None


def test_what_the_successor_inherits(h: Harness) -> None:
    """The successor inherits callbacks, trigger depth, deadline, parent, queue and priority."""
    register_counter(h, until=1)
    first, _ = h.runner.start(
        "counter", {"n": 0, "seen": []}, workflow_id="c", trigger_depth=2, completion_callbacks=[{"x": 1}]
    )
    inherited = {
        "parent_execution_id": "p" * 36,
        "parent_close_policy": "Abandon",
        "queue_name": "q",
        "concurrency_key": "k",
        "concurrency_limit": 3,
        "priority": 7,
        "fork_mode": "live",
    }
    with h.store.engine.begin() as conn:
        conn.execute(
            executions_table.update()
            .where(executions_table.c.execution_id == first.execution_id)
            .values(inherited)
        )
    last = drain(h, "c")
    assert last.continued_from == first.execution_id
    assert last.trigger_depth == 2 and last.completion_callbacks == [{"x": 1}]
    assert last.deadline == first.deadline and last.deadline is not None
    assert {k: getattr(last, k) for k in inherited} == inherited


def test_terminal_hooks_see_continued_as_new_and_it_does_not_notify(h: Harness) -> None:
    """The closing goes through the terminal transition: hooks run and see ContinuedAsNew, which
    notifies no one (AnyTerminal never matches ContinuedAsNew)."""
    seen: list[tuple[str, str | None, bool]] = []

    def hook(conn: Connection, execution: Execution) -> None:
        seen.append((execution.state.value, execution.continued_to, execution.notifies))

    h.store.hooks.register(hook)
    register_counter(h, until=2)
    h.runner.start("counter", {"n": 0, "seen": []}, workflow_id="c")
    drain(h, "c")
    runs = rows_of(h, "c")
    assert seen == [
        ("ContinuedAsNew", runs[1].execution_id, False),
        ("ContinuedAsNew", runs[2].execution_id, False),
        ("Completed", None, True),
    ]


def test_a_cancel_requested_before_continue_ends_the_chain_cancelled(h: Harness) -> None:
    """A cancel requested on a run that then tries to continue as new ends it Cancelled."""

    @h.registry.workflow("loop")
    def loop(ctx: WorkflowContext, value: Any) -> Any:
        ctx.step("ask", lambda: h.store.request_cancel(ctx.execution_id, "stop it", now=h.clock()).state)
        ctx.continue_as_new(value + 1)

    execution, _ = h.runner.start("loop", 0, workflow_id="l")
    last = drain(h, "l")
    assert rows_of(h, "l") == [last] and last.execution_id == execution.execution_id
    assert last.state is S.CANCELLED and last.error == "stop it" and last.continued_to is None


def test_a_cancel_landing_after_the_boundary_is_caught_by_the_guard(h: Harness) -> None:
    """The closing UPDATE is guarded by no cancel requested: a refused guard ends the run at a
    boundary (Cancelled), and no successor is inserted."""

    @h.registry.workflow("loop")
    def loop(ctx: WorkflowContext, value: Any) -> Any:
        ctx.step("s", lambda: 1)
        # After the boundary continue_as_new passes (the checkpoint's fresh read), before its UPDATE.
        h.store.request_cancel(ctx.execution_id, None, now=h.clock())
        ctx.continue_as_new(value + 1)

    h.runner.start("loop", 0, workflow_id="l")
    last = drain(h, "l")
    assert len(rows_of(h, "l")) == 1 and last.state is S.CANCELLED


def test_a_passed_deadline_ends_the_run_timed_out_instead_of_continuing(h: Harness) -> None:
    """The workflow timeout spans the whole chain: a run past the first run's deadline ends
    TimedOut at continue_as_new."""

    @h.registry.workflow("slow", timeout=timedelta(minutes=10))
    def slow(ctx: WorkflowContext, value: Any) -> Any:
        ctx.step("s", lambda: h.clock.advance(minutes=4).isoformat())
        ctx.continue_as_new(value + 1)

    first, _ = h.runner.start("slow", 0, workflow_id="t")
    last = drain(h, "t")
    runs = rows_of(h, "t")
    # Runs 1 and 2 end at minutes 4 and 8; run 3 reaches minute 12, past the deadline.
    assert [r.state for r in runs] == [S.CONTINUED_AS_NEW, S.CONTINUED_AS_NEW, S.TIMED_OUT]
    assert last.deadline == first.deadline and "deadline" in (last.error or "")


@pytest.mark.parametrize(
    ("bad", "message"),
    [({1, 2}, "is not a JSON value"), (float("nan"), "is not a JSON value"), ("x" * 2000, "bytes")],
)
def test_bad_input_fails_the_run_with_a_clear_error_and_starts_nothing(
    h: Harness, bad: Any, message: str
) -> None:
    """Bad input to continue_as_new (not JSON, too large) fails the run's code with a clear error
    and changes nothing: no successor."""

    @h.registry.workflow("bad")
    def bad_flow(ctx: WorkflowContext, value: Any) -> Any:
        ctx.continue_as_new(bad)

    h.runner.start("bad", None, workflow_id="b")
    last = drain(h, "b")
    assert len(rows_of(h, "b")) == 1 and last.continued_to is None
    assert last.state is S.FAILED and "input" in (last.error or "") and message in (last.error or "")


def test_the_code_can_catch_bad_input_and_go_on(h: Harness) -> None:
    @h.registry.workflow("careful")
    def careful(ctx: WorkflowContext, value: Any) -> Any:
        try:
            ctx.continue_as_new({"n": {1}})
        except InvalidFieldError as exc:
            return f"kept going: {exc.field}"

    h.runner.start("careful", None, workflow_id="k")
    last = drain(h, "k")
    assert last.state is S.COMPLETED and last.output == "kept going: input"


def test_continue_as_new_inside_a_step_is_refused(h: Harness) -> None:
    @h.registry.workflow("nested")
    def nested(ctx: WorkflowContext, value: Any) -> Any:
        ctx.step("outer", lambda: ctx.continue_as_new(1))

    h.runner.start("nested", None, workflow_id="n")
    last = drain(h, "n")
    assert len(rows_of(h, "n")) == 1 and last.state is S.FAILED
    assert InvalidStateError.__name__ in (last.error or "") and "inside a step" in (last.error or "")


def test_a_lost_lease_continues_nothing(h: Harness) -> None:
    """A run terminated before it continues writes nothing: no successor."""

    @h.registry.workflow("gone")
    def gone(ctx: WorkflowContext, value: Any) -> Any:
        ctx.step("s", lambda: h.store.terminate(ctx.execution_id, "bye", now=h.clock()).state)
        ctx.continue_as_new(1)

    h.runner.start("gone", None, workflow_id="g")
    last = drain(h, "g")
    assert len(rows_of(h, "g")) == 1 and last.state is S.TERMINATED


def test_a_replay_after_a_crash_before_the_hand_over_continues_once(h: Harness) -> None:
    """A worker that dies before continue_as_new committed leaves the run to be replayed; the
    replay continues it once."""
    crash = {"armed": True}

    @h.registry.workflow("crashy")
    def crashy(ctx: WorkflowContext, value: Any) -> Any:
        ctx.step("s", h.count(f"s{value}"))
        if value == 0 and crash.pop("armed", False):
            raise SimulatedCrash
        if value == 0:
            ctx.continue_as_new(1)
        return value

    first, _ = h.runner.start("crashy", 0, workflow_id="r")
    h.scheduled.calls.clear()
    with pytest.raises(SimulatedCrash):
        h.runner.run(first.execution_id)
    h.scheduled.calls.append((first.execution_id, None))
    h.recover()
    last = drain(h, "r")
    assert [r.state for r in rows_of(h, "r")] == [S.CONTINUED_AS_NEW, S.COMPLETED]
    assert last.output == 1 and run_counts(h.store.engine) == {"s0": 1, "s1": 1}


def test_a_terminate_landing_after_the_boundary_continues_nothing(h: Harness) -> None:
    """The closing UPDATE is guarded by the lease: a run terminated between its boundary and its
    hand-over stays Terminated, with no successor."""

    @h.registry.workflow("loop")
    def loop(ctx: WorkflowContext, value: Any) -> Any:
        ctx.step("s", lambda: 1)
        h.store.terminate(ctx.execution_id, "now", now=h.clock())
        ctx.continue_as_new(value + 1)

    h.runner.start("loop", 0, workflow_id="l")
    last = drain(h, "l")
    assert len(rows_of(h, "l")) == 1 and last.state is S.TERMINATED and last.continued_to is None


def test_the_sweeper_times_out_the_open_run_at_the_chains_deadline(h: Harness) -> None:
    """A timeout applies to the chain's open run: its inherited deadline, enforced by the sweeper
    while it sleeps."""

    @h.registry.workflow("nap", timeout=timedelta(minutes=10))
    def nap(ctx: WorkflowContext, value: Any) -> Any:
        if value < 2:
            ctx.continue_as_new(value + 1)
        ctx.sleep(timedelta(hours=1))

    first, _ = h.runner.start("nap", 0, workflow_id="z")
    drain(h, "z", max_runs=3, ended=False)
    runs = h.store.chain(first.execution_id)
    assert [r.state for r in runs] == [S.CONTINUED_AS_NEW, S.CONTINUED_AS_NEW, S.PENDING]
    h.clock.advance(minutes=11)
    h.runner.sweep_once()
    ended = h.store.get(runs[-1].execution_id)
    assert ended is not None and ended.state is S.TIMED_OUT and ended.deadline == first.deadline


def test_a_cancel_racing_the_hand_over_through_the_first_id_always_ends_the_chain(h: Harness) -> None:
    """A cancel given the first run's id, racing the run's continue-as-new on another thread, ends
    the chain Cancelled whichever lands first, with never two open runs."""
    service = WorkflowService(h.store, h.registry, h.runner, h.store.hooks)
    gates: dict[str, threading.Barrier] = {}

    @h.registry.workflow("racer")
    def racer(ctx: WorkflowContext, value: Any) -> Any:
        if value["n"] == 0:
            ctx.step("meet", lambda: gates[value["key"]].wait(timeout=20))
            ctx.continue_as_new({"n": 1, "key": value["key"]})
        ctx.sleep(timedelta(hours=1))

    for round_ in range(8):
        key = f"race-{round_}"
        gates[key] = threading.Barrier(2)
        first, _ = h.runner.start("racer", {"n": 0, "key": key}, workflow_id=key)
        h.scheduled.calls.clear()
        worker = threading.Thread(target=h.runner.run, args=(first.execution_id,))
        worker.start()
        gates[key].wait(timeout=20)
        ended = service.cancel(first.execution_id, "race")
        worker.join(timeout=20)
        for execution_id, _ in list(h.scheduled.calls):
            h.runner.run(execution_id)  # a successor, if the hand-over won: Cancelled at its claim
        runs = h.store.chain(first.execution_id)
        assert open_count(h, key) == 0 and len(rows_of(h, key)) == len(runs)
        assert runs[-1].state is S.CANCELLED and ended.execution_id == runs[-1].execution_id
        assert [r.state for r in runs] in ([S.CANCELLED], [S.CONTINUED_AS_NEW, S.CANCELLED])


def make_fork(h: Harness, execution_id: str, **columns: Any) -> None:
    """Mark a run as a fork (the columns a fork is created with)."""
    with h.store.engine.begin() as conn:
        conn.execute(
            executions_table.update().where(executions_table.c.execution_id == execution_id).values(columns)
        )


def test_a_quiet_fork_stays_quiet_across_the_chain(h: Harness) -> None:
    """The successor inherits the fork mode: a live_quiet fork's chain notifies no one."""
    register_counter(h, until=2)
    fork, _ = h.runner.start("counter", {"n": 0, "seen": []}, workflow_id="q")
    make_fork(h, fork.execution_id, forked_from="s" * 36, fork_from_step=0, fork_mode="live_quiet")
    last = drain(h, "q")
    chain = h.store.chain(fork.execution_id)
    assert [r.fork_mode for r in chain] == ["live_quiet"] * 3 and last.state is S.COMPLETED
    assert [r.forked_from for r in chain[1:]] == [None, None] and not last.notifies


def test_a_recorded_fork_continues_as_a_recorded_fork_of_its_sources_next_run(h: Harness) -> None:
    """A recorded fork continues as new only where its source did: its next run replays the
    source's next run from the start."""
    register_counter(h, until=1)
    source, _ = h.runner.start("counter", {"n": 0, "seen": []}, workflow_id="src")
    drain(h, "src")
    source_chain = h.store.chain(source.execution_id)
    fork, _ = h.runner.start("counter", {"n": 0, "seen": []}, workflow_id="fork")
    make_fork(h, fork.execution_id, forked_from=source.execution_id, fork_from_step=0, fork_mode="recorded")
    h.runner.run(fork.execution_id)
    closed, successor = h.store.chain(fork.execution_id)
    assert closed.state is S.CONTINUED_AS_NEW
    assert (successor.fork_mode, successor.forked_from, successor.fork_from_step) == (
        "recorded",
        source_chain[1].execution_id,
        0,
    )


def test_a_recorded_fork_whose_source_did_not_continue_cannot_continue(h: Harness) -> None:
    """A recorded fork does no new work: where its source did not continue as new, its
    continue_as_new fails the run with a clear error and starts nothing."""
    register_counter(h, until=0)
    source, _ = h.runner.start("counter", {"n": 0, "seen": []}, workflow_id="src")
    drain(h, "src")

    @h.registry.workflow("diverges")
    def diverges(ctx: WorkflowContext, value: Any) -> Any:
        ctx.continue_as_new(value)

    fork, _ = h.runner.start("diverges", 1, workflow_id="fork")
    make_fork(h, fork.execution_id, forked_from=source.execution_id, fork_from_step=0, fork_mode="recorded")
    failed = h.runner.run(fork.execution_id)
    assert (
        failed is not None and failed.state is S.FAILED and "cannot continue as new" in (failed.error or "")
    )
    assert rows_of(h, "fork") == [failed]


def test_a_recorded_fork_of_a_chain_replays_the_whole_chain(h: Harness) -> None:
    """A recorded fork of a chain's first run replays every run of the chain, with no side effect
    run again, ends with the chain's outcome, and notifies no one."""
    register_counter(h, until=2)
    service = WorkflowService(h.store, h.registry, h.runner, h.store.hooks)
    first, _ = h.runner.start("counter", {"n": 0, "seen": []}, workflow_id="c")
    last = drain(h, "c")
    before = run_counts(h.store.engine)
    fork = getattr(service, "fork")(first.execution_id, 0, "recorded")  # noqa: B009 (not on every branch)
    h.scheduled.calls[:] = [(fork.execution_id, None)]
    end = drain(h, fork.workflow_id)
    chain = h.store.chain(fork.execution_id)
    assert [r.fork_mode for r in chain] == ["recorded"] * 3
    assert [r.forked_from for r in chain] == [r.execution_id for r in h.store.chain(first.execution_id)]
    assert end.state is S.COMPLETED and end.output == last.output and not end.notifies
    assert run_counts(h.store.engine) == before
