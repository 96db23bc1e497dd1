"""Prometheus metrics of workflows, completion callbacks and completion triggers, on SQLite and
PostgreSQL: executions by workflow and terminal state, callback outcomes, and the seed's trigger
counters (fires by outcome, skips by trigger and reason)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import sqlalchemy as sa
from flask import Flask
from werkzeug.wrappers import Response

from flask_harvest import signals, workflow_service
from flask_harvest.testing import CapturingReceiver
from flask_harvest.triggers import CompletionTrigger
from flask_harvest.triggers.conditions import Eq, GreaterThan
from flask_harvest.workflows import ExecutionState

from .metrics_support import SampleKey, delta, parse, value
from .workflow_app import AUTH, TOKEN, database_url_fixture, make_workflow_app

__all__ = ["database_url_fixture"]  # the fixture is used by name

ROUTE = "/actuator/webhooks/metrics"
CALLBACK_SECRET = "cb-SECRET-CANARY-metrics-7f3a"


def scrape(app: Flask) -> dict[SampleKey, float]:
    response = app.test_client().get(ROUTE, headers=AUTH)
    assert response.status_code == 200, response.get_data(as_text=True)
    return parse(response.get_data(as_text=True))


def wait_until(app: Flask, done: Callable[[dict[SampleKey, float]], bool]) -> dict[SampleKey, float]:
    """Scrape until ``done`` holds (work finishes on the app's job threads), at most 30 s."""
    end = time.monotonic() + 30
    while True:
        samples = scrape(app)
        if done(samples) or time.monotonic() > end:
            return samples
        time.sleep(0.05)


def test_workflows_callbacks_and_triggers_are_counted(database_url: str, receiver: CapturingReceiver) -> None:
    big_orders = CompletionTrigger("echo", "three_steps", condition=GreaterThan("amount", 1000))
    on_boom = CompletionTrigger("boom", "echo", terminal_states=["Failed"], condition=Eq("region", "EU"))
    app = make_workflow_app(
        database_url,
        triggers=[big_orders, on_boom],
        HARVEST_METRICS=True,
        HARVEST_COMPLETION_CALLBACK_ALLOWLIST="127.0.0.1",
        HARVEST_COMPLETION_CALLBACK_ALLOW_PRIVATE_TARGETS=True,
        HARVEST_COMPLETION_CALLBACK_SECRET=CALLBACK_SECRET,
    )
    with app.app_context():
        engine = sa.create_engine(database_url)
        with engine.begin() as conn:  # a row a newer build wrote: this one cannot read it, and fails closed
            conn.execute(
                sa.text("UPDATE harvest_completion_triggers SET condition = '{not json' WHERE id = :id"),
                {"id": on_boom.id},
            )
        engine.dispose()
    receiver.handle("/refused", lambda _request: Response("no", status=400))  # permanent: dead-lettered
    before = scrape(app)
    with app.app_context():
        service = workflow_service()
        ok = [{"url": receiver.url("/ok")}]
        refused = [{"url": receiver.url("/refused")}]
        small, _ = service.start("echo", {"amount": 5}, completion_callbacks=ok)
        big, _ = service.start("echo", {"amount": 5000})
        boom, _ = service.start("boom", None, completion_callbacks=refused)
        states = [service.wait(h.execution_id, timeout=30).state for h in (small, big, boom)]
    assert states == [ExecutionState.COMPLETED, ExecutionState.COMPLETED, ExecutionState.FAILED]

    runs = "harvest_workflow_executions_finished_total"
    callbacks = "harvest_completion_callback_delivery_attempts_total"
    after = wait_until(
        app,
        lambda s: (
            delta(before, s, runs, workflow="three_steps", state="completed") == 1
            and delta(before, s, callbacks, outcome="delivered")
            + delta(before, s, callbacks, outcome="dead_lettered")
            == 2
        ),
    )
    assert delta(before, after, runs, workflow="echo", state="completed") == 2
    assert delta(before, after, runs, workflow="boom", state="failed") == 1
    assert (
        delta(before, after, runs, workflow="three_steps", state="completed") == 1
    )  # started by the trigger
    assert delta(before, after, callbacks, outcome="delivered") == 1
    assert delta(before, after, callbacks, outcome="dead_lettered") == 1
    finished = "harvest_completion_callback_deliveries_finished_total"
    assert delta(before, after, finished, outcome="delivered") == 1
    assert delta(before, after, finished, outcome="dead_lettered") == 1
    # One duration per run that ended, by workflow and outcome.
    durations = "harvest_workflow_duration_seconds_count"
    assert delta(before, after, durations, workflow="echo", outcome="completed") == 2
    assert delta(before, after, durations, workflow="boom", outcome="failed") == 1
    fires, skipped = "harvest_completion_trigger_fires_total", "harvest_completion_trigger_skipped_total"
    assert delta(before, after, fires, outcome="started") == 1
    assert delta(before, after, fires, outcome="skipped") == 2
    assert delta(before, after, skipped, trigger="echo->three_steps", reason="condition_unmet") == 1
    assert delta(before, after, skipped, trigger="boom->echo", reason="condition_invalid") == 1
    # Every fire outcome is a series from the start, so an alert on a rate has something to read.
    assert ("harvest_completion_trigger_fires_total", (("outcome", "chain_depth_exceeded"),)) in after

    text = app.test_client().get(ROUTE, headers=AUTH).get_data(as_text=True)
    for leak in (CALLBACK_SECRET, TOKEN, "127.0.0.1", small.execution_id, boom.execution_id):
        assert leak not in text


def test_an_execution_of_an_unregistered_workflow_gets_one_shared_label(database_url: str) -> None:
    app = make_workflow_app(database_url, HARVEST_METRICS=True)
    with app.app_context():
        handle, _ = workflow_service().start("echo", 1)
        execution = workflow_service().wait(handle.execution_id, timeout=30)
    before = scrape(app)
    # A name this process never registered (a run written by another deploy): no new series per name.
    stranger = dataclasses.replace(execution, workflow_name="renamed-long-ago")
    signals.workflow_finished.send(app, execution=stranger)
    after = scrape(app)
    runs = "harvest_workflow_executions_finished_total"
    assert delta(before, after, runs, workflow="_unregistered", state="completed") == 1
    assert value(after, runs, workflow="renamed-long-ago", state="completed") == 0


def test_another_app_counts_nothing_here(database_url: str) -> None:
    app = make_workflow_app(database_url, HARVEST_METRICS=True)
    other = Flask("other")
    with app.app_context():
        handle, _ = workflow_service().start("echo", 1)
        execution = workflow_service().wait(handle.execution_id, timeout=30)
    before = scrape(app)
    signals.workflow_finished.send(other, execution=execution)
    after = scrape(app)
    runs = "harvest_workflow_executions_finished_total"
    assert delta(before, after, runs, workflow="echo", state="completed") == 0


def test_a_run_that_continued_as_new_is_counted_closed_but_not_timed(database_url: str) -> None:
    """A run that continued as new closed its row but did not end its logical run: it counts in
    the closed executions, and no duration is observed until the chain's last run ends."""
    app = make_workflow_app(database_url, HARVEST_METRICS=True)
    with app.app_context():
        handle, _ = workflow_service().start("echo", 1)
        execution = workflow_service().wait(handle.execution_id, timeout=30)
    before = scrape(app)
    handed_over = dataclasses.replace(execution, state=ExecutionState.CONTINUED_AS_NEW)
    signals.workflow_finished.send(app, execution=handed_over)
    after = scrape(app)
    runs = "harvest_workflow_executions_finished_total"
    assert delta(before, after, runs, workflow="echo", state="continued_as_new") == 1
    durations = "harvest_workflow_duration_seconds_count"
    assert delta(before, after, durations, workflow="echo", outcome="continued_as_new") == 0
    assert delta(before, after, durations, workflow="echo", outcome="completed") == 0
