"""Completion callbacks and completion triggers on a continue-as-new chain, on SQLite and
PostgreSQL, with a real HTTP receiver on 127.0.0.1: only the chain's real terminal notifies."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import CompletionTrigger, Harvest, get_engine
from flask_harvest.callbacks import CompletionCallbacks
from flask_harvest.testing import CapturingReceiver
from flask_harvest.triggers.service import TriggerService
from flask_harvest.workflows import Execution, ExecutionState, WorkflowContext
from flask_harvest.workflows.service import WorkflowService

from .pipeline import close_later
from .workflow_app import database_url_fixture

__all__ = ["database_url_fixture"]

S = ExecutionState
PATIENCE = 30.0
OUTCOMES = ["Completed", "Failed", "Cancelled", "TimedOut", "Terminated"]


def make_app(database_url: str) -> Flask:
    app = Flask("continue_as_new_notify")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=database_url,
        HARVEST_ACTUATOR_TOKEN="notify-token-0123456789",
        HARVEST_COMPLETION_CALLBACK_ALLOWLIST="127.0.0.1",
        HARVEST_COMPLETION_CALLBACK_ALLOW_PRIVATE_TARGETS=True,
        HARVEST_COMPLETION_CALLBACK_SECRET="cb-secret-continue-as-new-0123",
        HARVEST_SWEEP_INTERVAL_SECONDS=3600,
    )
    db = SQLAlchemy(app)
    harvest = Harvest(db=db, triggers=True)

    @harvest.workflow("relay")
    def relay(ctx: WorkflowContext, value: Any) -> Any:
        n = ctx.step("tick", lambda: value)
        if n < 5:
            ctx.continue_as_new(n + 1)
        return {"n": n}

    @harvest.workflow("after")
    def after(ctx: WorkflowContext, value: Any) -> Any:
        return value

    @harvest.workflow("after_any")
    def after_any(ctx: WorkflowContext, value: Any) -> Any:
        return value

    harvest.completion_triggers(
        [
            CompletionTrigger("relay", "after"),
            CompletionTrigger("relay", "after_any", terminal_states=OUTCOMES),
        ]
    )
    harvest.init_app(app)
    return close_later(app)


def parts(app: Flask) -> tuple[WorkflowService, CompletionCallbacks, TriggerService]:
    engine = get_engine(app)
    assert engine.workflows is not None and engine.callbacks is not None and engine.triggers is not None
    return engine.workflows, engine.callbacks, engine.triggers


def finished_chain(service: WorkflowService, execution_id: str) -> list[Execution]:
    give_up = time.monotonic() + PATIENCE
    while time.monotonic() < give_up:
        chain = service.chain(execution_id)
        if chain[-1].terminal and chain[-1].state is not S.CONTINUED_AS_NEW:
            return chain
        time.sleep(0.02)
    raise AssertionError("the chain never ended")


def test_a_chain_notifies_once_with_its_last_runs_outcome(
    database_url: str, receiver: CapturingReceiver
) -> None:
    """A chain of 5 continue-as-new runs with a callback registered on the first: exactly one
    callback delivery, with the last run's outcome; a trigger on Completed fires once, for the last
    run; no trigger fires and no callback is enqueued for the ContinuedAsNew rows (AnyTerminal never
    matches ContinuedAsNew, and no trigger fires on it)."""
    app = make_app(database_url)
    with app.app_context():
        service, callbacks, triggers = parts(app)
        target = {"url": receiver.url("/done"), "filter": {"type": "AnyTerminal"}}
        handle, _ = service.start("relay", 0, workflow_id="chain", completion_callbacks=[target])
        chain = finished_chain(service, handle.execution_id)
        assert [e.state for e in chain] == [S.CONTINUED_AS_NEW] * 5 + [S.COMPLETED]
        last = chain[-1]
        [request] = receiver.wait_for(1, timeout=PATIENCE, path="/done")
        body = json.loads(request.body)
        assert body["execution_id"] == last.execution_id and body["state"] == "Completed"
        assert body["result"] == {"n": 5} and body["workflow_id"] == "chain"
        # The deliveries are rows of the terminal transactions: the closed runs have none.
        for run in chain[:-1]:
            assert callbacks.deliveries(run.execution_id) == []
            assert triggers.fires(source_exec_id=run.execution_id) == []
        give_up = time.monotonic() + PATIENCE
        while [d.wire_state for d in callbacks.deliveries(last.execution_id)] != ["DELIVERED"]:
            assert time.monotonic() < give_up, "the delivery was never recorded as delivered"
            time.sleep(0.02)
        fires = triggers.fires(source_exec_id=last.execution_id)
        assert len(fires) == 2 and all(f.outcome is None and f.target_execution_id for f in fires)
        targets = [service.get(f.target_execution_id or "") for f in fires]
        assert sorted(t.workflow_name for t in targets) == ["after", "after_any"]
        assert all(t.trigger_depth == 1 for t in targets)
        for target_run in targets:
            assert service.wait(target_run.execution_id, PATIENCE).output == {"n": 5}
    assert len(receiver.requests) == 1


@pytest.mark.parametrize("end", ["cancel", "terminate"])
def test_a_chain_ended_through_an_old_run_notifies_once_for_its_open_run(
    database_url: str, receiver: CapturingReceiver, end: str
) -> None:
    """The chain's open run ended through the id of its first run notifies once, for that run."""
    app = make_app(database_url)
    with app.app_context():
        service, callbacks, triggers = parts(app)
        target = {"url": receiver.url("/end"), "filter": {"type": "AnyTerminal"}}
        registry = service.registry

        @registry.workflow("relay_nap")
        def relay_nap(ctx: WorkflowContext, value: Any) -> Any:
            if value < 2:
                ctx.continue_as_new(value + 1)
            ctx.sleep(3600)

        handle, _ = service.start("relay_nap", 0, completion_callbacks=[target])
        give_up = time.monotonic() + PATIENCE
        while len(chain := service.chain(handle.execution_id)) < 3 or chain[-1].started_at is None:
            assert time.monotonic() < give_up, "the chain never reached its third run"
            time.sleep(0.02)
        ended = (
            service.cancel(handle.execution_id) if end == "cancel" else service.terminate(handle.execution_id)
        )
        chain = finished_chain(service, handle.execution_id)
        assert ended.execution_id == chain[-1].execution_id and len(chain) == 3
        [request] = receiver.wait_for(1, timeout=PATIENCE, path="/end")
        assert json.loads(request.body)["execution_id"] == chain[-1].execution_id
        assert all(callbacks.deliveries(run.execution_id) == [] for run in chain[:-1])
        assert all(triggers.fires(source_exec_id=run.execution_id) == [] for run in chain)
