"""Workflows on Redis Queue: real Redis, a real RQ worker in this process, SQLite."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import ExecutionState, Harvest, get_engine
from flask_harvest.jobs.rq import RqBackend
from flask_harvest.webhooks.delivery import WEBHOOK_JOB
from flask_harvest.worker import HarvestWorker
from flask_harvest.workflows import WorkflowContext
from flask_harvest.workflows.runner import WORKFLOW_JOB

from .pipeline import close_later

pytestmark = pytest.mark.redis


def test_a_workflow_job_outlives_the_job_timeout_meant_for_webhook_attempts(
    tmp_path: Path, redis_url: str, redis_conn: redis.Redis
) -> None:
    app = Flask("harvest_test")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=f"sqlite:///{tmp_path / 'app.db'}",
        HARVEST_JOBS_BACKEND="rq",
        HARVEST_REDIS_URL=redis_url,
    )
    db = SQLAlchemy(app)
    workflows = Harvest(app, db)
    close_later(app)

    def slow_step(ctx: WorkflowContext, value: Any) -> Any:
        def slow() -> str:
            time.sleep(2.5)  # longer than the webhook job timeout below
            return "done"

        return ctx.step("slow", slow)

    workflows.workflow("slow_step")(slow_step)

    backend = get_engine(app).backend
    assert isinstance(backend, RqBackend)
    # As if webhook attempts had a 1 s deadline: RQ kills a webhook job after 1 s.
    backend.job_timeout = 1
    assert backend.timeout_for(WEBHOOK_JOB) == 1
    assert backend.timeout_for(WORKFLOW_JOB) == -1  # none: the lease and heartbeat protect it
    with app.app_context():
        handle = workflows.start("slow_step", None)
        HarvestWorker([backend.queue], connection=backend.connection, app=app).work(burst=True)
        # The job hands the run to the runner's threads in this process: wait for its end.
        handle.result(timeout=30)
        execution = workflows.get(handle.execution_id)
    # Killed by RQ's SIGALRM, the step would have failed with JobTimeoutException.
    assert execution.state is ExecutionState.COMPLETED, execution.error
    assert execution.output == "done"
