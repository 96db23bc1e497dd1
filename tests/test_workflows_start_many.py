"""Starting many runs in one call: one transaction and one enqueue, the runs in the order of the
inputs, and one bad input starting none; on SQLite and PostgreSQL, over shards, and on RQ."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import ExecutionState, Harvest, get_engine, workflow_service
from flask_harvest.errors import InvalidFieldError, StoreError
from flask_harvest.jobs.rq import RqBackend
from flask_harvest.shards import shard_for_key
from flask_harvest.worker import HarvestWorker
from flask_harvest.workflows import InputTooLargeError, SqlWorkflowStore, WorkflowContext
from flask_harvest.workflows.errors import UnknownWorkflowError
from flask_harvest.workflows.sharded import ShardedWorkflowStore

from .pipeline import close_later
from .shard_support import pg_shards
from .workflow_app import (  # noqa: F401 (fixtures)
    app_fixture,
    database_url_fixture,
    make_workflow_app,
    wait_for,
)
from .workflow_support import SQL_KINDS, START, workflow_store

__all__ = ["pg_shards"]

S = ExecutionState


@pytest.fixture(params=SQL_KINDS)
def store(request: pytest.FixtureRequest) -> SqlWorkflowStore:
    return workflow_store(request, request.param)


def test_the_store_starts_every_input_in_order_each_with_a_new_key(store: SqlWorkflowStore) -> None:
    runs = store.start_many("refund", [{"n": n} for n in range(5)], now=START)
    assert [run.input for run in runs] == [{"n": n} for n in range(5)]
    assert all(run.state is S.PENDING and run.created_at == START for run in runs)
    assert len({run.workflow_id for run in runs}) == len({run.execution_id for run in runs}) == 5
    for run in runs:
        assert store.get(run.execution_id) == run
    assert store.start_many("refund", [], now=START) == []


@pytest.mark.parametrize(
    ("inputs", "error"),
    [
        ([1, {"bad": object()}], InvalidFieldError),  # not JSON
        ([1, "x" * 200], InputTooLargeError),
        ("not a list", InvalidFieldError),
        ({"n": 1}, InvalidFieldError),
    ],
)
def test_one_bad_input_starts_none(store: SqlWorkflowStore, inputs: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        store.start_many("refund", inputs, now=START, max_input_bytes=100)
    assert store.list_executions(limit=10) == []


def test_a_key_that_has_an_open_run_starts_none(store: SqlWorkflowStore) -> None:
    open_run, _ = store.start("refund", 1, "order-1", now=START)
    with pytest.raises(StoreError, match="could not start workflow executions"):
        store.start_many("refund", [2, 3], ["order-2", "order-1"], now=START)
    assert [run.execution_id for run in store.list_executions(limit=10)] == [open_run.execution_id]
    with pytest.raises(InvalidFieldError, match="workflow_ids"):
        store.start_many("refund", [2, 3], ["order-2"], now=START)


def test_the_service_starts_and_queues_every_run_which_completes(app: Flask) -> None:
    with app.app_context():
        handles = workflow_service().start_many("three_steps", list(range(6)))
        assert len({handle.execution_id for handle in handles}) == 6
    for handle in handles:
        wait_for(app, handle.execution_id, lambda state, steps: state is S.COMPLETED)
    with app.app_context():
        assert [workflow_service().get(h.execution_id).input for h in handles] == list(range(6))


def test_the_service_refuses_before_storing_anything(app: Flask) -> None:
    with app.app_context():
        service = workflow_service()
        with pytest.raises(UnknownWorkflowError):
            service.start_many("no_such_workflow", [1])
        with pytest.raises(InputTooLargeError):  # the app caps inputs at 1000 bytes
            service.start_many("echo", [1, "x" * 2000])
        assert service.store.list_executions(limit=10) == []


def test_runs_started_together_land_on_the_shard_their_key_routes_to(pg_shards: list[str]) -> None:
    app = make_workflow_app(pg_shards[0], HARVEST_WORKFLOW_SHARDS=pg_shards)
    with app.app_context():
        service = workflow_service()
        store = service.store
        assert isinstance(store, ShardedWorkflowStore)
        with pytest.raises(InvalidFieldError):  # checked before any shard stores a run
            store.start_many("echo", [*range(20), {"bad": object()}], now=START)
        assert store.count_executions(cap=100) == 0
        handles = service.start_many("echo", list(range(20)))
    for handle in handles:
        wait_for(app, handle.execution_id, lambda state, steps: state is S.COMPLETED)
    with app.app_context():
        runs = [workflow_service().get(handle.execution_id) for handle in handles]
    assert [run.output for run in runs] == list(range(20))
    shards = {shard_for_key(run.workflow_id, 3) for run in runs}
    assert shards == {0, 1, 2}, "twenty new keys reach every one of three shards"
    for run in runs:
        assert run.execution_id.startswith(f"s{shard_for_key(run.workflow_id, 3)}-")


@pytest.mark.redis
def test_on_rq_the_runs_are_queued_in_one_call_and_a_worker_runs_them(
    tmp_path: Path, redis_url: str, redis_conn: redis.Redis
) -> None:
    app = Flask("harvest_test")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=f"sqlite:///{tmp_path / 'app.db'}",
        HARVEST_JOBS_BACKEND="rq",
        HARVEST_REDIS_URL=redis_url,
    )
    harvest = Harvest(app, SQLAlchemy(app))
    close_later(app)

    @harvest.workflow("double")
    def double(ctx: WorkflowContext, value: Any) -> Any:
        return ctx.step("double", lambda: value * 2)

    backend = get_engine(app).backend
    assert isinstance(backend, RqBackend)
    with app.app_context():
        handles = harvest.start_many("double", list(range(10)))
        # Fewer RQ jobs than runs: the backend carries several runs per job.
        assert 0 < len(backend.queue) < 10
        HarvestWorker([backend.queue], connection=backend.connection, app=app).work(burst=True)
        assert [handle.result(timeout=30) for handle in handles] == [n * 2 for n in range(10)]
