"""Workflow queues on SQLite and PostgreSQL: concurrency, concurrency keys, priority and rate
limits, enforced by the store's queued claim, and how the runner's jobs drive queued runs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from flask_harvest.errors import ConfigurationError, InvalidFieldError
from flask_harvest.workflows import (
    Execution,
    ExecutionState,
    SqlWorkflowStore,
    WorkflowContext,
    WorkflowRegistry,
    WorkflowRunner,
)
from flask_harvest.workflows.errors import UnknownQueueError
from flask_harvest.workflows.queues import QueueSpec, QueueTable, StartQueue, parse_queue_settings

from .workflow_support import SQL_KINDS, Clock, Scheduled, workflow_store

S = ExecutionState
LEASE = 30.0


@pytest.fixture(params=SQL_KINDS)
def store(request: pytest.FixtureRequest) -> SqlWorkflowStore:
    return workflow_store(request, request.param)


def put(
    store: SqlWorkflowStore,
    clock: Clock,
    queue: str = "q",
    *,
    key: str | None = None,
    limit: int | None = None,
    priority: int = 0,
    label: str = "",
) -> Execution:
    placement = StartQueue(queue, key, limit if limit is not None or key is None else 1, priority)
    execution, _ = store.start("job", {"label": label}, now=clock(), queue=placement)
    return execution


def claim(store: SqlWorkflowStore, spec: QueueSpec, clock: Clock, count: int = 1) -> list[Execution]:
    return store.claim_queued(spec, count=count, clock=clock, lease_seconds=LEASE).claimed


def labels(executions: list[Execution]) -> list[str]:
    return [e.input["label"] for e in executions]


def running(store: SqlWorkflowStore) -> list[Execution]:
    return store.list_executions(state=S.RUNNING)


def test_a_queue_runs_at_most_its_concurrency(store: SqlWorkflowStore) -> None:
    """Per queue at most ``concurrency`` runs are Running; a run's end frees its slot."""
    clock = Clock()
    spec = QueueSpec("q", concurrency=2)
    for i in range(5):
        put(store, clock, label=str(i))
    first = claim(store, spec, clock, count=5)
    assert len(first) == 2
    assert claim(store, spec, clock) == []
    store.finish(first[0].execution_id, S.COMPLETED, now=clock())
    assert len(claim(store, spec, clock, count=5)) == 1
    assert len(running(store)) == 2


def test_lower_priority_runs_first_then_older(store: SqlWorkflowStore) -> None:
    """Among due Pending runs of a queue, lower priority first, then older next_run_at."""
    clock = Clock()
    spec = QueueSpec("q")
    for label, priority in [("late-5", 5), ("a-1", 1), ("b-3", 3), ("c-1", 1)]:
        put(store, clock, priority=priority, label=label)
        clock.advance(seconds=1)
    order = [labels(claim(store, spec, clock)) for _ in range(4)]
    assert order == [["a-1"], ["c-1"], ["b-3"], ["late-5"]]


def test_a_concurrency_key_limits_its_runs(store: SqlWorkflowStore) -> None:
    """Per (queue, concurrency_key) at most ``concurrency_limit`` runs are Running; a better run
    whose key is full is passed over for the next eligible one."""
    clock = Clock()
    spec = QueueSpec("q", concurrency=10)
    put(store, clock, key="a", label="a1")
    clock.advance(seconds=1)
    put(store, clock, key="a", label="a2")
    clock.advance(seconds=1)
    put(store, clock, key="b", limit=2, label="b1")
    clock.advance(seconds=1)
    put(store, clock, key="b", limit=2, label="b2")
    clock.advance(seconds=1)
    put(store, clock, label="free")
    got = claim(store, spec, clock, count=10)
    assert labels(got) == ["a1", "b1", "b2", "free"]
    a1 = next(e for e in got if e.input["label"] == "a1")
    store.finish(a1.execution_id, S.COMPLETED, now=clock())
    assert labels(claim(store, spec, clock, count=10)) == ["a2"]


def test_the_same_key_in_another_queue_does_not_count(store: SqlWorkflowStore) -> None:
    """A concurrency key counts the running runs of its own queue only."""
    clock = Clock()
    put(store, clock, "q1", key="k")
    put(store, clock, "q2", key="k")
    assert len(claim(store, QueueSpec("q1"), clock)) == 1
    assert len(claim(store, QueueSpec("q2"), clock)) == 1


def test_a_rate_limit_counts_first_starts_in_its_window(store: SqlWorkflowStore) -> None:
    """At most N first starts per period per queue; the claim says when the window frees one."""
    clock = Clock()
    spec = QueueSpec("q", rate_limit=(2, 10.0))
    for i in range(5):
        put(store, clock, label=str(i))
        clock.advance(seconds=0.001)
    first = store.claim_queued(spec, count=5, clock=clock, lease_seconds=LEASE)
    assert len(first.claimed) == 2
    assert first.retry_at == clock() + timedelta(seconds=10)
    clock.advance(seconds=9)
    assert claim(store, spec, clock) == []
    clock.advance(seconds=1.5)
    assert len(claim(store, spec, clock, count=5)) == 2


def test_a_rate_limit_does_not_hold_back_a_run_that_wakes(store: SqlWorkflowStore) -> None:
    """A run waking from a durable sleep had its start already: the rate limit does not count it."""
    clock = Clock()
    spec = QueueSpec("q", rate_limit=(1, 60.0))
    put(store, clock, label="sleeper")
    clock.advance(seconds=0.5)
    put(store, clock, label="other")
    (sleeper,) = claim(store, spec, clock)
    assert sleeper.input["label"] == "sleeper"
    assert sleeper.lease_token is not None
    assert store.suspend(sleeper.execution_id, sleeper.lease_token, wake_at=clock() + timedelta(seconds=1))
    clock.advance(seconds=2)
    assert labels(claim(store, spec, clock, count=2)) == ["sleeper"]


def test_a_queued_run_is_not_claimed_by_its_id(store: SqlWorkflowStore) -> None:
    """The claim by id (unqueued runs) leaves queued runs to their queue's claim."""
    clock = Clock()
    queued = put(store, clock)
    plain, _ = store.start("job", None, now=clock())
    assert store.claim(queued.execution_id, now=clock(), lease_seconds=LEASE) is None
    claimed = store.claim_many([queued.execution_id, plain.execution_id], now=clock(), lease_seconds=LEASE)
    assert [e.execution_id for e in claimed] == [plain.execution_id]


def test_queue_counts_are_bounded(store: SqlWorkflowStore) -> None:
    clock = Clock()
    for _ in range(4):
        put(store, clock)
    claim(store, QueueSpec("q"), clock)
    counts = store.queue_counts("q", now=clock(), cap=2)
    assert (counts.running, counts.waiting, counts.due) == (1, 2, 2)
    assert store.queue_counts("q", now=clock(), cap=100).waiting == 3


# -- the runner --------------------------------------------------------------------------------


class Harness:
    def __init__(self, store: SqlWorkflowStore, **queues: QueueSpec) -> None:
        self.store = store
        self.registry = WorkflowRegistry()
        self.clock = Clock()
        self.scheduled = Scheduled()
        self.runner = WorkflowRunner(
            store,
            self.registry,
            self.scheduled,
            lease_seconds=LEASE,
            heartbeat_interval=0,
            clock=self.clock,
            wait=lambda _: None,
            queues=QueueTable(queues),
        )
        store.hooks.register(self.runner.queue_driver.on_terminal)

    def workflow(self, name: str, fn: Callable[[WorkflowContext, Any], Any], **kw: Any) -> None:
        self.registry.workflow(name, **kw)(fn)

    def jobs(self) -> list[str]:
        ids = [execution_id for execution_id, _ in self.scheduled.calls]
        self.scheduled.calls.clear()
        return ids


def test_a_start_into_an_unknown_queue_is_refused(store: SqlWorkflowStore) -> None:
    """An unknown queue name is a clear error (422), and nothing is stored."""
    h = Harness(store, q=QueueSpec("q"))
    h.workflow("job", lambda ctx, x: x)
    with pytest.raises(UnknownQueueError, match="no queue named 'nope'") as raised:
        h.runner.start("job", None, queue="nope")
    assert raised.value.http_status == 422
    h.workflow("bound", lambda ctx, x: x, queue="missing")
    with pytest.raises(UnknownQueueError):
        h.runner.start("bound", None)
    assert store.list_executions() == []


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("queue", {"queue": ""}),
        ("queue", {"queue": "x" * 256}),
        ("concurrency_key", {"queue": "q", "concurrency_key": ""}),
        ("concurrency_key", {"queue": "q", "concurrency_key": "a\x00b"}),
        ("concurrency_limit", {"queue": "q", "concurrency_key": "k", "concurrency_limit": 0}),
        ("concurrency_limit", {"queue": "q", "concurrency_limit": 2}),
        ("concurrency_key", {"concurrency_key": "k"}),
        ("priority", {"priority": 10**7}),
        ("priority", {"priority": True}),
        ("priority", {"priority": 1.5}),
    ],
)
def test_bad_queue_fields_are_refused(store: SqlWorkflowStore, field: str, kwargs: dict[str, Any]) -> None:
    h = Harness(store, q=QueueSpec("q"))
    h.workflow("job", lambda ctx, x: x)
    with pytest.raises(InvalidFieldError) as raised:
        h.runner.start("job", None, **kwargs)
    assert raised.value.field == field
    assert store.list_executions() == []


def test_a_start_takes_the_workflows_queue_and_priority_unless_overridden(store: SqlWorkflowStore) -> None:
    h = Harness(store, q=QueueSpec("q"), other=QueueSpec("other"))
    h.workflow("job", lambda ctx, x: x, queue="q", priority=5)
    default, _ = h.runner.start("job", None)
    assert (default.queue_name, default.priority, default.concurrency_key) == ("q", 5, None)
    chosen, _ = h.runner.start("job", None, queue="other", concurrency_key="c-42", priority=-1)
    assert (chosen.queue_name, chosen.priority) == ("other", -1)
    assert (chosen.concurrency_key, chosen.concurrency_limit) == ("c-42", 1)


def test_a_job_runs_the_best_eligible_run_of_its_queue(store: SqlWorkflowStore) -> None:
    """A job for a queued run claims the best eligible due run of its queue, maybe another; once
    it ends, the same thread claims the queue's next run (no job's round trip)."""
    h = Harness(store, q=QueueSpec("q", concurrency=1))
    order: list[str] = []

    def job(ctx: WorkflowContext, x: Any) -> Any:
        order.append(x)
        return x

    h.workflow("job", job, queue="q")
    low, _ = h.runner.start("job", "low", priority=9)
    h.clock.advance(seconds=1)
    high, _ = h.runner.start("job", "high", priority=0)
    h.jobs()
    ended = h.runner.run(low.execution_id)
    assert ended is not None and ended.execution_id == high.execution_id
    assert order == ["high", "low"]
    assert store.get(low.execution_id).state is S.COMPLETED  # type: ignore[union-attr]
    assert h.jobs() == []


def test_a_queued_run_ended_elsewhere_gives_its_queue_an_attempt(store: SqlWorkflowStore) -> None:
    """A queued run's end outside its runner (a terminate) queues a claim attempt after commit."""
    h = Harness(store, q=QueueSpec("q", concurrency=1))
    h.workflow("job", lambda ctx, x: x, queue="q")
    first, _ = h.runner.start("job", 1)
    h.clock.advance(seconds=1)
    second, _ = h.runner.start("job", 2)
    claim(store, QueueSpec("q"), h.clock)
    h.jobs()
    store.terminate(first.execution_id, now=h.clock())
    assert h.jobs() == [second.execution_id]


def test_a_queued_run_that_sleeps_frees_its_slot(store: SqlWorkflowStore) -> None:
    """A run that sleeps releases its queue slot while asleep: another run of the queue runs."""
    h = Harness(store, q=QueueSpec("q", concurrency=1))

    def sleeper(ctx: WorkflowContext, x: Any) -> Any:
        ctx.sleep(60)
        return x

    h.workflow("sleeper", sleeper, queue="q")
    h.workflow("job", lambda ctx, x: x, queue="q")
    asleep, _ = h.runner.start("sleeper", None)
    h.clock.advance(seconds=1)
    other, _ = h.runner.start("job", "other")
    h.jobs()
    assert h.runner.run(asleep.execution_id) is None
    assert store.get(asleep.execution_id).state is S.PENDING  # type: ignore[union-attr]
    # The slot it freed went to the other run, on the same thread.
    assert store.get(other.execution_id).state is S.COMPLETED  # type: ignore[union-attr]
    h.clock.advance(seconds=61)
    assert h.runner.run(asleep.execution_id) is not None


def test_a_run_of_a_full_queue_waits_for_a_slot(store: SqlWorkflowStore) -> None:
    """A job finding its queue full does nothing: its run stays Pending for a later attempt."""
    h = Harness(store, q=QueueSpec("q", concurrency=1))
    h.workflow("job", lambda ctx, x: x, queue="q")
    first, _ = h.runner.start("job", 1)
    h.clock.advance(seconds=1)
    second, _ = h.runner.start("job", 2)
    (claimed,) = claim(store, QueueSpec("q"), h.clock)
    assert h.runner.run(second.execution_id) is None
    assert store.get(second.execution_id).state is S.PENDING  # type: ignore[union-attr]
    assert claimed.execution_id == first.execution_id


def test_a_rate_limited_job_schedules_its_next_attempt(store: SqlWorkflowStore) -> None:
    h = Harness(store, q=QueueSpec("q", rate_limit=(1, 30.0)))
    h.workflow("job", lambda ctx, x: x, queue="q")
    first, _ = h.runner.start("job", 1)
    h.clock.advance(seconds=1)
    second, _ = h.runner.start("job", 2)
    h.scheduled.calls.clear()
    assert h.runner.run(first.execution_id) is not None
    h.scheduled.calls.clear()
    assert h.runner.run(second.execution_id) is None
    assert h.scheduled.calls == [(second.execution_id, h.clock() + timedelta(seconds=30))]


def test_queue_settings_are_checked() -> None:
    specs = parse_queue_settings('{"emails": {"concurrency": 4, "rate_limit": [10, 1.5]}}', key="K")
    assert specs == {"emails": QueueSpec("emails", 4, (10, 1.5))}
    assert parse_queue_settings({"plain": None}, key="K") == {"plain": QueueSpec("plain")}
    for bad in ["[1]", "{", '{"q": {"concurrency": 0}}', '{"q": {"speed": 1}}', '{"q": {"rate_limit": [1]}}']:
        with pytest.raises(ConfigurationError, match="K"):
            parse_queue_settings(bad, key="K")


def test_a_declared_queue_is_checked() -> None:
    registry = WorkflowRegistry()
    with pytest.raises(ConfigurationError):
        registry.queue("q", concurrency=-1)
    with pytest.raises(ConfigurationError):
        registry.queue("q", rate_limit=(1, float("inf")))
    with pytest.raises(ConfigurationError):
        registry.workflow("w", priority=10**9)
    assert registry.queue("q", concurrency=3).concurrency == 3
    # The settings' queues win over the code's.
    table = QueueTable({"q": QueueSpec("q", 1)}, declared=registry.queues)
    assert table.require("q").concurrency == 1


def test_the_sweep_gives_a_queue_as_many_attempts_as_it_has_room_for(store: SqlWorkflowStore) -> None:
    """The backstop for lost claim attempts: the due scan leaves queued runs out, and the queue
    sweep queues jobs for the best waiting runs, as many as the queue has free slots."""
    h = Harness(store, q=QueueSpec("q", concurrency=3))
    h.workflow("job", lambda ctx, x: x, queue="q")
    ids = []
    for n in range(5):
        ids.append(h.runner.start("job", n, priority=5 - n)[0].execution_id)
        h.clock.advance(seconds=1)
    (running,) = claim(store, QueueSpec("q"), h.clock)
    assert running.execution_id == ids[4]
    h.jobs()
    h.clock.advance(seconds=10)
    report = h.runner.sweep_once()
    assert sorted(h.jobs()) == sorted([ids[3], ids[2]])
    assert report.requeued == 2


def test_a_stopping_runner_claims_no_next_run(store: SqlWorkflowStore) -> None:
    """While the runner closes (a worker stopping), a thread that ends a queued run does not go on
    with the queue's next run: the queue gets a job instead, for the next worker."""
    h = Harness(store, q=QueueSpec("q", concurrency=1))

    def job(ctx: object, x: int) -> int:
        h.runner._closing.set()  # what close() sets while it waits for the runs under way
        return x

    h.workflow("job", job, queue="q")
    first, _ = h.runner.start("job", 1)
    h.clock.advance(seconds=1)
    second, _ = h.runner.start("job", 2)
    h.jobs()
    try:
        assert h.runner.run(first.execution_id) is not None
    finally:
        h.runner._closing.clear()
    assert store.get(second.execution_id).state is S.PENDING  # type: ignore[union-attr]
    assert h.jobs() == [second.execution_id]


@pytest.mark.parametrize(
    ("spec", "key", "allowed"),
    [
        (QueueSpec("q", concurrency=2), None, 2),
        (QueueSpec("q"), "k", 1),
        (QueueSpec("q", rate_limit=(3, 60.0)), None, 3),
    ],
)
def test_concurrent_claims_never_both_take_the_last_slot(
    store: SqlWorkflowStore, spec: QueueSpec, key: str | None, allowed: int
) -> None:
    """A queue's claims are serialised: claimers racing on many connections take exactly what the
    limit allows, never one more."""
    clock = Clock()
    for n in range(20):
        put(store, clock, key=key, label=str(n))
    barrier = threading.Barrier(8)
    taken: list[int] = []
    errors: list[BaseException] = []

    def claimer() -> None:
        try:
            barrier.wait(timeout=30)
            taken.append(len(claim(store, spec, clock, count=3)))
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=claimer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert sum(taken) == allowed
    assert len(running(store)) == allowed
