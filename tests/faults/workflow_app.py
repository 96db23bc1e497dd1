"""The app the workflow fault tests run: in every ``flask harvest worker`` and in the test process.

Workers load it with ``--app tests.faults.workflow_app:create_app``; their settings come from the
environment (``FAULTS_CONFIG``, ``FAULTS_DATABASE_URL``), the test process passes them to
:func:`make_app`. Every step writes its side effect to ``wf_fault_effects`` (with the id of the
process that ran it, to know which worker to kill), so a test counts how often each step really ran.
A *held* step waits until the test raises a flag in ``wf_fault_flags``: a worker stays inside it for
as long as the test needs (to kill it, cancel or terminate the run).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import Harvest, get_engine
from flask_harvest.workflows import Execution, ExecutionState, WorkflowContext

#: The tables of the side effects, outside the harvest metadata.
fault_metadata = sa.MetaData()
effects_table = sa.Table(
    "wf_fault_effects",
    fault_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("execution_id", sa.String(64), nullable=False),
    sa.Column("label", sa.String(100), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
)
flags_table = sa.Table("wf_fault_flags", fault_metadata, sa.Column("name", sa.String(200), primary_key=True))

#: How long a held step waits for its flag at most (a backstop: the tests raise it much sooner).
HOLD_LIMIT_SECONDS = 90.0
#: The deadline of the workflows registered with a timeout.
TIMEOUT = timedelta(seconds=6)

db = SQLAlchemy()
workflows = Harvest(db=db)


def _engine() -> sa.Engine:
    return db.engine


def effect(execution_id: str, label: str) -> str:
    """Record one run of the side effect ``label`` of ``execution_id``; return the label."""
    with _engine().begin() as conn:
        conn.execute(effects_table.insert().values(execution_id=execution_id, label=label, pid=os.getpid()))
    return label


def release_flag(execution_id: str) -> str:
    return f"release-{execution_id}"


def hold(execution_id: str, label: str) -> str:
    """Record ``label:start``, wait until the test releases the run, then record ``label``."""
    effect(execution_id, f"{label}:start")
    flag = release_flag(execution_id)
    end = time.monotonic() + HOLD_LIMIT_SECONDS
    while time.monotonic() < end:
        with _engine().connect() as conn:
            if conn.execute(sa.select(flags_table.c.name).where(flags_table.c.name == flag)).first():
                return effect(execution_id, label)
        time.sleep(0.05)
    raise TimeoutError(f"{label} of {execution_id} was never released")


@workflows.workflow("five_steps")
def five_steps(ctx: WorkflowContext, value: Any) -> Any:
    """Five steps; the third is held when the input asks for it (to kill its worker in it)."""
    eid = ctx.execution_id
    done = [ctx.step("s1", effect, eid, "s1"), ctx.step("s2", effect, eid, "s2")]
    done.append(ctx.step("s3", hold, eid, "s3") if value.get("hold") else ctx.step("s3", effect, eid, "s3"))
    done += [ctx.step("s4", effect, eid, "s4"), ctx.step("s5", effect, eid, "s5")]
    return {"steps": done, "n": value["n"]}


@workflows.workflow("napper")
def napper(ctx: WorkflowContext, value: Any) -> Any:
    """A step, a durable sleep of ``value["sleep"]`` seconds, a step."""
    eid = ctx.execution_id
    before = ctx.step("before", effect, eid, "before")
    ctx.sleep(timedelta(seconds=value["sleep"]))
    return [before, ctx.step("after", effect, eid, "after"), value["n"]]


@workflows.workflow("held")
def held(ctx: WorkflowContext, value: Any) -> Any:
    """A step, a held step, a step: to cancel or terminate while the held one runs."""
    eid = ctx.execution_id
    one = ctx.step("one", effect, eid, "one")
    two = ctx.step("two", hold, eid, "two")
    return [one, two, ctx.step("three", effect, eid, "three")]


@workflows.workflow("sleeps_past_deadline", timeout=TIMEOUT)
def sleeps_past_deadline(ctx: WorkflowContext, value: Any) -> Any:
    ctx.step("before", effect, ctx.execution_id, "before")
    ctx.sleep(timedelta(minutes=10))
    return ctx.step("after", effect, ctx.execution_id, "after")


@workflows.workflow("busy_past_deadline", timeout=TIMEOUT)
def busy_past_deadline(ctx: WorkflowContext, value: Any) -> Any:
    """A step that outlasts the deadline (it is held until the test saw the run time out)."""
    ctx.step("busy", hold, ctx.execution_id, "busy")
    return ctx.step("after", effect, ctx.execution_id, "after")


@workflows.workflow("relay")
def relay(ctx: WorkflowContext, value: Any) -> Any:
    """A step, then continue as new with ``n`` plus one until ``n`` reaches ``until``."""
    ctx.step("tick", effect, ctx.execution_id, "tick")
    if value["n"] < value["until"]:
        ctx.continue_as_new({"n": value["n"] + 1, "until": value["until"]})
    return value["n"]


#: While this flag is raised, a worker that continues a run as new kills itself in the transaction.
KILL_IN_CONTINUE = "kill-in-continue"


def kill_in_continue(conn: sa.Connection, execution: Execution) -> None:
    """A terminal hook: SIGKILL this process inside the transaction that closes a run
    ``ContinuedAsNew``, while the test's flag is raised (read in that same transaction)."""
    if execution.state is not ExecutionState.CONTINUED_AS_NEW:
        return
    if conn.execute(sa.select(flags_table.c.name).where(flags_table.c.name == KILL_IN_CONTINUE)).first():
        print(f"killing {os.getpid()} inside the continue-as-new of {execution.execution_id}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


@workflows.workflow("poison")
def poison(ctx: WorkflowContext, value: Any) -> Any:
    """Kills the worker running it, every time (a poison pill)."""
    ctx.step("fine", effect, ctx.execution_id, "fine")

    def crash() -> None:
        effect(ctx.execution_id, "crash")
        os.kill(os.getpid(), signal.SIGKILL)

    ctx.step("crash", crash)
    return "unreachable"


def make_app(config: dict[str, Any], database_url: str) -> Flask:
    """The app on ``database_url`` with ``config`` (the ``HARVEST_*`` settings)."""
    app = Flask("faults_workflows")
    app.config.update(config)
    app.config["SQLALCHEMY_DATABASE_URI"] = database_url
    # A small pool per process: the group shares one PostgreSQL server with other test runs.
    app.config["SQLALCHEMY_ENGINE_OPTIONS"] = {"pool_size": 4, "max_overflow": 8}
    db.init_app(app)
    workflows.init_app(app)
    with app.app_context():
        fault_metadata.create_all(db.engine, checkfirst=True)
    return app


def create_app() -> Flask:
    """The worker's app (``flask --app tests.faults.workflow_app:create_app harvest worker``)."""
    level = os.environ.get("FAULTS_LOG_LEVEL", "INFO")
    logging.basicConfig(
        level="WARNING", format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("flask_harvest").setLevel(level)
    app = make_app(json.loads(os.environ["FAULTS_CONFIG"]), os.environ["FAULTS_DATABASE_URL"])
    # Only in workers: the test process never runs a workflow.
    service = get_engine(app).workflows
    if service is not None:
        service.hooks.register(kill_in_continue)
    return app
