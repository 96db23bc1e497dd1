"""A Flask app with durable workflows on Flask-SQLAlchemy, for the HTTP API and CLI tests, and
their ``database_url`` and ``app`` fixtures (import ``database_url_fixture`` and ``app_fixture``
into the test module; named apart so that a test's ``app`` argument does not shadow an import).

The app's engines (Flask-SQLAlchemy's and the job backend) are closed by ``close_apps`` after each
test (the autouse fixture in ``conftest``), so no pooled connection outlives its test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import CompletionTrigger, Harvest, workflow_service
from flask_harvest.workflows import Execution, ExecutionState, WorkflowContext

from .pipeline import close_later
from .workflow_support import SQL_KINDS

TOKEN = "test-workflow-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PREFIX = "/api/harvest"

#: Gates that the ``gated`` workflow's step waits on, by the name in its input: an event the step
#: sets when it has begun, and the event it waits for.
GATES: dict[str, tuple[threading.Event, threading.Event]] = {}
#: How long a gated step waits for its gate at most, so a failing test cannot hang.
GATE_TIMEOUT = 20.0


def _register(workflows: Harvest) -> None:
    @workflows.workflow("echo")
    def echo(ctx: WorkflowContext, value: Any) -> Any:
        return value

    @workflows.workflow("three_steps")
    def three_steps(ctx: WorkflowContext, value: Any) -> Any:
        return [ctx.step(f"step_{n}", lambda n=n: n * 10) for n in (1, 2, 3)]

    @workflows.workflow("boom")
    def boom(ctx: WorkflowContext, value: Any) -> Any:
        raise ValueError(f"boom: {value}")

    @workflows.workflow("sleeper")
    def sleeper(ctx: WorkflowContext, value: Any) -> Any:
        ctx.sleep(timedelta(hours=1))
        return "woke"

    @workflows.workflow("hasty", timeout=timedelta(microseconds=1))
    def hasty(ctx: WorkflowContext, value: Any) -> Any:
        return value

    @workflows.workflow("gated")
    def gated(ctx: WorkflowContext, value: Any) -> Any:
        ctx.step("wait", lambda: _in_gate(value["gate"]))
        ctx.step("after", lambda: "after")
        return "done"


def _in_gate(name: str) -> bool:
    entered, released = GATES[name]
    entered.set()
    return released.wait(GATE_TIMEOUT)


def make_workflow_app(
    database_url: str,
    *,
    triggers: list[CompletionTrigger] | None = None,
    with_triggers: bool = True,
    **config: Any,
) -> Flask:
    """An app with the workflows above on ``database_url``, its API open to :data:`TOKEN`, and the
    static completion ``triggers``."""
    app = Flask("harvest_workflow_test")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=database_url,
        HARVEST_ACTUATOR_TOKEN=TOKEN,
        HARVEST_WORKFLOW_RESULT_MAX_WAIT_SECONDS=10,
        HARVEST_SWEEP_INTERVAL_SECONDS=3600,
    )
    app.config.update(config)
    db = SQLAlchemy(app)
    try:
        harvest = Harvest(db=db, triggers=with_triggers)
        harvest.completion_triggers(triggers or [])
        _register(harvest)
        harvest.init_app(app)
    except BaseException:
        with app.app_context():
            db.engine.dispose()
        raise
    return close_later(app)


@pytest.fixture(name="database_url", params=SQL_KINDS)
def database_url_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty database, a SQLite file or this session's PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'workflows.db'}"
    request.getfixturevalue("postgres_engine")  # empties the harvest tables
    url: sa.URL = request.getfixturevalue("postgres_url")
    return url.render_as_string(hide_password=False)


@pytest.fixture(name="app")
def app_fixture(database_url: str) -> Flask:
    """The workflow app on ``database_url``, its inputs capped at 1000 bytes."""
    return make_workflow_app(database_url, HARVEST_WORKFLOW_MAX_INPUT_BYTES=1000)


def gate(name: str) -> threading.Event:
    """A fresh gate for a ``gated`` run started with ``{"gate": name}``; set it to let the run go."""
    GATES[name] = (threading.Event(), threading.Event())
    return GATES[name][1]


def wait_in_step(name: str) -> None:
    """Wait until the ``gated`` run of gate ``name`` is inside its step (Running, mid-step)."""
    assert GATES[name][0].wait(GATE_TIMEOUT), f"the run of gate {name!r} never began its step"


def executions(app: Flask) -> list[Execution]:
    with app.app_context():
        page, _ = workflow_service().list_executions(limit=500)
    return page


def snapshot(app: Flask) -> Any:
    """Everything a request could change, to compare before and after a refused one."""
    with app.app_context():
        service = workflow_service()
        rows = executions(app)
        return [
            (
                e.execution_id,
                e.workflow_id,
                e.state.value,
                e.error,
                e.cancel_requested,
                len(service.steps(e.execution_id)),
            )
            for e in rows
        ]


def state_of(app: Flask, execution_id: str) -> ExecutionState:
    with app.app_context():
        return workflow_service().get(execution_id).state


def wait_for(app: Flask, execution_id: str, done: Callable[[ExecutionState, int], bool]) -> None:
    """Wait until ``done(state, number of steps)`` holds for the execution (at most 60 s: a loaded
    CI machine can take seconds to run a thread that is due)."""
    deadline = time.monotonic() + 60
    with app.app_context():
        service = workflow_service()
        while time.monotonic() < deadline:
            # Steps first: they only grow, so a state read after them is at least as new. Read
            # the other way round, a run not yet claimed could pass for one already given back.
            steps = len(service.steps(execution_id))
            execution = service.get(execution_id)
            if done(execution.state, steps):
                return
            time.sleep(0.01)
    raise AssertionError(f"execution {execution_id} never got there: {execution}")


def wait_asleep(app: Flask, execution_id: str) -> None:
    """Wait until a ``sleeper`` run has checkpointed its sleep and given its worker back."""
    wait_for(app, execution_id, lambda state, steps: state is ExecutionState.PENDING and steps == 1)
