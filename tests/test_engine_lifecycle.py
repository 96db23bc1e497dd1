"""An engine's lifetime: what ``close`` gives back, what one failing sweep step leaves to the others,
and what a forked child (gunicorn ``--preload``, a forking worker) must not inherit."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from sqlalchemy.engine.events import ConnectionEvents

from flask_harvest import OutboundWebhookPlugin, WebhookSubscription, generate_secret, get_engine
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
