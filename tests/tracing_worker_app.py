"""The app a ``flask harvest worker`` subprocess of the tracing tests loads: the worker app of
:mod:`tests.worker_process`, with the OpenTelemetry SDK writing every span it ends to the file
``TEST_SPANS_FILE``, one JSON object a line (the SDK's own console exporter, into a file)."""

from __future__ import annotations

import json
import os

import sqlalchemy as sa
from flask import Flask
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from flask_harvest import OutboundWebhookPlugin
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore


def _one_line(span: ReadableSpan) -> str:
    return str(span.to_json(indent=None)) + "\n"


def create_app() -> Flask:
    provider = TracerProvider()
    # Written as each span ends, so a worker process that exits abruptly has written all it ended.
    spans = open(os.environ["TEST_SPANS_FILE"], "a", encoding="utf-8")  # noqa: SIM115 (the worker's lifetime)
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=spans, formatter=_one_line)))
    trace.set_tracer_provider(provider)
    app = Flask("tracing_worker_app")
    app.config.update(
        HARVEST_JOBS_BACKEND="rq",
        HARVEST_REDIS_URL=os.environ["TEST_REDIS_URL"],
        HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS=True,  # the receiver is on 127.0.0.1
        HARVEST_WEBHOOKS_CONNECT_TIMEOUT_SECONDS=1,
    )
    app.config.update(json.loads(os.environ.get("TEST_HARVEST_CONFIG", "{}")))
    OutboundWebhookPlugin(SqlOutboundWebhookStore(sa.create_engine(os.environ["TEST_DATABASE_URL"])), app)
    return app
