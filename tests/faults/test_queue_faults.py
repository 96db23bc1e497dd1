"""Workflow queues under real workers: ``flask harvest worker`` processes (RQ, the group's own
Redis, PostgreSQL) claiming the runs of ``queue_app.py``'s queues, some SIGKILLed on the way.

* 3 workers, a queue of concurrency 4 whose runs have a key limit of 1, 200 runs, two workers
  killed and replaced: a separate connection sampling the running runs never sees more than 4 in
  the queue nor 2 of a key, every run completes, and each key's runs started in priority order;
* a queue of concurrency 1 started in priority order by 2 workers;
* a rate limit held across processes.
"""

from __future__ import annotations

import random
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_harvest import ExecutionState, workflow_service
from flask_harvest.workflows import Execution, SqlWorkflowStore

from ..pipeline import close_later
from . import queue_app
from .conftest import FaultEnv, Worker, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]
TIME_LIMIT_SECONDS = 240

S = ExecutionState
APP_SPEC = "tests.faults.queue_app:create_app"
CONFIG: dict[str, Any] = {
    "HARVEST_WORKFLOW_LEASE_SECONDS": 4,
    "HARVEST_WORKFLOW_MAX_RECOVERY_ATTEMPTS": 5,
    # More threads per worker than the queue allows in all: the queue's limit is what holds.
    "HARVEST_WORKFLOW_CONCURRENCY": 4,
}
#: Generous: a liveness bound on a busy two-core machine, not a speed expectation.
DONE_WAIT = 150.0


@dataclass
class Queues:
    env: FaultEnv
    app: Flask

    def worker(self) -> Worker:
        return self.env.start_worker(app=APP_SPEC, concurrency=4)

    def start(self, name: str, value: Any, **fields: Any) -> str:
        with self.app.app_context():
            handle, _ = workflow_service().start(name, value, **fields)
        return handle.execution_id

    def runs(self, ids: list[str]) -> list[Execution]:
        with self.app.app_context():
            return [workflow_service().get(i) for i in ids]

    def wait_done(self, ids: list[str]) -> None:
        def described() -> str:
            return f"{len(ids)} runs: {Counter(e.state.value for e in self.runs(ids))}"

        wait_until(lambda: all(e.state is S.COMPLETED for e in self.runs(ids)), DONE_WAIT, described)

    def effect_count(self) -> int:
        with self.env.inspector.connect() as conn:
            query = sa.select(sa.func.count()).select_from(queue_app.effects_table)
            return int(conn.execute(query).scalar_one())


@pytest.fixture
def q(faults: FaultEnv) -> Iterator[Queues]:
    faults.config.update(CONFIG)
    SqlWorkflowStore(faults.engine).ensure_schema()
    queue_app.queue_metadata.create_all(faults.engine, checkfirst=True)
    with faults.engine.begin() as conn:
        tables = '"harvest_workflow_steps", "harvest_workflow_executions", "wf_queue_effects"'
        conn.exec_driver_sql(f"TRUNCATE {tables} RESTART IDENTITY")
    url = faults.database_url.render_as_string(hide_password=False)
    app = close_later(queue_app.make_app(faults.settings(), url))
    with app.app_context():
        yield Queues(faults, app)


@dataclass
class Sampler:
    """Samples the running runs of a queue, by key, from a connection of its own, in a loop."""

    engine: sa.Engine
    queue: str
    max_running: int = 0
    max_per_key: int = 0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _sample(self) -> None:
        query = sa.text(
            "SELECT concurrency_key, count(*) FROM harvest_workflow_executions "
            "WHERE queue_name = :q AND state = 'Running' GROUP BY concurrency_key"
        )
        with self.engine.connect() as conn:
            while not self._stop.is_set():
                rows = conn.execute(query, {"q": self.queue}).all()  # one statement: one snapshot
                conn.rollback()
                self.max_running = max(self.max_running, sum(n for _, n in rows))
                self.max_per_key = max([self.max_per_key, *(n for key, n in rows if key is not None)])
                self.samples += 1
                self._stop.wait(0.005)

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def first_start_order(runs: list[Execution]) -> list[Execution]:
    return sorted(runs, key=lambda e: (e.started_at, e.execution_id))


def test_limits_hold_across_killed_workers_and_every_run_completes(q: Queues) -> None:
    """Per queue at most ``concurrency`` runs Running, per (queue, key) at most its limit, with 3
    worker processes and SIGKILLs; every run completes; among runs waiting together, each key's
    runs start lower priority first."""
    rng = random.Random(20261204)
    ids = [
        q.start(
            "limited_job",
            {"n": n, "pause": 0.3 if n % 25 == 0 else 0.02},
            concurrency_key=f"key-{n % 12}",
            concurrency_limit=1,
            priority=rng.randint(0, 9),
        )
        for n in range(200)
    ]
    with Sampler(q.env.inspector, "limited") as sampler:
        workers = [q.worker() for _ in range(3)]
        for threshold in (40, 110):

            def has_started(at_least: int = threshold) -> bool:
                return q.effect_count() >= at_least

            wait_until(has_started, DONE_WAIT, f"{threshold} runs started")
            workers.pop(0).kill()
            workers.append(q.worker())
        q.wait_done(ids)
    runs = q.runs(ids)
    assert sampler.samples > 50
    assert sampler.max_running <= queue_app.LIMITED_CONCURRENCY
    assert sampler.max_per_key <= 1
    assert [e.output for e in runs] == list(range(200))
    by_key: dict[str | None, list[Execution]] = defaultdict(list)
    for run in first_start_order(runs):
        by_key[run.concurrency_key].append(run)
    for key, started in by_key.items():
        order = [(e.priority, e.created_at) for e in started]
        assert order == sorted(order), f"{key} started out of priority order"


def test_a_queue_of_one_starts_its_waiting_runs_in_priority_order(q: Queues) -> None:
    """Lower priority first, then older, among runs waiting together, with two workers."""
    priorities = [5, 1, 9, 1, 3, 7, 0, 3, 9, 2, 4, 6]
    ids = [q.start("serial_job", {"n": n}, priority=p) for n, p in enumerate(priorities)]
    for _ in range(2):
        q.worker()
    q.wait_done(ids)
    started = first_start_order(q.runs(ids))
    order = [(e.priority, e.created_at) for e in started]
    assert order == sorted(order)


def test_a_rate_limit_holds_across_worker_processes(q: Queues) -> None:
    """At most N first starts in any window of the period, whichever process claims them."""
    ids = [q.start("rated_job", {"n": n}) for n in range(9)]
    for _ in range(2):
        q.worker()
    q.wait_done(ids)
    limit, seconds = queue_app.RATE
    starts = sorted(e.started_at for e in q.runs(ids) if e.started_at is not None)
    assert len(starts) == 9
    for earlier, later in zip(starts, starts[limit:], strict=False):
        assert later - earlier >= timedelta(seconds=seconds)
