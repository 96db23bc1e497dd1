"""Traces of workflows with OpenTelemetry: a run, its steps, its completion callbacks and the
runs its triggers start join the trace of the span that started it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from opentelemetry.sdk.trace import ReadableSpan

from flask_harvest import CompletionTrigger, Harvest, get_engine
from flask_harvest.receiver import verify_completion_callback
from flask_harvest.testing import CapturingReceiver
from flask_harvest.workflows import ExecutionState, WorkflowContext
from flask_harvest.workflows.service import WorkflowService

from .pipeline import close_later
from .tracing_support import named, recording, traceparent, tracer
from .workflow_support import SQL_KINDS

SECRET = "cb-secret-for-the-tracing-tests"
#: How many times the ``flaky`` step fails before it succeeds, by run.
FAILURES: dict[str, int] = {}


@pytest.fixture(params=SQL_KINDS)
def app(request: pytest.FixtureRequest) -> Flask:
    engine: sa.Engine = request.getfixturevalue(f"{request.param}_engine")
    app = Flask("tracing_workflows_test")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=engine.url.render_as_string(hide_password=False),
        HARVEST_COMPLETION_CALLBACK_ALLOWLIST="127.0.0.1",
        HARVEST_COMPLETION_CALLBACK_ALLOW_PRIVATE_TARGETS=True,
        HARVEST_COMPLETION_CALLBACK_SECRET=SECRET,
        HARVEST_SWEEP_INTERVAL_SECONDS=0.2,
    )
    db = SQLAlchemy()
    db.init_app(app)
    harvest = Harvest(db=db)
    harvest.completion_triggers([CompletionTrigger("order", "follow_up")])

    @harvest.workflow("order")
    def order(ctx: WorkflowContext, data: Any) -> Any:
        reserved = ctx.step("reserve", lambda: data["n"] + 1)
        return ctx.step("charge", lambda: reserved * 2)

    @harvest.workflow("follow_up")
    def follow_up(ctx: WorkflowContext, data: Any) -> Any:
        return data

    @harvest.workflow("nap")
    def nap(ctx: WorkflowContext, data: Any) -> Any:
        ctx.sleep(timedelta(hours=1))

    @harvest.workflow("flaky")
    def flaky(ctx: WorkflowContext, data: Any) -> Any:
        return ctx.step("call", lambda: _fail_first(ctx.execution_id), retries=2)

    harvest.init_app(app)
    return close_later(app)


def _fail_first(execution_id: str) -> str:
    if FAILURES.get(execution_id, 0) < 1:
        FAILURES[execution_id] = FAILURES.get(execution_id, 0) + 1
        raise ConnectionError("the first try fails")
    return "ok"


def service_of(app: Flask) -> WorkflowService:
    service = get_engine(app).workflows
    assert service is not None
    return service


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    end = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    [found] = named(spans, name)
    return found


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def test_a_run_its_steps_its_callback_and_the_run_its_trigger_starts_share_the_start_trace(
    app: Flask, receiver: CapturingReceiver
) -> None:
    service = service_of(app)
    callback = {"url": receiver.url("/done"), "filter": {"type": "AnyTerminal"}}
    with recording() as exporter:
        with tracer().start_as_current_span("POST /orders") as request_span:
            handle, _ = service.start("order", {"n": 1}, completion_callbacks=[callback])
        [request] = receiver.wait_for(1, timeout=30)
        assert handle.result(timeout=30) == 4
        follow_ups = wait_for(
            lambda: [
                e for e in service.list_executions(name="follow_up")[0] if e.state is ExecutionState.COMPLETED
            ],
            "the triggered run",
        )
        wait_for(lambda: named(exporter.get_finished_spans(), "run follow_up"), "the triggered run's span")
        wait_for(
            lambda: named(exporter.get_finished_spans(), "process completion callback"), "the callback span"
        )
        spans = exporter.get_finished_spans()
    assert len(follow_ups) == 1
    trace_id = request_span.get_span_context().trace_id
    start, run, end = one(spans, "start order"), one(spans, "run order"), one(spans, "end order")
    assert parent_of(start) == request_span.get_span_context().span_id
    assert parent_of(run) == span_id(start) and parent_of(end) == span_id(start)
    assert run.attributes is not None and run.attributes["harvest.execution.id"] == handle.execution_id
    assert run.attributes["harvest.workflow.state"] == "Completed"
    for name in ("reserve", "charge"):
        step = one(spans, f"step {name}")
        assert parent_of(step) == span_id(run)
    # The completion callback: enqueued in the end's span, each attempt a consumer span of it.
    process = one(spans, "process completion callback")
    assert parent_of(process) == span_id(end)
    post = next(s for s in named(spans, "POST") if parent_of(s) == span_id(process))
    assert request.headers.get("traceparent") == traceparent(post)
    assert verify_completion_callback(SECRET, request.body, headers=request.headers, tolerance_seconds=300)
    # The run the trigger started: stored in the end's span, so its run is in the same trace.
    follow_up, follow_up_start = one(spans, "run follow_up"), one(spans, "start follow_up")
    assert parent_of(follow_up_start) == span_id(end) and parent_of(follow_up) == span_id(follow_up_start)
    assert follow_up.attributes is not None
    assert follow_up.attributes["harvest.execution.id"] == follow_ups[0].execution_id
    for span in (start, run, end, process, post, follow_up):
        assert span.context is not None and span.context.trace_id == trace_id


def test_each_try_of_a_step_has_its_span_and_a_failed_try_says_why(app: Flask) -> None:
    """A step's failed try is marked failed with the error's type, never its message."""
    with recording() as exporter:
        handle, _ = service_of(app).start("flaky", None)
        assert handle.result(timeout=30) == "ok"
        spans = exporter.get_finished_spans()
    first, second = named(spans, "step call")
    assert first.attributes is not None and second.attributes is not None
    assert (first.attributes["harvest.step.attempt"], second.attributes["harvest.step.attempt"]) == (1, 2)
    assert first.attributes["error.type"] == "ConnectionError" and "error.type" not in second.attributes
    assert first.status.description == "ConnectionError"
    assert all("the first try fails" not in s.to_json() for s in spans)


def test_terminating_a_run_from_another_trace_links_the_end_to_it(app: Flask) -> None:
    """The end of a run stays in the trace of its start; the request that ended it is a link."""
    service = service_of(app)
    with recording() as exporter:
        with tracer().start_as_current_span("POST /naps") as starting:
            handle, _ = service.start("nap", None)
        wait_for(lambda: service.get(handle.execution_id).attempt == 1, "the run to sleep")
        wait_for(lambda: service.get(handle.execution_id).state is ExecutionState.PENDING, "the run to sleep")
        with tracer().start_as_current_span("POST /terminate") as terminating:
            service.terminate(handle.execution_id, "operator")
        spans = exporter.get_finished_spans()
    end = one(spans, "end nap")
    assert end.context is not None and end.attributes is not None
    assert end.context.trace_id == starting.get_span_context().trace_id
    assert end.attributes["harvest.workflow.state"] == "Terminated"
    assert [link.context.span_id for link in end.links] == [terminating.get_span_context().span_id]
    # The claim that put it to sleep: a run span that ended without a state.
    run = one(spans, "run nap")
    assert run.attributes is not None and "harvest.workflow.state" not in run.attributes
