"""An engine's lifetime: what ``close`` gives back, what one failing sweep step leaves to the others,
and what a forked child (gunicorn ``--preload``, a forking worker) must not inherit."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine.events import ConnectionEvents

from flask_harvest.config import load_settings
from flask_harvest.engine import HarvestEngine, add_triggers, add_workflows, build_engine
from flask_harvest.errors import StoreError
from flask_harvest.triggers.store import SqlTriggerStore
from flask_harvest.webhooks.manager import Delegate
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore
from flask_harvest.workflows import SqlWorkflowStore, WorkflowRegistry

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
