"""An app with scheduled workflows, for the schedule tests and their ``flask harvest worker``
subprocesses (``create_app`` reads ``TEST_DATABASE_URL``, ``TEST_REDIS_URL`` and the JSON
``TEST_HARVEST_CONFIG``, as :mod:`tests.worker_process` sets them)."""

from __future__ import annotations

import json
import os
from typing import Any

from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import Harvest
from flask_harvest.workflows import WorkflowContext

#: The admin API's token (imports nothing of the test suite: a worker subprocess loads this module).
TOKEN = "test-schedule-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

#: Every second: the schedule of the multi-worker tests.
EVERY_SECOND = "* * * * * *"
#: Every night at three: a schedule whose tick never falls during a test.
NIGHTLY = "0 0 3 * * *"


def register(harvest: Harvest, *, every_second: bool = True) -> None:
    if every_second:

        @harvest.workflow("heartbeat", schedule=EVERY_SECOND)
        def heartbeat(ctx: WorkflowContext, value: Any) -> Any:
            return ctx.step("record", lambda: value["scheduled_at"])

    @harvest.workflow("nightly", schedule=NIGHTLY)
    def nightly(ctx: WorkflowContext, value: Any) -> Any:
        return value


def make_app(database_url: str, *, every_second: bool = True, **config: Any) -> Flask:
    """An app on ``database_url`` with the schedules above, its admin API open to ``TOKEN``."""
    app = Flask("harvest_schedule_test")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=database_url,
        HARVEST_ACTUATOR_TOKEN=TOKEN,
        HARVEST_SWEEP_INTERVAL_SECONDS=3600,  # the tests sweep by hand, unless a worker does
    )
    app.config.update(config)
    db = SQLAlchemy(app)
    harvest = Harvest(db=db)
    register(harvest, every_second=every_second)
    harvest.init_app(app)
    return app


def create_app() -> Flask:
    """The worker subprocess's app: RQ on ``TEST_REDIS_URL``, swept every 0.25 s."""
    config: dict[str, Any] = {
        "HARVEST_JOBS_BACKEND": "rq",
        "HARVEST_REDIS_URL": os.environ["TEST_REDIS_URL"],
        "HARVEST_SWEEP_INTERVAL_SECONDS": 0.25,
        **json.loads(os.environ.get("TEST_HARVEST_CONFIG", "{}")),
    }
    return make_app(os.environ["TEST_DATABASE_URL"], **config)
