"""The app of the metrics tests that run a real ``flask harvest worker``: webhooks, workflows,
completion callbacks and a guarded completion trigger on one database and the rq backend. The
worker loads :func:`create_app`; the test builds the web app with :func:`build`, the same app."""

from __future__ import annotations

import os
from typing import Any

from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import CompletionTrigger, Harvest
from flask_harvest.triggers.conditions import GreaterThan
from flask_harvest.workflows import WorkflowContext

TOKEN = "metrics-worker-token-0123456789"
#: Runs of ``echo`` with an amount above 1000 start ``three_steps``; the others are skipped.
BIG_ORDERS = CompletionTrigger("echo", "three_steps", condition=GreaterThan("amount", 1000))


def create_app() -> Flask:
    """The worker's app, on ``TEST_DATABASE_URL`` and ``TEST_REDIS_URL``."""
    return build(os.environ["TEST_DATABASE_URL"], os.environ["TEST_REDIS_URL"])


def build(database_url: str, redis_url: str) -> Flask:
    """The app on ``database_url`` and ``redis_url``, its metrics open to :data:`TOKEN`."""
    app = Flask("metrics_worker_app")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=database_url,
        HARVEST_JOBS_BACKEND="rq",
        HARVEST_REDIS_URL=redis_url,
        HARVEST_METRICS=True,
        HARVEST_ACTUATOR_TOKEN=TOKEN,
        HARVEST_SWEEP_INTERVAL_SECONDS=0.5,
        HARVEST_WEBHOOKS_MAX_ATTEMPTS=1,
        HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS=True,  # the receiver is on 127.0.0.1
        HARVEST_COMPLETION_CALLBACK_ALLOWLIST="127.0.0.1",
        HARVEST_COMPLETION_CALLBACK_ALLOW_PRIVATE_TARGETS=True,
        HARVEST_COMPLETION_CALLBACK_SECRET="metrics-callback-secret-0123456789",
    )
    harvest = Harvest(db=SQLAlchemy(app))
    harvest.completion_triggers([BIG_ORDERS])

    @harvest.workflow("echo")
    def echo(ctx: WorkflowContext, value: Any) -> Any:
        return value

    @harvest.workflow("three_steps")
    def three_steps(ctx: WorkflowContext, value: Any) -> Any:
        return [ctx.step(f"step_{n}", lambda n=n: n * 10) for n in (1, 2, 3)]

    @harvest.workflow("boom")
    def boom(ctx: WorkflowContext, value: Any) -> Any:
        raise ValueError("boom")

    harvest.init_app(app)
    return app
