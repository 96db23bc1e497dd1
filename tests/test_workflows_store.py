"""The SQL workflow store on SQLite and PostgreSQL: start-or-load, leases, checkpoints, the terminal
transition and its hooks, cancel and terminate, the sweeper's queries."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa

from flask_harvest.errors import InvalidFieldError, InvalidStateError
from flask_harvest.schema import metadata, schema_sql
from flask_harvest.workflows import (
    Execution,
    ExecutionNotFoundError,
    ExecutionState,
    IdReusePolicy,
    InputTooLargeError,
    SqlWorkflowStore,
    WorkflowIdReusedError,
)
from flask_harvest.workflows.models import Isolation

from .workflow_support import SQL_KINDS, START, runs_table, workflow_store

S = ExecutionState
LEASE = 30.0


@pytest.fixture(params=SQL_KINDS)
def store(request: pytest.FixtureRequest) -> SqlWorkflowStore:
    return workflow_store(request, request.param)


def start(store: SqlWorkflowStore, workflow_id: str | None = None, **kwargs: object) -> Execution:
    execution, created = store.start("refund", {"order": 1}, workflow_id, now=START, **kwargs)  # type: ignore[arg-type]
    assert created
    return execution


def close(store: SqlWorkflowStore, execution: Execution, state: ExecutionState) -> None:
    assert store.finish(execution.execution_id, state, error="x", now=START) is not None


# -- schema ---------------------------------------------------------------------------------------


def test_the_workflow_tables_are_on_the_shared_metadata() -> None:
    names = {table.name for table in metadata.sorted_tables}
    assert {"harvest_workflow_executions", "harvest_workflow_steps"} <= names
    assert "harvest_workflow_executions" in schema_sql("postgresql")
    assert "ux_harvest_workflow_executions_open_workflow_id" in schema_sql("sqlite")


# -- start and start-or-load ----------------------------------------------------------------------


def test_start_stores_a_pending_due_execution(store: SqlWorkflowStore) -> None:
    execution = start(
        store,
        "refund-r-1",
        deadline=START + timedelta(minutes=5),
        trigger_depth=2,
        completion_callbacks=[{"url": "https://h.example/cb"}],
    )
    assert execution.state is S.PENDING and not execution.terminal
    assert execution.input == {"order": 1}
    assert execution.workflow_id == "refund-r-1"
    assert execution.next_run_at == START
    assert execution.trigger_depth == 2
    assert execution.completion_callbacks == [{"url": "https://h.example/cb"}]
    assert store.get(execution.execution_id) == execution
    assert store.get_by_workflow_id("refund-r-1") == execution


def test_a_workflow_id_is_generated_when_absent(store: SqlWorkflowStore) -> None:
    first, second = start(store), start(store)
    assert first.workflow_id != second.workflow_id


def test_starting_an_open_workflow_id_returns_the_open_run(store: SqlWorkflowStore) -> None:
    first = start(store, "k")
    again, created = store.start("refund", {"other": True}, "k", now=START)
    assert not created and again == first
    assert store.claim(first.execution_id, now=START, lease_seconds=LEASE) is not None
    running, created = store.start("refund", None, "k", IdReusePolicy.REJECT_DUPLICATE, now=START)
    assert not created and running.execution_id == first.execution_id


@pytest.mark.parametrize(
    ("policy", "closed_as", "allowed"),
    [
        (IdReusePolicy.ALLOW_DUPLICATE, S.COMPLETED, True),
        (IdReusePolicy.ALLOW_DUPLICATE, S.FAILED, True),
        (IdReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY, S.COMPLETED, False),
        (IdReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY, S.FAILED, True),
        (IdReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY, S.CANCELLED, True),
        (IdReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY, S.TERMINATED, True),
        (IdReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY, S.TIMED_OUT, True),
        (IdReusePolicy.REJECT_DUPLICATE, S.FAILED, False),
        (IdReusePolicy.REJECT_DUPLICATE, S.COMPLETED, False),
    ],
)
def test_the_reuse_policy_decides_after_a_close(
    store: SqlWorkflowStore, policy: IdReusePolicy, closed_as: ExecutionState, allowed: bool
) -> None:
    first = start(store, "k")
    close(store, first, closed_as)
    if allowed:
        second, created = store.start("refund", 2, "k", policy, now=START + timedelta(seconds=1))
        assert created and second.execution_id != first.execution_id
        assert store.get_by_workflow_id("k") == second
    else:
        with pytest.raises(WorkflowIdReusedError) as caught:
            store.start("refund", 2, "k", policy, now=START + timedelta(seconds=1))
        assert caught.value.previous_execution_id == first.execution_id
        assert caught.value.policy == policy.value
        assert "choose another workflow_id" in str(caught.value)
        assert store.list_executions() == [store.get(first.execution_id)]


def test_ten_concurrent_starts_of_one_workflow_id_give_one_execution(store: SqlWorkflowStore) -> None:
    barrier = threading.Barrier(10)
    results: list[tuple[Execution, bool]] = []
    errors: list[BaseException] = []

    def go() -> None:
        barrier.wait()
        try:
            results.append(store.start("refund", {"n": 1}, "same", now=START))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len({execution.execution_id for execution, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert len(store.list_executions()) == 1


def test_a_run_that_opens_while_a_start_looks_is_returned_not_refused_as_reused(
    store: SqlWorkflowStore,
) -> None:
    # Force the race: the late start has read "no open run" when the other start's run commits,
    # before the late start decides. The run is open, so the late start must load it.
    looked, other_committed = threading.Event(), threading.Event()
    late = threading.current_thread()

    def pause_after_first_read(*_args: object) -> None:
        if threading.current_thread() is late and not looked.is_set():
            looked.set()
            assert other_committed.wait(timeout=60), "the other start did not commit"

    def other_start() -> None:
        assert looked.wait(timeout=60), "the late start did not read"
        start(store, "order-9", policy=IdReusePolicy.REJECT_DUPLICATE)
        other_committed.set()

    other = threading.Thread(target=other_start)
    other.start()
    sa.event.listen(store.engine, "after_cursor_execute", pause_after_first_read)
    try:
        execution, created = store.start("refund", {}, "order-9", IdReusePolicy.REJECT_DUPLICATE, now=START)
    finally:
        sa.event.remove(store.engine, "after_cursor_execute", pause_after_first_read)
        other_committed.set()
        other.join()
    assert not created
    assert [execution] == store.list_executions()


@pytest.mark.parametrize("policy", list(IdReusePolicy))
def test_twenty_concurrent_starts_of_a_new_workflow_id_all_get_its_open_run(
    store: SqlWorkflowStore, policy: IdReusePolicy
) -> None:
    # A race window is a few statements wide: enough rounds that a start refused as "reused" while
    # the run is open would show up (it did in about 4% of starts), and none can fail by chance.
    callers, rounds = 20, 15
    barrier = threading.Barrier(callers)
    results: list[tuple[str, Execution, bool]] = []
    errors: list[BaseException] = []

    def go() -> None:
        for n in range(rounds):
            barrier.wait()
            try:
                execution, created = store.start("refund", {"n": n}, f"new-{n}", policy, now=START)
                results.append((f"new-{n}", execution, created))
            except BaseException as exc:  # reported below
                errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(results) == callers * rounds
    assert sum(created for _, _, created in results) == rounds
    assert len({(key, execution.execution_id) for key, execution, _ in results}) == rounds


def test_a_start_inside_the_callers_transaction_commits_or_rolls_back_with_it(
    store: SqlWorkflowStore,
) -> None:
    def fail_after_start() -> None:
        with store.engine.begin() as conn:
            store.start("refund", 1, "tx", now=START, conn=conn)
            raise RuntimeError("the caller's transaction fails")

    with pytest.raises(RuntimeError):
        fail_after_start()
    assert store.get_by_workflow_id("tx") is None
    with store.engine.begin() as conn:
        inside, created = store.start("refund", 1, "tx", now=START, conn=conn)
        again, created_again = store.start("refund", 1, "tx", now=START, conn=conn)
    assert created and not created_again and again == inside
    assert store.get_by_workflow_id("tx") == inside


def test_bad_input_is_refused_and_changes_nothing(store: SqlWorkflowStore) -> None:
    with pytest.raises(InputTooLargeError) as caught:
        store.start("refund", "x" * 100, now=START, max_input_bytes=50)
    assert caught.value.size == 102 and caught.value.limit == 50
    with pytest.raises(InvalidFieldError, match="input: is not a JSON value"):
        store.start("refund", {1: "int key"}, now=START)
    with pytest.raises(InvalidFieldError):
        store.start("refund", float("nan"), now=START)
    for bad in (
        {"workflow_id": ""},
        {"workflow_id": "k" * 256},
        {"policy": "Sometimes"},
        {"trigger_depth": -1},
    ):
        with pytest.raises(InvalidFieldError):
            store.start("refund", 1, now=START, **bad)
    with pytest.raises(InvalidFieldError, match="name"):
        store.start("", 1, now=START)
    assert store.list_executions() == []
    by_value, created = store.start("refund", 1, "k" * 255, "RejectDuplicate", now=START)  # type: ignore[arg-type]
    assert created and by_value.workflow_id == "k" * 255


# -- claim, heartbeat, checkpoints, suspend ------------------------------------------------------


def test_claim_leases_a_due_pending_execution_once(store: SqlWorkflowStore) -> None:
    execution = start(store)
    claimed = store.claim(execution.execution_id, now=START, lease_seconds=LEASE)
    assert claimed is not None and claimed.state is S.RUNNING and claimed.lease_token
    assert claimed.attempt == 1 and claimed.started_at == START
    assert claimed.lease_expires_at == START + timedelta(seconds=LEASE)
    assert store.claim(execution.execution_id, now=START, lease_seconds=LEASE) is None
    assert store.claim("no-such-id", now=START, lease_seconds=LEASE) is None


def test_heartbeat_extends_only_the_holders_lease(store: SqlWorkflowStore) -> None:
    execution = start(store)
    claimed = store.claim(execution.execution_id, now=START, lease_seconds=LEASE)
    assert claimed is not None and claimed.lease_token is not None
    later = START + timedelta(seconds=20)
    assert store.heartbeat(execution.execution_id, claimed.lease_token, now=later, lease_seconds=LEASE)
    assert store.get(execution.execution_id).lease_expires_at == later + timedelta(seconds=LEASE)  # type: ignore[union-attr]
    assert not store.heartbeat(execution.execution_id, "other-token", now=later, lease_seconds=LEASE)
    store.terminate(execution.execution_id, "stop", now=later)
    assert not store.heartbeat(execution.execution_id, claimed.lease_token, now=later, lease_seconds=LEASE)


def test_record_step_lands_only_while_running_under_the_token(store: SqlWorkflowStore) -> None:
    execution = start(store)
    eid = execution.execution_id
    assert not store.record_step(eid, "none", 0, "a", output=1, now=START)  # still Pending
    claimed = store.claim(eid, now=START, lease_seconds=LEASE)
    assert claimed is not None and claimed.lease_token is not None
    token = claimed.lease_token
    assert store.record_step(eid, token, 0, "a", output={"paid": True}, now=START)
    assert not store.record_step(eid, token, 0, "a", output={"paid": False}, now=START)  # one per position
    assert not store.record_step(eid, "stolen", 1, "b", output=2, now=START)
    assert store.record_step(eid, token, 1, "b", error="ValueError: no", now=START)
    store.terminate(eid, "operator", now=START)
    assert not store.record_step(eid, token, 2, "c", output=3, now=START)
    steps = store.list_steps(eid)
    assert [(s.seq, s.name, s.output, s.error) for s in steps] == [
        (0, "a", {"paid": True}, None),
        (1, "b", None, "ValueError: no"),
    ]
    assert store.get_step(eid, 1) == steps[1] and steps[1].failed
    assert store.get_step(eid, 2) is None


def test_suspend_releases_the_lease_until_the_wake_time(store: SqlWorkflowStore) -> None:
    execution = start(store)
    claimed = store.claim(execution.execution_id, now=START, lease_seconds=LEASE)
    assert claimed is not None and claimed.lease_token is not None
    wake = START + timedelta(minutes=5)
    assert not store.suspend(execution.execution_id, "other", wake_at=wake)
    assert store.suspend(execution.execution_id, claimed.lease_token, wake_at=wake)
    asleep = store.get(execution.execution_id)
    assert asleep is not None and asleep.state is S.PENDING and asleep.lease_token is None
    assert asleep.next_run_at == wake
    assert store.due_executions(now=wake - timedelta(seconds=1)) == []
    assert store.claim(execution.execution_id, now=wake - timedelta(seconds=1), lease_seconds=LEASE) is None
    assert store.due_executions(now=wake) == [(execution.execution_id, wake)]
    assert store.claim(execution.execution_id, now=wake, lease_seconds=LEASE) is not None


# -- the terminal transition ----------------------------------------------------------------------


def test_finish_moves_an_open_execution_exactly_once(store: SqlWorkflowStore) -> None:
    execution = start(store)
    done = store.finish(execution.execution_id, S.COMPLETED, output={"ok": [1, 2]}, now=START)
    assert done is not None and done.state is S.COMPLETED and done.output == {"ok": [1, 2]}
    assert done.completed_at == START and done.lease_token is None
    assert store.finish(execution.execution_id, S.FAILED, error="late", now=START) is None
    assert store.get(execution.execution_id) == done
    with pytest.raises(InvalidStateError):
        store.finish(execution.execution_id, S.RUNNING, now=START)


def test_finish_with_a_token_needs_that_lease(store: SqlWorkflowStore) -> None:
    execution = start(store)
    claimed = store.claim(execution.execution_id, now=START, lease_seconds=LEASE)
    assert claimed is not None and claimed.lease_token is not None
    assert store.finish(execution.execution_id, S.COMPLETED, output=1, now=START, token="other") is None
    assert store.finish(execution.execution_id, S.COMPLETED, output=1, now=START, token=claimed.lease_token)


def test_a_hooks_write_commits_with_the_transition(store: SqlWorkflowStore) -> None:
    seen: list[Execution] = []

    def hook(conn: sa.Connection, execution: Execution) -> None:
        seen.append(execution)
        conn.execute(runs_table.insert().values(label=f"hook:{execution.state.value}"))

    store.hooks.register(hook)
    execution = start(store)
    done = store.finish(execution.execution_id, S.FAILED, error="boom", now=START)
    assert seen == [done]
    assert store.finish(execution.execution_id, S.COMPLETED, now=START) is None
    assert len(seen) == 1  # hooks run only when the transition landed
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(runs_table.c.label)).scalars().all() == ["hook:Failed"]


def test_a_raising_hook_rolls_the_transition_back(store: SqlWorkflowStore) -> None:
    def hook(conn: sa.Connection, execution: Execution) -> None:
        conn.execute(runs_table.insert().values(label="written before the raise"))
        raise RuntimeError("hook failed")

    store.hooks.register(hook)
    execution = start(store)
    with pytest.raises(RuntimeError, match="hook failed"):
        store.finish(execution.execution_id, S.COMPLETED, output=1, now=START)
    assert store.get(execution.execution_id) == execution  # still Pending
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(runs_table)).scalar() == 0
    store.hooks.unregister(hook)
    assert store.finish(execution.execution_id, S.COMPLETED, output=1, now=START) is not None


# -- cancel and terminate -------------------------------------------------------------------------


def test_cancel_ends_a_pending_execution_at_once(store: SqlWorkflowStore) -> None:
    execution = start(store)
    cancelled = store.request_cancel(execution.execution_id, "customer asked", now=START)
    assert cancelled.state is S.CANCELLED and cancelled.error == "customer asked"
    assert store.claim(execution.execution_id, now=START, lease_seconds=LEASE) is None


def test_cancel_flags_a_running_execution(store: SqlWorkflowStore) -> None:
    execution = start(store)
    store.claim(execution.execution_id, now=START, lease_seconds=LEASE)
    flagged = store.request_cancel(execution.execution_id, "stop please", now=START)
    assert flagged.state is S.RUNNING and flagged.cancel_requested and flagged.cancel_reason == "stop please"


def test_cancel_and_terminate_never_overwrite_each_other(store: SqlWorkflowStore) -> None:
    cancelled, terminated = start(store), start(store)
    store.request_cancel(cancelled.execution_id, None, now=START)
    assert store.terminate(cancelled.execution_id, "too late", now=START).state is S.CANCELLED
    store.terminate(terminated.execution_id, None, now=START)
    assert store.request_cancel(terminated.execution_id, "too late", now=START).state is S.TERMINATED
    assert store.get(cancelled.execution_id).error == "cancelled"  # type: ignore[union-attr]
    assert store.get(terminated.execution_id).error == "terminated"  # type: ignore[union-attr]


def test_unknown_ids_are_reported(store: SqlWorkflowStore) -> None:
    with pytest.raises(ExecutionNotFoundError):
        store.request_cancel("nope", None, now=START)
    with pytest.raises(ExecutionNotFoundError):
        store.terminate("nope", None, now=START)
    assert store.get("nope") is None


# -- the sweeper's queries ------------------------------------------------------------------------


def test_expired_leases_are_requeued_then_failed_as_a_poison_pill(store: SqlWorkflowStore) -> None:
    execution = start(store)
    eid = execution.execution_id
    now = START
    for recoveries in (1, 2):
        # Claimed by a worker that runs it alone: each death is charged.
        assert store.claim(eid, now=now, lease_seconds=LEASE, alone=True) is not None
        assert store.expired_leases(now=now + timedelta(seconds=LEASE - 1), max_recovery_attempts=2) == (
            [],
            [],
        )
        now += timedelta(seconds=LEASE + 1)
        assert store.expired_leases(now=now, max_recovery_attempts=2) == ([eid], [])
        requeued = store.get(eid)
        assert requeued is not None and requeued.state is S.PENDING and requeued.recovery_count == recoveries
        assert requeued.charged_recoveries == recoveries and requeued.isolation == Isolation.QUARANTINED.value
    assert store.claim(eid, now=now, lease_seconds=LEASE, alone=True) is not None
    now += timedelta(seconds=LEASE + 1)
    assert store.expired_leases(now=now, max_recovery_attempts=2) == ([], [eid])
    failed = store.get(eid)
    assert failed is not None and failed.state is S.FAILED
    assert failed.error is not None and "poison pill" in failed.error and "3 times" in failed.error


def test_a_death_beside_other_runs_quarantines_uncharged_and_only_a_death_alone_is_charged(
    store: SqlWorkflowStore,
) -> None:
    eid = start(store).execution_id
    now = START
    # Claimed beside other runs, twice: each death requeues it quarantined, never charged.
    for recoveries in (1, 2):
        claimed = store.claim(eid, now=now, lease_seconds=LEASE)
        assert claimed is not None and claimed.isolation == (None if recoveries == 1 else "quarantined")
        now += timedelta(seconds=LEASE + 1)
        assert store.expired_leases(now=now, max_recovery_attempts=1) == ([eid], [])
        requeued = store.get(eid)
        assert requeued is not None and requeued.recovery_count == recoveries
        assert requeued.charged_recoveries == 0 and requeued.isolation == Isolation.QUARANTINED.value
    # Its worker runs it alone: from then on a death is charged.
    claimed = store.claim(eid, now=now, lease_seconds=LEASE)
    assert claimed is not None and claimed.lease_token is not None
    assert store.run_alone(eid, claimed.lease_token, now=now, lease_seconds=LEASE)
    assert not store.run_alone(eid, "not-the-token", now=now, lease_seconds=LEASE)
    now += timedelta(seconds=LEASE + 1)
    assert store.expired_leases(now=now, max_recovery_attempts=1) == ([eid], [])
    charged = store.get(eid)
    assert charged is not None and charged.charged_recoveries == 1 and charged.recovery_count == 3
    # A claim never inherits an earlier claim's "alone": claimed beside others, it is not charged.
    claimed = store.claim(eid, now=now, lease_seconds=LEASE)
    assert claimed is not None and claimed.isolation == Isolation.QUARANTINED.value
    now += timedelta(seconds=LEASE + 1)
    assert store.expired_leases(now=now, max_recovery_attempts=1) == ([eid], [])
    # Alone again, past the limit: a poison pill.
    assert store.claim(eid, now=now, lease_seconds=LEASE, alone=True) is not None
    now += timedelta(seconds=LEASE + 1)
    assert store.expired_leases(now=now, max_recovery_attempts=1) == ([], [eid])
    failed = store.get(eid)
    assert failed is not None and failed.state is S.FAILED and failed.charged_recoveries == 1


def test_enforce_timeouts_once_ends_overdue_open_executions(store: SqlWorkflowStore) -> None:
    deadline = START + timedelta(minutes=10)
    pending = start(store, deadline=deadline)
    running = start(store, deadline=deadline)
    later = start(store, deadline=deadline + timedelta(hours=1))
    done = start(store, deadline=deadline)
    store.claim(running.execution_id, now=START, lease_seconds=LEASE)
    close(store, done, S.COMPLETED)
    assert store.enforce_timeouts_once(now=deadline) == []
    ended = store.enforce_timeouts_once(now=deadline + timedelta(seconds=1))
    assert sorted(ended) == sorted([pending.execution_id, running.execution_id])
    for eid in ended:
        timed_out = store.get(eid)
        assert (
            timed_out is not None and timed_out.state is S.TIMED_OUT and "deadline" in (timed_out.error or "")
        )
    assert store.get(later.execution_id).state is S.PENDING  # type: ignore[union-attr]
    assert store.get(done.execution_id).state is S.COMPLETED  # type: ignore[union-attr]


def test_listing_filters_and_pages_newest_first(store: SqlWorkflowStore) -> None:
    made = []
    for i in range(5):
        execution, _ = store.start("refund" if i % 2 else "ship", i, now=START + timedelta(seconds=i))
        made.append(execution)
    close(store, made[3], S.FAILED)
    ids = [e.execution_id for e in store.list_executions()]
    assert ids == [e.execution_id for e in reversed(made)]
    first_page = store.list_executions(limit=2)
    last = first_page[-1]
    second_page = store.list_executions(limit=2, cursor=(last.created_at, last.execution_id))
    assert [e.execution_id for e in first_page + second_page] == ids[:4]
    assert [e.input for e in store.list_executions(name="refund")] == [3, 1]
    assert [e.input for e in store.list_executions(name="refund", state=S.PENDING)] == [1]


def test_concurrent_terminal_transitions_land_once_and_run_the_hooks_once(store: SqlWorkflowStore) -> None:
    ran: list[ExecutionState] = []
    store.hooks.register(lambda conn, execution: ran.append(execution.state))
    execution = start(store)
    states = [S.COMPLETED, S.FAILED, S.CANCELLED, S.TERMINATED, S.TIMED_OUT] * 2
    barrier = threading.Barrier(len(states))
    landed: list[Execution | None] = []

    def end(state: ExecutionState) -> None:
        barrier.wait()
        landed.append(store.finish(execution.execution_id, state, output=1, error="e", now=START))

    threads = [threading.Thread(target=end, args=(state,)) for state in states]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [e for e in landed if e is not None]
    assert len(landed) == len(states) and len(winners) == 1
    assert ran == [winners[0].state]
    assert store.get(execution.execution_id) == winners[0]


def test_a_checkpoint_racing_a_terminate_waits_for_it_and_is_refused(store: SqlWorkflowStore) -> None:
    execution = start(store)
    claimed = store.claim(execution.execution_id, now=START, lease_seconds=LEASE)
    assert claimed is not None and claimed.lease_token is not None
    token = claimed.lease_token
    results: list[bool] = []

    def checkpoint() -> None:
        results.append(store.record_step(execution.execution_id, token, 0, "a", output=1, now=START))

    racer = threading.Thread(target=checkpoint)
    with store.engine.begin() as conn:
        assert store.finish(execution.execution_id, S.TERMINATED, error="stop", now=START, conn=conn)
        racer.start()
        racer.join(0.5)
        # The checkpoint waits for the terminate's transaction instead of slipping in beside it.
        assert racer.is_alive()
    racer.join(10)
    assert results == [False]
    assert store.list_steps(execution.execution_id) == []


@pytest.mark.postgres
def test_claims_and_ends_find_their_rows_by_primary_key_on_a_table_without_statistics(
    request: pytest.FixtureRequest,
) -> None:
    # Just after TRUNCATE (a new deployment, a test, a benchmark) the planner has no statistics,
    # guesses that one row is pending, and would walk a state index over every pending run for
    # each claim or end. Those statements name their rows by id and test whether they are
    # pending: their plans must reach rows by primary key whatever the statistics say. (A
    # statement about a running run alone may take a state index: the running runs are as many
    # as the workers run at once.)
    store = workflow_store(request, "postgres")
    engine = store.db.engine
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE harvest_workflow_executions CASCADE")
    started = store.start_many("refund", [{"n": n} for n in range(3000)], now=START)
    ids = [e.execution_id for e in started[:9]]
    statements: list[tuple[str, object]] = []

    def capture(conn: object, cursor: object, statement: str, params: object, *_: object) -> None:
        if statement.lstrip().upper().startswith("UPDATE HARVEST_WORKFLOW_EXECUTIONS"):
            statements.append((statement, params))

    sa.event.listen(engine, "before_cursor_execute", capture)
    try:
        one = store.claim(ids[0], now=START, lease_seconds=LEASE)
        assert one is not None
        assert len(store.claim_many(ids[1:8], now=START, lease_seconds=LEASE)) == 7
        assert store.finish(ids[0], S.COMPLETED, output=1, now=START, token=one.lease_token) is not None
        assert store.finish(ids[8], S.CANCELLED, error="x", now=START) is not None  # a pending one
    finally:
        sa.event.remove(engine, "before_cursor_execute", capture)
    assert len(statements) == 4
    with engine.connect() as conn:
        for statement, params in statements:
            plan = "\n".join(row[0] for row in conn.exec_driver_sql("EXPLAIN " + statement, params))  # type: ignore[arg-type]
            assert "pk_harvest_workflow_executions" in plan, f"{statement}\n{plan}"
            assert "ix_harvest_workflow_executions" not in plan, f"{statement}\n{plan}"
