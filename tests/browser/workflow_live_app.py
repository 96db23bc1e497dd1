"""The app of the workflow browser tests, imported by the test process and by its
``flask harvest worker`` subprocess alike (so both know the same workflows): Flask-SQLAlchemy on
``TEST_DATABASE_URL``, RQ on ``TEST_REDIS_URL``, workflows, completion callbacks and triggers."""

from __future__ import annotations

import os
import time
from typing import Any

from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import Harvest
from flask_harvest.workflows import WorkflowContext

#: Settings of the web app and the worker: one callback attempt, so a failure fails at once.
SETTINGS: dict[str, Any] = {
    "HARVEST_JOBS_BACKEND": "rq",
    "HARVEST_SWEEP_INTERVAL_SECONDS": 0.5,
    "HARVEST_COMPLETION_CALLBACK_ALLOWLIST": "127.0.0.1",
    "HARVEST_COMPLETION_CALLBACK_ALLOW_PRIVATE_TARGETS": True,  # the receiver is on 127.0.0.1
    "HARVEST_COMPLETION_CALLBACK_SECRET": "browser-callback-secret-0123456789",
    "HARVEST_COMPLETION_CALLBACK_MAX_ATTEMPTS": 1,
}
#: Steps of a ``long_running`` run: it runs for about a minute unless cancelled.
TICKS = 600


def register(workflows: Harvest) -> None:
    @workflows.workflow("long_running")
    def long_running(ctx: WorkflowContext, value: Any) -> Any:
        for n in range(TICKS):
            ctx.step(f"tick_{n}", _tick, n)
        return "finished"

    @workflows.workflow("import_orders")
    def import_orders(ctx: WorkflowContext, value: Any) -> Any:
        fetched = ctx.step("fetch", lambda: {"orders": 3, "source": value})
        ctx.step("store", lambda: fetched["orders"])
        return {
            "imported": fetched["orders"],
            "region": value.get("region") if isinstance(value, dict) else None,
        }

    @workflows.workflow("send_report")
    def send_report(ctx: WorkflowContext, value: Any) -> Any:
        return ctx.step("render", lambda: {"report": value})


def _tick(n: int) -> int:
    time.sleep(0.1)
    return n


def create_app(**config: Any) -> Flask:
    app = Flask("dashboard_workflow_app")
    app.config.update(
        SETTINGS,
        SQLALCHEMY_DATABASE_URI=os.environ["TEST_DATABASE_URL"],
        HARVEST_REDIS_URL=os.environ["TEST_REDIS_URL"],
    )
    app.config.update(config)
    db = SQLAlchemy(app)
    workflows = Harvest(db=db)
    register(workflows)
    workflows.init_app(app)
    return app
