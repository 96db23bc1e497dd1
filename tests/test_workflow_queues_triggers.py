"""Completion triggers that start their target in a workflow queue, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from flask_harvest import CompletionTrigger, workflow_service
from flask_harvest.errors import InvalidFieldError
from flask_harvest.triggers.definitions import trigger_from_json, trigger_to_json
from flask_harvest.workflows import ExecutionState

from .workflow_app import (  # noqa: F401 (database_url_fixture: a fixture)
    AUTH,
    PREFIX,
    database_url_fixture,
    executions,
    make_workflow_app,
)

QUEUES = {"emails": {"concurrency": 2}}


def test_a_trigger_carries_the_targets_queue_fields(database_url: str) -> None:
    """A trigger's queue_name, concurrency_key, concurrency_limit and priority are the target
    start's."""
    trigger = CompletionTrigger(
        "echo", "three_steps", queue_name="emails", concurrency_key="k", concurrency_limit=2, priority=7
    )
    app = make_workflow_app(database_url, triggers=[trigger], HARVEST_WORKFLOW_QUEUES=QUEUES)
    with app.app_context():
        source, _ = workflow_service().start("echo", 1)
        assert source.result(timeout=20) == 1
    target = next(e for e in executions(app) if e.workflow_name == "three_steps")
    assert (target.queue_name, target.concurrency_key, target.concurrency_limit, target.priority) == (
        "emails",
        "k",
        2,
        7,
    )
    with app.app_context():
        assert workflow_service().wait(target.execution_id, 20).state is ExecutionState.COMPLETED
    listed = app.test_client().get(PREFIX + "/admin/completion-triggers", headers=AUTH).get_json()
    (shown,) = listed
    assert (shown["queue_name"], shown["priority"]) == ("emails", 7)


def test_a_trigger_into_an_unknown_queue_does_not_fail_its_source(database_url: str) -> None:
    """An unknown queue at fire time is a validation failure of the fire, never of the source."""
    trigger = CompletionTrigger("echo", "three_steps", queue_name="gone")
    app = make_workflow_app(database_url, triggers=[trigger])
    with app.app_context():
        source, _ = workflow_service().start("echo", 1)
        assert source.result(timeout=20) == 1
    assert [e.workflow_name for e in executions(app)] == ["echo"]


def test_trigger_queue_fields_are_checked_and_round_trip() -> None:
    body = {
        "source_workflow_name": "a",
        "target_workflow_name": "b",
        "queue_name": "q",
        "concurrency_key": "c",
        "concurrency_limit": 3,
        "priority": -2,
    }
    trigger = trigger_from_json(body)
    data = trigger_to_json(trigger)
    assert {k: data[k] for k in ("queue_name", "concurrency_key", "concurrency_limit", "priority")} == {
        "queue_name": "q",
        "concurrency_key": "c",
        "concurrency_limit": 3,
        "priority": -2,
    }
    for bad in ({"priority": 10**8}, {"concurrency_limit": 0}, {"queue_name": ""}, {"priority": "1"}):
        with pytest.raises(InvalidFieldError):
            trigger_from_json({**body, **bad})
