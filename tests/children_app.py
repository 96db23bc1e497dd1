"""A Flask app with parent and child workflows, for the child-run tests of the HTTP API, the CLI,
the dashboard and the completion callbacks and triggers on cascaded runs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import CompletionTrigger, Harvest
from flask_harvest.workflows import WorkflowContext

from .pipeline import close_later
from .workflow_app import TOKEN


def _register(harvest: Harvest) -> None:
    @harvest.workflow("child_echo")
    def child_echo(ctx: WorkflowContext, value: Any) -> Any:
        return value

    @harvest.workflow("child_slow")
    def child_slow(ctx: WorkflowContext, value: Any) -> Any:
        ctx.sleep(timedelta(hours=1))
        return value

    @harvest.workflow("family")
    def family(ctx: WorkflowContext, value: Any) -> Any:
        # value: {"count": n, "child": name, "policy": policy, "wait": bool}
        handles = [
            ctx.start_child(
                value.get("child", "child_echo"), n, parent_close_policy=value.get("policy", "Terminate")
            )
            for n in range(value.get("count", 3))
        ]
        if not value.get("wait", True):
            ctx.sleep(timedelta(hours=1))
        return [handle.result() for handle in handles]


def make_children_app(
    database_url: str, *, triggers: list[CompletionTrigger] | None = None, **config: Any
) -> Flask:
    """The app on ``database_url``, its API open to :data:`~.workflow_app.TOKEN`."""
    app = Flask("harvest_children_test")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=database_url,
        HARVEST_ACTUATOR_TOKEN=TOKEN,
        HARVEST_WORKFLOW_RESULT_MAX_WAIT_SECONDS=20,
        HARVEST_SWEEP_INTERVAL_SECONDS=3600,
    )
    app.config.update(config)
    db = SQLAlchemy(app)
    try:
        harvest = Harvest(db=db)
        harvest.completion_triggers(triggers or [])
        _register(harvest)
        harvest.init_app(app)
    except BaseException:
        with app.app_context():
            db.engine.dispose()
        raise
    return close_later(app)
