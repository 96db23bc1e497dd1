"""The benchmark's Flask app, as the deployment docs configure one: Flask-SQLAlchemy on PostgreSQL,
the SQL store, the ``rq`` backend and durable workflows (S8, S9, S10). Workers run it with::

    flask --app bench._app:create_app harvest worker --concurrency N

``BENCH_APP_CONFIG`` (a JSON object) adds or overrides config keys, e.g. a per-subscription cap;
a key given as ``null`` is removed, so the package's default applies (S9's default-settings rows).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import sqlalchemy as sa
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from flask_harvest import Harvest
from flask_harvest.workflows import WorkflowContext

from ._services import DATABASE_URL, REDIS_URL

CONFIG_ENV = "BENCH_APP_CONFIG"


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


#: Registered in the app module, as the docs say, so the harness and every worker know it.
# Without completion triggers: the workflow scenarios measure runs and callbacks, as before.
harvest = Harvest(db=db, triggers=False)
workflows = harvest
#: S8 and S9's workflow: three no-op steps (DBOS runs the same in ``bench._dbos_app``).
NOOP3 = "bench_noop3"


def noop_step(number: int) -> int:
    return number


def noop3(ctx: WorkflowContext, value: Any) -> Any:
    for number in range(3):
        ctx.step(f"step{number}", noop_step, number)
    return value


workflows.workflow(NOOP3)(noop3)
#: S9's longer workflow: ten no-op steps (DBOS runs the same in ``bench._dbos_app``).
NOOP10 = "bench_noop10"


@workflows.workflow(NOOP10)
def noop10(ctx: WorkflowContext, value: Any) -> Any:
    for number in range(10):
        ctx.step(f"step{number}", noop_step, number)
    return value


#: S18's queue (no queue-wide limit: its runs carry their key limits).
BENCH_QUEUE = "bench_queue"
workflows.queue(BENCH_QUEUE)

#: S17's fan-out: a parent starts ``children`` child runs of one no-op step and waits for each
#: (DBOS runs the same in ``bench._dbos_app``).
FANOUT_PARENT = "bench_fanout_parent"
FANOUT_CHILD = "bench_fanout_child"


@workflows.workflow(FANOUT_CHILD)
def fanout_child(ctx: WorkflowContext, value: Any) -> Any:
    return ctx.step("noop", noop_step, value)


@workflows.workflow(FANOUT_PARENT)
def fanout_parent(ctx: WorkflowContext, value: Any) -> Any:
    handles = [ctx.start_child(FANOUT_CHILD, number) for number in range(value["children"])]
    return sum(ctx.wait_child(handle) for handle in handles)


class Order(db.Model):  # type: ignore[name-defined,misc]
    """The application's own row, saved by S6's request transaction."""

    __tablename__ = "bench_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    reference: Mapped[str] = mapped_column(sa.String(64))
    total: Mapped[int]


def base_config() -> dict[str, Any]:
    return {
        "SQLALCHEMY_DATABASE_URI": DATABASE_URL,
        "HARVEST_JOBS_BACKEND": "rq",
        "HARVEST_REDIS_URL": REDIS_URL,
        # The receivers run on 127.0.0.1, which the SSRF policy refuses by default.
        "HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS": True,
        # The tuned workflow setting: 32 runs at once per worker, and a pool with a connection for
        # each and the worker's own three, as the deployment guide says (the default-settings rows
        # remove the concurrency key, and their default of 12 fits any pool of 15 or more).
        "HARVEST_WORKFLOW_CONCURRENCY": 32,
        "SQLALCHEMY_ENGINE_OPTIONS": {"pool_size": 5, "max_overflow": 30},
    }


def _configure(app: Flask, *layers: dict[str, Any] | None) -> None:
    """Apply config ``layers`` in order; a ``None`` value removes its key (the default applies)."""
    for layer in layers:
        for key, value in (layer or {}).items():
            if value is None:
                app.config.pop(key, None)
            else:
                app.config[key] = value


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask("bench")
    _configure(app, base_config(), json.loads(os.environ.get(CONFIG_ENV, "{}")), config)
    db.init_app(app)
    harvest.init_app(app)
    return app


# -- S10: workflows with completion callbacks ------------------------------------------------------


@workflows.workflow("bench_callback")
def bench_callback(ctx: WorkflowContext, number: int) -> dict[str, Any]:
    """Ends at once; ``sent_at`` is read just before the terminal transition commits."""
    return {"n": number, "sent_at": time.time()}


def workflow_config() -> dict[str, Any]:
    return {
        "HARVEST_COMPLETION_CALLBACK_ALLOWLIST": "127.0.0.1",
        "HARVEST_COMPLETION_CALLBACK_ALLOW_PRIVATE_TARGETS": True,
        "HARVEST_COMPLETION_CALLBACK_SECRET": "bench-completion-callback-secret",
    }


def create_workflow_app(config: dict[str, Any] | None = None) -> Flask:
    """The app with workflows and completion callbacks; workers run it as
    ``flask --app bench._app:create_workflow_app harvest worker``."""
    app = Flask("bench_workflows")
    _configure(app, base_config(), workflow_config(), json.loads(os.environ.get(CONFIG_ENV, "{}")), config)
    db.init_app(app)
    harvest.init_app(app)
    return app
