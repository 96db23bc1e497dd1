"""The app the workflow-queue fault tests run: in every ``flask harvest worker`` and in the test
process (``--app tests.faults.queue_app:create_app``), configured like ``workflow_app.py``.

Every run records its start in ``wf_queue_effects`` with the process that ran it, so a test knows
which worker to kill.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import sqlalchemy as sa
from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import Harvest
from flask_harvest.workflows import WorkflowContext

queue_metadata = sa.MetaData()
effects_table = sa.Table(
    "wf_queue_effects",
    queue_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("execution_id", sa.String(64), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
)

#: The limits the tests check.
LIMITED_CONCURRENCY = 4
RATE = (3, 2.0)

db = SQLAlchemy()
harvest = Harvest(db=db)
harvest.queue("limited", concurrency=LIMITED_CONCURRENCY)
harvest.queue("serial", concurrency=1)
harvest.queue("rated", rate_limit=RATE)


def effect(execution_id: str, pause: float) -> int:
    with db.engine.begin() as conn:
        conn.execute(effects_table.insert().values(execution_id=execution_id, pid=os.getpid()))
    time.sleep(pause)  # long enough for runs to overlap, and for a kill to land inside some
    return os.getpid()


@harvest.workflow("limited_job", queue="limited")
def limited_job(ctx: WorkflowContext, value: Any) -> Any:
    ctx.step("work", effect, ctx.execution_id, value.get("pause", 0.05))
    return value["n"]


@harvest.workflow("serial_job", queue="serial")
def serial_job(ctx: WorkflowContext, value: Any) -> Any:
    ctx.step("work", effect, ctx.execution_id, 0.0)
    return value["n"]


@harvest.workflow("rated_job", queue="rated")
def rated_job(ctx: WorkflowContext, value: Any) -> Any:
    ctx.step("work", effect, ctx.execution_id, 0.0)
    return value["n"]


def make_app(config: dict[str, Any], database_url: str) -> Flask:
    app = Flask("faults_queues")
    app.config.update(config)
    app.config["SQLALCHEMY_DATABASE_URI"] = database_url
    app.config["SQLALCHEMY_ENGINE_OPTIONS"] = {"pool_size": 4, "max_overflow": 8}
    db.init_app(app)
    harvest.init_app(app)
    with app.app_context():
        queue_metadata.create_all(db.engine, checkfirst=True)
    return app


def create_app() -> Flask:
    logging.basicConfig(
        level="WARNING", format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("flask_harvest").setLevel(os.environ.get("FAULTS_LOG_LEVEL", "INFO"))
    return make_app(json.loads(os.environ["FAULTS_CONFIG"]), os.environ["FAULTS_DATABASE_URL"])
