"""The app of the tracing tests that run a ``flask harvest worker`` subprocess: webhooks and a
workflow on ``TEST_DATABASE_URL``, the ``rq`` backend on ``TEST_REDIS_URL``. The worker's
:func:`create_app` also sets up the OpenTelemetry SDK, writing every span it ends to the file
``TEST_SPANS_FILE``, one JSON object a line (the SDK's own console exporter, into a file)."""

from __future__ import annotations

import os
from typing import Any

from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from flask_harvest import Harvest
from flask_harvest.workflows import WorkflowContext


def build_app(database_url: str, redis_url: str) -> Flask:
    """The app, in the test's process and in the worker's."""
    app = Flask("tracing_worker_app")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=database_url,
        HARVEST_JOBS_BACKEND="rq",
        HARVEST_REDIS_URL=redis_url,
        HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS=True,  # the receiver is on 127.0.0.1
        HARVEST_WEBHOOKS_CONNECT_TIMEOUT_SECONDS=1,
    )
    harvest = Harvest(db=SQLAlchemy(app))

    @harvest.workflow("traced")
    def traced(ctx: WorkflowContext, data: Any) -> Any:
        return ctx.step("double", lambda: data * 2)

    harvest.init_app(app)
    return app


def _one_line(span: ReadableSpan) -> str:
    return str(span.to_json(indent=None)) + "\n"


def create_app() -> Flask:
    """The worker's app, exporting its spans to ``TEST_SPANS_FILE``."""
    provider = TracerProvider()
    # Written as each span ends, so a worker process that exits abruptly has written all it ended.
    spans = open(os.environ["TEST_SPANS_FILE"], "a", encoding="utf-8")  # noqa: SIM115 (the worker's lifetime)
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=spans, formatter=_one_line)))
    trace.set_tracer_provider(provider)
    return build_app(os.environ["TEST_DATABASE_URL"], os.environ["TEST_REDIS_URL"])
