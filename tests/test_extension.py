"""The one extension: webhooks, workflows, completion triggers and the admin authorizer, declared
in any order around ``init_app``, and its compatibility name."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import create_engine

from flask_harvest import (
    CompletionTrigger,
    ConfigurationError,
    ExecutionState,
    Harvest,
    InMemoryOutboundWebhookHandler,
    OutboundWebhookPlugin,
    SqlOutboundWebhookStore,
    get_engine,
    trigger_service,
    workflow_service,
)
from flask_harvest.config import KEYS
from flask_harvest.schema import ALL_TABLES
from flask_harvest.triggers.firing import target_workflow_id
from flask_harvest.workflows import WorkflowContext

from .pipeline import close_later
from .properties import BUDGET, TEXT

ROUTE = "/api/harvest/workflows"


def _declare_workflows(harvest: Harvest) -> None:
    @harvest.workflow("source")
    def source(ctx: WorkflowContext, value: Any) -> Any:
        return {"value": value}

    @harvest.workflow("target")
    def target(ctx: WorkflowContext, value: Any) -> Any:
        return value


def _declare_trigger(harvest: Harvest) -> None:
    harvest.completion_trigger(
        CompletionTrigger("source", "target", id="5b0c1b8e-59f5-4bd2-9d5a-0ac3f4b1c001")
    )


def _declare_authorizer(harvest: Harvest) -> None:
    @harvest.actuator_authorizer
    def allow_the_header(request: Any) -> bool:
        return bool(request.headers.get("X-Operator") == "yes")


STEPS: dict[str, Callable[[Harvest], None]] = {
    "workflows": _declare_workflows,
    "trigger": _declare_trigger,
    "authorizer": _declare_authorizer,
}


@pytest.mark.parametrize(
    "order", [list(p) for p in itertools.permutations([*STEPS, "init_app"])], ids="-".join
)
def test_any_order_of_declarations_and_init_app_works(order: list[str], tmp_path: Path) -> None:
    app = Flask("any_order")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=f"sqlite:///{tmp_path / 'app.db'}", HARVEST_SWEEP_INTERVAL_SECONDS=0.2
    )
    db = SQLAlchemy(app)
    harvest = Harvest(db=db)
    for step in order:
        if step == "init_app":
            harvest.init_app(app)
            close_later(app)
        else:
            STEPS[step](harvest)
    with app.app_context():
        source = workflow_service().start("source", 7)[0]
        assert source.result(timeout=30) == {"value": 7}
        triggered = workflow_service().wait(
            _target_execution(
                target_workflow_id("5b0c1b8e-59f5-4bd2-9d5a-0ac3f4b1c001", source.execution_id)
            ),
            timeout=30,
        )
        assert triggered.state is ExecutionState.COMPLETED and triggered.output == {"value": 7}
        assert [t.id for t in trigger_service().list_triggers()] == ["5b0c1b8e-59f5-4bd2-9d5a-0ac3f4b1c001"]
    client = app.test_client()
    assert client.get(ROUTE).status_code in (401, 403)  # deny by default
    assert client.get(ROUTE, headers={"X-Operator": "yes"}).status_code == 200


def _target_execution(workflow_id: str) -> str:
    # The trigger starts its target in the source's terminal transaction: it exists once the
    # source has ended.
    found = workflow_service().store.get_by_workflow_id(workflow_id)
    assert found is not None, f"no run of {workflow_id} was started"
    return found.execution_id


def test_the_compatibility_name_is_the_same_extension(tmp_path: Path) -> None:
    memory = OutboundWebhookPlugin(InMemoryOutboundWebhookHandler(), Flask("memory"))
    assert isinstance(memory, Harvest)
    app = Flask("sql")
    app.config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{tmp_path / 'app.db'}"
    plugin = OutboundWebhookPlugin.sql(SQLAlchemy(app), app)
    close_later(app)
    _declare_workflows(plugin)
    with app.app_context():
        assert get_engine().workflows is not None and get_engine().triggers is not None
        assert plugin.start("source", 1).result(timeout=30) == {"value": 1}


def test_a_memory_store_has_no_workflows_and_says_how_to_get_them() -> None:
    app = Flask("memory_only")
    Harvest(app, store=InMemoryOutboundWebhookHandler())
    close_later(app)
    with pytest.raises(ConfigurationError, match="workflows are off"):
        workflow_service(app)
    with pytest.raises(ConfigurationError, match="keep their executions in SQL"):
        Harvest(Flask("wants_workflows"), store=InMemoryOutboundWebhookHandler(), workflows=True)


def test_init_app_refuses_a_second_registration_and_a_missing_store(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="choose where flask-harvest keeps its data"):
        Harvest(Flask("nothing"))
    app = Flask("twice")
    app.config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{tmp_path / 'app.db'}"
    db = SQLAlchemy(app)
    Harvest(app, db)
    close_later(app)
    with pytest.raises(ConfigurationError, match="already registered"):
        Harvest(app, db)


def test_a_sql_store_runs_workflows_when_asked(tmp_path: Path) -> None:
    sql = create_engine(f"sqlite:///{tmp_path / 'store.db'}")
    store = SqlOutboundWebhookStore(sql)
    store.ensure_schema()
    plain = Flask("store_only")
    Harvest(plain, store=store)
    close_later(plain)
    assert get_engine(plain).workflows is None  # a store alone keeps webhooks only, as before
    app = Flask("store_and_workflows")
    harvest = Harvest(app, store=store, workflows=True)
    close_later(app)
    _declare_workflows(harvest)
    with app.app_context():
        assert harvest.start("source", 2).result(timeout=30) == {"value": 2}
    sql.dispose()


def test_init_db_creates_every_table_of_an_app_whose_migrations_own_the_schema(tmp_path: Path) -> None:
    # The production layout: create_tables=False, and `flask harvest init-db` as the release step.
    app = Flask("release_step")
    app.config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{tmp_path / 'app.db'}"
    db = SQLAlchemy(app)
    harvest = Harvest(app, db, create_tables=False)
    close_later(app)
    with app.app_context():
        assert sa.inspect(db.engine).get_table_names() == []
        result = app.test_cli_runner().invoke(args=["harvest", "init-db"])
        assert result.exit_code == 0, result.output
        assert set(sa.inspect(db.engine).get_table_names()) == {table.name for table in ALL_TABLES}
        harvest.engine.sweep()  # every sweep step finds its table


HOSTILE_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
    st.recursive(st.integers(), lambda inner: st.lists(inner, max_size=3), max_leaves=50),
)


@BUDGET
@given(
    options=st.dictionaries(st.one_of(st.sampled_from(sorted(KEYS)), TEXT), HOSTILE_VALUES, max_size=3),
    workflows=st.sampled_from([None, True, False]),
    triggers=st.sampled_from([None, True, False]),
)
def test_any_options_either_register_or_fail_with_a_configuration_error(
    options: dict[str, Any], workflows: bool | None, triggers: bool | None
) -> None:
    app = Flask("hostile_options")
    try:
        Harvest(
            app,
            store=InMemoryOutboundWebhookHandler(),
            workflows=workflows,
            triggers=triggers,
            **options,
        )
    except ConfigurationError:
        assert "harvest" not in app.extensions  # a refused registration leaves nothing behind
    else:
        close_later(app)
        assert get_engine(app).workflows is None  # a memory store alone runs no workflows
