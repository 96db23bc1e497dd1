"""An engine's lifetime: what ``close`` gives back, what one failing sweep step leaves to the others,
and what a forked child (gunicorn ``--preload``, a forking worker) must not inherit."""

from __future__ import annotations

import gc
import os
import signal
import struct
import threading
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.engine.events import ConnectionEvents

from flask_harvest import OutboundWebhookPlugin, WebhookSubscription, generate_secret, get_engine
from flask_harvest._threads import PerProcess
from flask_harvest.config import load_settings
from flask_harvest.engine import HarvestEngine, add_triggers, add_workflows, build_engine
from flask_harvest.errors import StoreError
from flask_harvest.sweeper import Sweeper, SweepError, SweepReport
from flask_harvest.triggers.store import SqlTriggerStore
from flask_harvest.webhooks.manager import Delegate
from flask_harvest.webhooks.models import DeliveryLog
from flask_harvest.webhooks.stores._schema import outbox_table
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore
from flask_harvest.workflows import SqlWorkflowStore, WorkflowContext, WorkflowRegistry

from .pipeline import close_later
from .workflow_support import SQL_KINDS

#: Events an engine-level listener can be registered for (``sqlalchemy.events.ConnectionEvents``).
ENGINE_EVENTS = [name for name in dir(ConnectionEvents) if not name.startswith("_")]
#: How long a forked child may take before it is taken for hung and killed: a guard so that a
#: child that deadlocks fails the test instead of hanging the run, never a measure of speed.
CHILD_HANG_GUARD_SECONDS = 60


def engine_listeners(engine: sa.Engine) -> int:
    """How many listeners are registered on ``engine`` for its connection events."""
    return sum(
        len(getattr(engine.dispatch, name)) for name in ENGINE_EVENTS if hasattr(engine.dispatch, name)
    )


def full_engine(
    database: sa.Engine, *, delegate: Delegate | None = None, workflows: bool = True, **options: Any
) -> HarvestEngine:
    """Webhooks, and workflows (with callbacks) and triggers, on ``database``, as the extension
    builds them; ``options`` are settings."""
    store = SqlOutboundWebhookStore(database)
    store.ensure_schema()
    engine = build_engine(load_settings({}, options), store, delegate=delegate)
    if not workflows:
        return engine
    workflow_store = SqlWorkflowStore(database)
    workflow_store.ensure_schema()
    add_workflows(engine, workflow_store, WorkflowRegistry())
    triggers = SqlTriggerStore(database)
    triggers.ensure_schema()
    add_triggers(engine, triggers)
    return engine


@pytest.fixture(params=SQL_KINDS)
def database(request: pytest.FixtureRequest) -> sa.Engine:
    """A SQL engine with the harvest tables present and empty, on each SQL backend."""
    engine: sa.Engine = request.getfixturevalue(f"{request.param}_engine")
    return engine


# -- close -----------------------------------------------------------------------------------------


def test_closing_engines_leaves_no_listener_on_a_shared_database_engine(database: sa.Engine) -> None:
    before = engine_listeners(database)
    for _ in range(5):
        full_engine(database).close()
    assert engine_listeners(database) == before


def test_close_removes_the_listeners_even_when_the_backend_fails_to_stop(database: sa.Engine) -> None:
    before = engine_listeners(database)
    engine = full_engine(database)

    def refuse() -> None:
        raise StoreError("could not stop")

    engine.backend.close = refuse  # type: ignore[method-assign]
    with pytest.raises(StoreError):
        engine.close()
    assert engine_listeners(database) == before


# -- one failing sweep step ------------------------------------------------------------------------


def test_every_step_runs_and_the_error_names_the_failed_ones() -> None:
    ran: list[str] = []
    sweeper = Sweeper()

    def step(name: str, report: SweepReport | None = None, error: Exception | None = None) -> None:
        def run() -> SweepReport:
            ran.append(name)
            if error is not None:
                raise error
            assert report is not None
            return report

        sweeper.add_step(name, run)

    step("a", error=RuntimeError("not a harvest error"))
    step("b", SweepReport(released=2))
    step("c", error=StoreError("database down"))
    step("d", SweepReport(requeued=3))
    with pytest.raises(SweepError) as caught:
        sweeper.sweep()
    assert ran == ["a", "b", "c", "d"]
    assert caught.value.failed == ("a", "c")
    assert (caught.value.report.released, caught.value.report.requeued) == (2, 3)
    assert isinstance(caught.value.__cause__, RuntimeError)
    # Only the type of a foreign error: its text may be anything (a URL, a credential).
    assert "not a harvest error" not in str(caught.value)
    assert "database down" in str(caught.value)


def test_a_delegate_error_in_the_outbox_relay_releases_its_claims_and_the_sweep_goes_on(
    database: sa.Engine,
) -> None:
    failing = [True]
    handed: list[str] = []

    def delegate(delivery: DeliveryLog, subscription: WebhookSubscription) -> None:
        if failing[0]:
            raise RuntimeError("the delegate's own bug")
        handed.append(delivery.id)

    engine = full_engine(database, delegate=delegate)
    try:
        engine.store.add_subscription(
            WebhookSubscription("https://example.com/hook", ["order.*"], generate_secret(), id="sub_a")
        )
        assert engine.workflows is not None

        @engine.workflows.registry.workflow("hasty", timeout=timedelta(microseconds=1))
        def hasty(ctx: WorkflowContext, value: Any) -> Any:
            return value

        with database.begin() as conn:
            # On a bare connection: nothing relays the message but the sweeper, and the run is
            # not queued, so only the sweep's workflow step can end it (its deadline has passed).
            message_id = engine.manager.dispatch_in_tx(conn, "order.created", {"ref": 1})
            engine.workflows.runner.start("hasty", None, conn=conn)

        with pytest.raises(SweepError) as caught:
            engine.sweep()
        assert caught.value.failed == ("outbox",)
        assert caught.value.report.timed_out == 1  # the workflow step after it ran

        with database.connect() as conn:
            row = conn.execute(sa.select(outbox_table).where(outbox_table.c.id == message_id)).one()
        assert (row.claim_token, row.claimed_until, row.relayed_at) == (None, None, None)
        assert row.last_error == "RuntimeError"

        # Released, not leased: the next relay takes it at once.
        failing[0] = False
        assert engine.manager.relay_outbox().relayed == 1
        assert len(handed) == 1
    finally:
        engine.close()


def test_flask_harvest_sweep_names_the_failed_step_and_exits_1(sqlite_engine: sa.Engine) -> None:
    def delegate(delivery: DeliveryLog, subscription: WebhookSubscription) -> None:
        raise RuntimeError("https://user:hunter2@example.com")

    store = SqlOutboundWebhookStore(sqlite_engine)
    app = close_later(Flask("sweep_cli"))
    OutboundWebhookPlugin(store, app, delegate=delegate)
    store.add_subscription(
        WebhookSubscription("https://example.com/hook", ["order.*"], generate_secret(), id="sub_a")
    )
    with app.app_context(), sqlite_engine.begin() as conn:
        get_engine().manager.dispatch_in_tx(conn, "order.created", {"ref": 1})
    result = app.test_cli_runner().invoke(args=["harvest", "sweep"])
    assert result.exit_code == 1
    assert "Error: sweep step(s) failed: outbox (RuntimeError)" in result.output
    assert "hunter2" not in result.output


# -- fork ------------------------------------------------------------------------------------------


def in_forked_child(work: Callable[[], int]) -> int:
    """Run ``work`` in a forked child and return the number it wrote back; fail if the child failed."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns that forking a process with threads may deadlock the child: that is
        # the case under test, and the child has its hang guard.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            signal.alarm(CHILD_HANG_GUARD_SECONDS)
            os.close(read_end)
            os.write(write_end, struct.pack("!q", work()))
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        data = os.read(read_end, 8)
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        pytest.fail(f"the forked child was killed by signal {os.WTERMSIG(status)} (it hung)")
    assert os.WEXITSTATUS(status) == 0, "the forked child failed"
    (value,) = struct.unpack("!q", data)
    return int(value)


def test_a_value_the_parent_was_building_when_it_forked_is_built_anew_in_the_child() -> None:
    entered, release = threading.Event(), threading.Event()
    builds: list[int] = []

    def build() -> int:
        builds.append(os.getpid())
        if len(builds) == 1:  # the parent's build: hold the lock until the child is forked
            entered.set()
            release.wait()
        return os.getpid()

    value = PerProcess(build)
    builder = threading.Thread(target=value.get)
    builder.start()
    try:
        entered.wait()
        # The child has no builder thread: the lock it held must not stay held in the child.
        child = in_forked_child(value.get)
    finally:
        release.set()
        builder.join()
    assert child not in (os.getpid(), 0)
    assert value.get() == os.getpid()


def test_a_forked_child_runs_workflows_on_threads_of_its_own(sqlite_engine: sa.Engine) -> None:
    engine = full_engine(sqlite_engine, workflow_concurrency=2)
    try:
        assert engine.workflows is not None
        runner = engine.workflows.runner
        done: list[int] = []

        @engine.workflows.registry.workflow("count")
        def count(ctx: WorkflowContext, value: Any) -> Any:
            done.append(value)
            return value

        def start_two() -> list[str]:
            with sqlite_engine.begin() as conn:  # not queued: this test runs them itself
                return [runner.start("count", n, conn=conn)[0].execution_id for n in (1, 2)]

        runner.run_many(start_two())  # the parent's runner threads exist now
        assert sorted(done) == [1, 2]
        waiting = start_two()

        def child() -> int:
            runner.run_many(waiting)  # on the parent's threads, which a child has not: it would hang
            return len(done)

        assert in_forked_child(child) == 4
        runner.run_many(waiting)  # the parent's threads still work (and the child ran the rows)
        assert len(done) == 2
    finally:
        engine.close()


@pytest.mark.postgres
def test_a_forked_child_never_uses_a_connection_its_preloading_parent_pooled(
    postgres_url: sa.URL,
) -> None:
    app = close_later(Flask("preloaded"))
    app.config["SQLALCHEMY_DATABASE_URI"] = postgres_url.render_as_string(hide_password=False)
    db = SQLAlchemy()
    db.init_app(app)
    OutboundWebhookPlugin.sql(db, app)  # creates the tables: a pooled connection of the parent
    with app.app_context():
        database = db.engine

    def backend_pid() -> int:
        with database.connect() as conn:
            return int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())

    def childs_backend_pid() -> int:
        pid = backend_pid()
        gc.collect()  # the parent's pooled connections, forgotten here, are collected: never closed
        return pid

    parents = backend_pid()
    assert in_forked_child(childs_backend_pid) != parents
    # The parent's pooled connection is still open and still its own.
    assert backend_pid() == parents


def test_a_forked_child_keeps_an_in_memory_sqlite_database() -> None:
    database = sa.create_engine("sqlite://")
    try:
        # The webhook store alone: the workflow store wants a file database, which threads share.
        full_engine(database, workflows=False).close()
        with database.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE kept (n INTEGER)")
            conn.exec_driver_sql("INSERT INTO kept VALUES (7)")

        def read_kept() -> int:
            # An in-memory database lives in its one connection: a fresh pool would be empty.
            with database.connect() as conn:
                return int(conn.exec_driver_sql("SELECT n FROM kept").scalar_one())

        assert in_forked_child(read_kept) == 7
    finally:
        database.dispose()
