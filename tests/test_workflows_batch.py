"""How a worker runs workflow jobs in batches, on SQLite and PostgreSQL (and real Redis and RQ):
one statement claims a batch, the runner's threads run it, a checkpoint renews the lease in its own
transaction, and a workflow job takes the workflow jobs queued behind it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
import redis
from rq import Queue, SimpleWorker
from rq.job import Job

from flask_harvest import get_engine, workflow_service
from flask_harvest.jobs.base import JobKinds, JobRef
from flask_harvest.jobs.local import LocalBackend
from flask_harvest.jobs.rq import RqBackend
from flask_harvest.jobs.tasks import running_kinds
from flask_harvest.workflows import (
    Execution,
    ExecutionState,
    SqlWorkflowStore,
    WorkflowContext,
    WorkflowRegistry,
    WorkflowRunner,
)
from flask_harvest.workflows.runner import WORKFLOW_JOB, workflow_job

from .workflow_app import (  # noqa: F401 (database_url_fixture: a fixture)
    database_url_fixture,
    gate,
    make_workflow_app,
    state_of,
    wait_in_step,
)
from .workflow_support import SQL_KINDS, START, Clock, Scheduled, workflow_store

S = ExecutionState
LEASE = 30.0


@pytest.fixture(params=SQL_KINDS)
def store(request: pytest.FixtureRequest) -> SqlWorkflowStore:
    return workflow_store(request, request.param)


def started(store: SqlWorkflowStore, count: int) -> list[Execution]:
    return [store.start("refund", {"n": n}, now=START)[0] for n in range(count)]


# -- the store ---------------------------------------------------------------------------------


def test_claim_many_claims_only_due_pending_runs_each_as_its_first_claim(store: SqlWorkflowStore) -> None:
    fresh, running, ended, later = started(store, 4)
    assert store.claim(running.execution_id, now=START, lease_seconds=LEASE) is not None
    store.finish(ended.execution_id, S.TERMINATED, error="stop", now=START)
    store.claim(later.execution_id, now=START, lease_seconds=LEASE)
    token = store.get(later.execution_id).lease_token  # type: ignore[union-attr]
    assert store.suspend(later.execution_id, token or "", wake_at=START + timedelta(minutes=5))

    ids = [later.execution_id, ended.execution_id, fresh.execution_id, running.execution_id, "absent"]
    claimed = store.claim_many([*ids, fresh.execution_id], now=START, lease_seconds=LEASE)

    assert [e.execution_id for e in claimed] == [fresh.execution_id]
    (run,) = claimed
    assert run.state is S.RUNNING and run.attempt == 1 and run.lease_token
    assert run.lease_expires_at == START + timedelta(seconds=LEASE)
    # Claimed once: a second batch with the same id finds it running.
    assert store.claim_many([fresh.execution_id], now=START, lease_seconds=LEASE) == []
    assert store.claim_many([], now=START, lease_seconds=LEASE) == []


def test_claim_many_of_overlapping_batches_gives_each_run_to_one_caller(store: SqlWorkflowStore) -> None:
    ids = [e.execution_id for e in started(store, 12)]
    won: list[list[str]] = []
    barrier = threading.Barrier(4)

    def claim(order: list[str]) -> None:
        barrier.wait()
        won.append([e.execution_id for e in store.claim_many(order, now=START, lease_seconds=LEASE)])

    threads = [threading.Thread(target=claim, args=(ids[n:] + ids[:n],)) for n in (0, 3, 6, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(i for batch in won for i in batch) == sorted(ids)


def test_a_checkpoint_renews_the_lease_and_reports_a_cancel_request(store: SqlWorkflowStore) -> None:
    (execution,) = started(store, 1)
    claimed = store.claim(execution.execution_id, now=START, lease_seconds=LEASE)
    assert claimed is not None and claimed.lease_token is not None
    later = START + timedelta(seconds=20)

    lease = store.checkpoint(
        execution.execution_id, claimed.lease_token, 0, "a", output=1, now=later, lease_seconds=LEASE
    )
    assert lease is not None and not lease.cancel_requested
    assert store.get(execution.execution_id).lease_expires_at == later + timedelta(seconds=LEASE)  # type: ignore[union-attr]

    store.request_cancel(execution.execution_id, "withdrawn", now=later)
    lease = store.checkpoint(
        execution.execution_id, claimed.lease_token, 1, "b", output=2, now=later, lease_seconds=LEASE
    )
    assert lease is not None and lease.cancel_requested and lease.cancel_reason == "withdrawn"
    assert [s.output for s in store.list_steps(execution.execution_id)] == [1, 2]


def test_a_checkpoint_lands_only_under_the_lease_and_once_per_position(store: SqlWorkflowStore) -> None:
    (execution,) = started(store, 1)
    eid = execution.execution_id
    claimed = store.claim(eid, now=START, lease_seconds=LEASE)
    assert claimed is not None and claimed.lease_token is not None
    token = claimed.lease_token

    assert store.checkpoint(eid, "stolen", 0, "a", output=1, now=START, lease_seconds=LEASE) is None
    assert store.checkpoint(eid, token, 0, "a", output=1, now=START, lease_seconds=LEASE) is not None
    assert store.checkpoint(eid, token, 0, "a", output=9, now=START, lease_seconds=LEASE) is None
    store.terminate(eid, "stop", now=START)
    assert store.checkpoint(eid, token, 1, "b", output=2, now=START, lease_seconds=LEASE) is None
    assert [(s.seq, s.output) for s in store.list_steps(eid)] == [(0, 1)]
    ended = store.get(eid)
    assert ended is not None and ended.state is S.TERMINATED and ended.lease_expires_at is None


# -- the runner --------------------------------------------------------------------------------


class Contexts:
    """A context factory that counts how many runs are inside one, per thread."""

    def __init__(self) -> None:
        self.entered = 0
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            self.entered += 1
            self.threads.add(threading.current_thread().name)
        yield


def batch_runner(store: SqlWorkflowStore, contexts: Contexts, concurrency: int = 4) -> WorkflowRunner:
    registry = WorkflowRegistry()

    @registry.workflow("three")
    def three(ctx: WorkflowContext, value: Any) -> Any:
        return [ctx.step(f"s{n}", lambda n=n: n * value) for n in range(3)]

    @registry.workflow("fails")
    def fails(ctx: WorkflowContext, value: Any) -> Any:
        raise RuntimeError("no")

    return WorkflowRunner(
        store,
        registry,
        Scheduled(),
        lease_seconds=LEASE,
        heartbeat_interval=0,
        concurrency=concurrency,
        context=contexts,
        clock=Clock(),
    )


def wait_until_idle(runner: WorkflowRunner) -> None:
    """Wait until every run handed to ``runner`` has ended, slept or stopped."""
    deadline = time.monotonic() + 60
    while runner.free_slots() < runner.concurrency:
        assert time.monotonic() < deadline, "the runs handed over never ended"
        time.sleep(0.01)


def test_submit_many_runs_a_batch_on_the_runner_threads_each_in_a_context_of_its_own(
    store: SqlWorkflowStore,
) -> None:
    contexts = Contexts()
    runner = batch_runner(store, contexts)
    ids = [runner.start("three", n)[0].execution_id for n in range(6)]
    failing, _ = runner.start("fails", None)
    try:
        runner.submit_many([*ids[:3], failing.execution_id])
        runner.submit_many(ids[3:])
        # Before close(): a stopping runner gives back the runs that have not begun yet.
        wait_until_idle(runner)
    finally:
        runner.close()
    for n, execution_id in enumerate(ids):
        done = store.get(execution_id)
        assert done is not None and done.state is S.COMPLETED and done.output == [0, n, 2 * n]
    failed = store.get(failing.execution_id)
    assert failed is not None and failed.state is S.FAILED and failed.error == "RuntimeError: no"
    assert contexts.entered == 2 + 7  # each batch's claim, each run
    assert contexts.threads and all(name.startswith("harvest-workflow") for name in contexts.threads)


def test_submit_many_leaves_runs_it_could_not_claim_and_reschedules_an_early_one(
    store: SqlWorkflowStore,
) -> None:
    contexts = Contexts()
    runner = batch_runner(store, contexts)
    backend = runner.backend
    assert isinstance(backend, Scheduled)
    asleep, _ = runner.start("three", 1)
    claimed = store.claim(asleep.execution_id, now=START, lease_seconds=LEASE)
    assert claimed is not None and claimed.lease_token is not None
    wake = START + timedelta(minutes=1)
    store.suspend(asleep.execution_id, claimed.lease_token, wake_at=wake)
    backend.calls.clear()

    runner.submit_many([asleep.execution_id, "absent"])
    runner.close()
    assert contexts.entered == 1  # the claim's, and no run
    assert backend.calls == [(asleep.execution_id, wake)]
    assert store.get(asleep.execution_id).state is S.PENDING  # type: ignore[union-attr]


def test_run_many_waits_for_every_run_of_the_batch(store: SqlWorkflowStore) -> None:
    contexts = Contexts()
    runner = batch_runner(store, contexts, concurrency=3)
    ids = [runner.start("three", n)[0].execution_id for n in range(5)]
    try:
        runner.run_many(ids)
        states = [store.get(i).state for i in ids]  # type: ignore[union-attr]
    finally:
        runner.close()
    assert states == [S.COMPLETED] * 5
    assert contexts.entered == 5


# -- the job seam ------------------------------------------------------------------------------


def test_job_kinds_keep_how_many_rows_a_job_takes() -> None:
    kinds = JobKinds()
    kinds.register("one", print)
    kinds.register("many", print, take=8)
    assert kinds.take("one") == 1 and kinds.take("many") == 8 and kinds.take("unknown") == 1
    assert kinds.with_handler("one", repr).take("many") == 8


def test_a_backend_says_whether_a_job_may_hand_its_rows_over(redis_conn: redis.Redis) -> None:
    assert RqBackend(redis_conn, "harvest-test-hand-off", job_timeout=60).allows_hand_off
    local = LocalBackend(print, workers=1)
    try:
        assert not local.allows_hand_off
    finally:
        local.close()


def test_the_local_backend_runs_a_workflow_job_to_its_end(database_url: str) -> None:
    # Its join() waits for the jobs it runs: a workflow job that handed its run to the runner's
    # threads and returned (it does when they have room for more) would let join() say done while
    # the run still waits in its step.
    app = make_workflow_app(database_url, HARVEST_WORKFLOW_CONCURRENCY=4)
    backend = get_engine(app).backend
    released = gate("local-job")
    with app.app_context():
        execution_id = workflow_service().start("gated", {"gate": "local-job"})[0].execution_id
    wait_in_step("local-job")
    assert not backend.join(timeout=0.3)
    released.set()
    assert backend.join(timeout=20)
    assert state_of(app, execution_id) is S.COMPLETED


class KindsWorker(SimpleWorker):
    def __init__(self, *args: Any, kinds: JobKinds, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kinds = kinds

    def execute_job(self, job: Job, queue: Queue) -> Any:
        with running_kinds(self.kinds):
            return super().execute_job(job, queue)


def test_a_workflow_job_takes_the_workflow_jobs_queued_behind_it(redis_conn: redis.Redis) -> None:
    backend = RqBackend(redis_conn, "harvest-test-take", job_timeout=60, batch_size=1)
    backend.queue.empty()  # type: ignore[no-untyped-call]
    calls: list[list[str]] = []
    kinds = JobKinds()
    kinds.register(WORKFLOW_JOB, lambda ids: calls.append(list(ids)), take=3)
    kinds.register("other", lambda ids: calls.append(["other", *ids]))
    # One job per row (batch_size 1), as separate starts queue them.
    for row in ("a", "b", "c", "d"):
        backend.enqueue([workflow_job(row)])
    backend.enqueue([workflow_job("e")])
    backend.enqueue([JobRef("other", "x")])
    KindsWorker([backend.queue], connection=redis_conn, kinds=kinds).work(burst=True)
    assert calls == [["a", "b", "c"], ["d", "e"], ["other", "x"]]
    assert backend.queue.count == 0


def test_a_checkpoint_without_renewal_leaves_the_row_unwritten_but_reads_it(store: SqlWorkflowStore) -> None:
    (execution,) = started(store, 1)
    eid = execution.execution_id
    claimed = store.claim(eid, now=START, lease_seconds=LEASE)
    assert claimed is not None and claimed.lease_token is not None
    later = START + timedelta(seconds=5)
    store.request_cancel(eid, "withdrawn", now=later)

    lease = store.checkpoint(eid, claimed.lease_token, 0, "a", output=1, now=later)
    assert lease is not None and lease.cancel_requested and lease.cancel_reason == "withdrawn"
    assert store.get(eid).lease_expires_at == claimed.lease_expires_at  # type: ignore[union-attr]
    store.terminate(eid, "stop", now=later)
    assert store.checkpoint(eid, claimed.lease_token, 1, "b", output=2, now=later) is None
    assert [s.seq for s in store.list_steps(eid)] == [0]


def test_a_run_renews_its_lease_at_a_checkpoint_only_after_a_third_of_it(store: SqlWorkflowStore) -> None:
    registry = WorkflowRegistry()
    clock = Clock()
    seen: list[Any] = []

    @registry.workflow("slow")
    def slow(ctx: WorkflowContext, value: Any) -> Any:
        def look() -> None:
            seen.append(store.get(ctx.execution_id).lease_expires_at)  # type: ignore[union-attr]

        ctx.step("a", look)
        clock.advance(seconds=LEASE / 3)
        ctx.step("b", look)
        ctx.step("c", look)
        return None

    runner = WorkflowRunner(
        store, registry, Scheduled(), lease_seconds=LEASE, heartbeat_interval=0, clock=clock
    )
    execution, _ = runner.start("slow", None)
    assert runner.run(execution.execution_id) is not None
    claimed_until = START + timedelta(seconds=LEASE)
    # a's checkpoint left the claim's lease; b's (a third later) renewed it.
    assert seen == [claimed_until, claimed_until, START + timedelta(seconds=LEASE / 3 + LEASE)]
