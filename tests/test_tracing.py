"""Traces of webhook deliveries with OpenTelemetry: one trace from the dispatch to every attempt,
a ``traceparent`` on every POST, and nothing changed or imported without the ``otel`` extra."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from standardwebhooks.webhooks import Webhook as StandardWebhook

from flask_harvest import (
    DeliveryLog,
    DeliveryState,
    OutboundWebhookHandler,
    WebhookSubscription,
    generate_secret,
    get_engine,
    tracing,
)
from flask_harvest.callbacks.store import SqlCallbackStore
from flask_harvest.testing import CapturingReceiver, drain
from flask_harvest.webhooks.models import standard_secret
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore
from flask_harvest.workflows import SqlWorkflowStore

from .pipeline import close_later, make_app, wait_final
from .properties import BUDGET
from .tracing_support import named, recording, traceparent, tracer
from .tracing_worker_app import build_app
from .worker_process import ROOT, start_worker, stop

SECRET = generate_secret()


def test_a_dispatch_its_delivery_job_and_every_attempt_form_one_trace(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store)
    store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["order.*"], SECRET, id="sub_1"))
    receiver.respond("/hook", 500)  # the first attempt fails, the retry succeeds
    with recording() as exporter, app.app_context():
        with tracer().start_as_current_span("POST /orders") as request_span:
            [delivery_id] = get_engine().manager.dispatch("order.created", {"n": 1})
        drain(app, retries=True)
        assert store.get_delivery(delivery_id).state is DeliveryState.DELIVERED  # type: ignore[union-attr]
        spans = exporter.get_finished_spans()
    trace_id = request_span.get_span_context().trace_id
    assert {s.context.trace_id for s in spans if s.context is not None} == {trace_id}
    [send] = named(spans, "send order.created")
    assert send.parent is not None and send.parent.span_id == request_span.get_span_context().span_id
    assert send.attributes is not None and send.attributes["messaging.batch.message_count"] == 1
    processes = named(spans, "process order.created")
    posts = named(spans, "POST")
    assert len(processes) == len(posts) == 2
    for process, post in zip(processes, posts, strict=True):
        assert process.parent is not None and process.parent.span_id == send.context.span_id
        assert post.parent is not None and post.parent.span_id == process.context.span_id
        assert process.attributes is not None and post.attributes is not None
        assert process.attributes["messaging.message.id"] == delivery_id
        assert post.attributes["http.request.method"] == "POST"
        assert post.attributes["url.full"] == receiver.url("/hook")
        assert post.attributes["server.address"] == "127.0.0.1"
        assert post.attributes["server.port"] == receiver.port
    assert [p.attributes["http.response.status_code"] for p in posts if p.attributes] == [500, 200]
    assert [p.attributes["harvest.attempt"] for p in processes if p.attributes] == [1, 2]
    # Each attempt tells the receiver its own client span, in the dispatch's trace.
    assert [r.headers.get("traceparent") for r in receiver.requests] == [traceparent(p) for p in posts]


def test_the_traceparent_header_leaves_the_signature_valid(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    """The Standard Webhooks signature covers the id, the timestamp and the body only: the
    trace headers added to an attempt do not break it."""
    app = make_app(store)
    secret = standard_secret(SECRET)
    store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["order.*"], secret, id="sub_1"))
    with recording(), app.app_context():
        with tracer().start_as_current_span("request"):
            get_engine().manager.dispatch("order.created", {"n": 1})
        drain(app)
    [request] = receiver.requests
    assert request.headers.get("traceparent")
    StandardWebhook(secret).verify(request.body, dict(request.headers))


def test_the_callers_tracestate_reaches_the_receiver(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    """A request that arrived with a ``tracestate`` has it stored and sent on with each attempt."""
    app = make_app(store)
    store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["order.*"], SECRET, id="sub_1"))
    incoming = TraceContextTextMapPropagator().extract(
        {
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "tracestate": "shop=t61rcWkgMzE",
        }
    )
    with recording(), app.app_context():
        with tracer().start_as_current_span("POST /orders", context=incoming):
            [delivery_id] = get_engine().manager.dispatch("order.created", {})
        stored = store.get_delivery(delivery_id)
        drain(app)
    assert stored is not None and stored.trace_context is not None
    assert json.loads(stored.trace_context)["tracestate"] == "shop=t61rcWkgMzE"
    [request] = receiver.requests
    assert request.headers.get("tracestate") == "shop=t61rcWkgMzE"
    assert (request.headers.get("traceparent") or "").startswith("00-0af7651916cd43dd8448eb211c80319c-")


@pytest.mark.parametrize(
    ("url", "address", "port"),
    [
        ("https://hooks.example.com/in", "hooks.example.com", 443),
        ("http://user:pw@[::1]:8080/x?q=1", "::1", 8080),
        ("http://127.0.0.1/", "127.0.0.1", 80),
    ],
)
def test_the_server_attributes_name_the_host_and_port_without_credentials(
    url: str, address: str, port: int
) -> None:
    assert tracing._server(url) == {"server.address": address, "server.port": port}


def test_a_url_with_a_bad_port_gives_no_server_attributes() -> None:
    assert tracing._server("http://host:99999/") == {}


def test_a_message_written_in_the_callers_transaction_joins_the_callers_trace(
    sql_store: SqlOutboundWebhookStore, receiver: CapturingReceiver
) -> None:
    """The outbox row carries the trace context to the relay, which may run anywhere later."""
    app = make_app(sql_store)
    sql_store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["order.*"], SECRET, id="sub_1"))
    with recording() as exporter, app.app_context():
        with tracer().start_as_current_span("POST /orders") as request_span, sql_store.engine.begin() as conn:
            get_engine().manager.dispatch_in_tx(conn, "order.created", {"n": 1})
        drain(app)
        spans = exporter.get_finished_spans()
    [post] = named(spans, "POST")
    assert post.context is not None
    assert post.context.trace_id == request_span.get_span_context().trace_id
    [request] = receiver.requests
    assert request.headers.get("traceparent") == traceparent(post)


def test_a_dispatch_outside_any_trace_starts_one_and_the_stored_context_names_it(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store)
    store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["order.*"], SECRET, id="sub_1"))
    with recording() as exporter, app.app_context():
        [delivery_id] = get_engine().manager.dispatch("order.created", {})
        stored = store.get_delivery(delivery_id)
        drain(app)
        spans = exporter.get_finished_spans()
    [send] = named(spans, "send order.created")
    assert stored is not None and stored.trace_context is not None
    assert json.loads(stored.trace_context) == {"traceparent": traceparent(send)}
    assert "trace_context" not in stored.to_dict()  # internal: not in the API's answers
    assert {s.context.trace_id for s in spans if s.context} == {send.context.trace_id}


def test_credentials_in_the_target_url_never_reach_a_span(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    """Secrets never appear in spans: ``url.full`` is redacted, and no attribute holds a secret."""
    app = make_app(store)
    url = receiver.url("/hook").replace("http://", "http://user:pa55word@") + "?token=s3cr3t-token"
    store.add_subscription(WebhookSubscription(url, ["order.*"], SECRET, id="sub_1"))
    with recording() as exporter, app.app_context():
        get_engine().manager.dispatch("order.created", {"n": 1})
        drain(app)
        spans = exporter.get_finished_spans()
    [post] = named(spans, "POST")
    assert post.attributes is not None
    assert (
        post.attributes["url.full"] == receiver.url("/hook").replace("http://", "http://***@") + "?token=***"
    )
    everything = " ".join(s.to_json() for s in spans)
    for secret in ("pa55word", "s3cr3t-token", SECRET):
        assert secret not in everything


def test_an_unreadable_stored_context_is_ignored_and_the_delivery_goes_out(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    """A row's trace context is data: garbage there starts a new trace, it never fails the work."""
    app = make_app(store)
    store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["order.*"], SECRET, id="sub_1"))
    garbage = ["{not json", '["a"]', '{"traceparent": "00-zz-zz-01"}', '{"traceparent": 1}', "x" * 10_000]
    ids = store.log_deliveries(
        [
            DeliveryLog(
                id=f"msg_{n}",
                subscription_id="sub_1",
                topic="order.created",
                payload="{}",
                trace_context=text,
            )
            for n, text in enumerate(garbage)
        ]
    )
    with recording() as exporter:
        drain(app)
        spans = exporter.get_finished_spans()
    assert [d.state for d in store.get_deliveries(ids)] == [DeliveryState.DELIVERED] * len(garbage)
    processes = named(spans, "process order.created")
    assert len(processes) == len(garbage)
    assert all(process.parent is None for process in processes)  # each a new trace
    assert len({p.context.trace_id for p in processes if p.context}) == len(garbage)
    assert len(receiver.requests) == len(garbage)


def test_without_a_trace_nothing_is_stored_or_sent(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    """With the API installed but no tracer provider, no context is stored and no header sent."""
    app = make_app(store)
    store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["order.*"], SECRET, id="sub_1"))
    with app.app_context():
        [delivery_id] = get_engine().manager.dispatch("order.created", {})
        drain(app)
    stored = store.get_delivery(delivery_id)
    assert stored is not None and stored.trace_context is None
    assert "traceparent" not in receiver.requests[0].headers
    assert tracing.capture() is None


#: Blocks every ``opentelemetry`` module, as when the extra is not installed, then dispatches and
#: delivers a webhook and runs a workflow with a step and a completion callback, and prints what
#: got imported, stored and sent.
_WITHOUT_OTEL = """
import importlib.abc, json, os, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Block())
import sqlalchemy as sa
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from flask_harvest import Harvest, WebhookSubscription, get_engine, tracing
from flask_harvest.testing import CapturingReceiver, drain

app = Flask("no_otel")
app.config.update(
    SQLALCHEMY_DATABASE_URI=sys.argv[1],
    HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS=True,
    HARVEST_COMPLETION_CALLBACK_ALLOWLIST="127.0.0.1",
    HARVEST_COMPLETION_CALLBACK_ALLOW_PRIVATE_TARGETS=True,
    HARVEST_COMPLETION_CALLBACK_SECRET="s" * 32,
    HARVEST_SWEEP_INTERVAL_SECONDS=3600,
)
harvest = Harvest(db=SQLAlchemy(app))

@harvest.workflow("double")
def double(ctx, value):
    return ctx.step("double", lambda: value * 2)

harvest.init_app(app)
with CapturingReceiver().start() as receiver, app.app_context():
    engine = get_engine()
    engine.store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["a.*"], "s" * 32, id="sub_1"))
    [delivery_id] = engine.manager.dispatch("a.b", {"n": 1})
    drain(app)
    callback = {"url": receiver.url("/done"), "filter": {"type": "AnyTerminal"}}
    handle, _ = engine.workflows.start("double", 21, completion_callbacks=[callback])
    result = handle.result(timeout=60)
    receiver.wait_for(2, timeout=60)
    with engine.store.engine.connect() as conn:
        stored = [
            conn.execute(sa.text(f"SELECT count(*) FROM {table} WHERE trace_context IS NOT NULL")).scalar()
            for table in ("harvest_webhook_deliveries", "harvest_workflow_executions")
        ]
    print(json.dumps({
        "enabled": tracing.ENABLED,
        "imported": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
        "state": engine.store.get_delivery(delivery_id).state.value,
        "result": result,
        "stored": stored,
        "headers": sorted({h for r in receiver.requests for h in r.headers}),
    }), flush=True)
    # What was to be shown is shown: exit here, inside the block, rather than wait for the
    # receiver's server and the engine's threads to wind down, which is not what this checks.
    os._exit(0)
"""


def test_without_the_otel_extra_nothing_is_imported_and_delivery_works(tmp_path: Path) -> None:
    """Without OpenTelemetry installed nothing changes: no import, no header, no stored context,
    a normal delivery, workflow run and completion callback."""
    database = f"sqlite:///{tmp_path}/no_otel.db"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_WITHOUT_OTEL), database],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["enabled"] is False
    assert seen["imported"] == []
    assert seen["state"] == "delivered" and seen["result"] == 42
    assert seen["stored"] == [0, 0]
    assert "traceparent" not in seen["headers"] and "webhook-signature" in seen["headers"]


def _read_spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _run_worker(folder: Path, store: SqlOutboundWebhookStore, redis_url: str) -> list[dict[str, Any]]:
    """Run ``flask harvest worker --burst`` with :mod:`tests.tracing_worker_app`; return its spans."""
    spans_file = folder / "spans.jsonl"
    worker = start_worker(
        folder,
        store,
        redis_url,
        "--burst",
        app="tests.tracing_worker_app:create_app",
        env={"TEST_SPANS_FILE": str(spans_file)},
    )
    try:
        assert worker.wait(timeout=120) == 0, (folder / "worker.log").read_text()
    finally:
        stop(worker, signal.SIGTERM)
    return _read_spans(spans_file)


@pytest.mark.redis
def test_a_worker_process_continues_the_trace_after_redis_lost_the_job(
    sql_store: SqlOutboundWebhookStore,
    redis_conn: redis.Redis,
    redis_url: str,
    receiver: CapturingReceiver,
    tmp_path: Path,
) -> None:
    """The trace context lives in the delivery row, not the job: a job the sweeper rebuilds
    after Redis lost it is delivered by another process in the dispatch's trace."""
    app = close_later(build_app(sql_store.engine.url.render_as_string(hide_password=False), redis_url))
    sql_store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["order.*"], SECRET, id="sub_1"))
    with recording(), app.app_context(), tracer().start_as_current_span("POST /orders") as request_span:
        [delivery_id] = get_engine().manager.dispatch("order.created", {"n": 1})
    redis_conn.flushdb()  # Redis restarted empty: the job is gone, the row is not
    with app.app_context():
        deadline = time.monotonic() + 60
        # The sweeper leaves rows due less than its grace period ago alone: ask until it requeues.
        while get_engine().sweep().requeued == 0:
            assert time.monotonic() < deadline, "the sweeper never requeued the delivery"
            time.sleep(0.2)
    spans = _run_worker(tmp_path, sql_store, redis_url)
    assert wait_final(sql_store, [delivery_id], timeout=10) == [DeliveryState.DELIVERED]
    trace_id = f"0x{request_span.get_span_context().trace_id:032x}"
    [process] = [s for s in spans if s["name"] == "process order.created"]
    [post] = [s for s in spans if s["name"] == "POST"]
    assert process["context"]["trace_id"] == post["context"]["trace_id"] == trace_id
    assert process["kind"] == "SpanKind.CONSUMER" and post["kind"] == "SpanKind.CLIENT"
    assert post["parent_id"] == process["context"]["span_id"]
    assert process["attributes"]["messaging.message.id"] == delivery_id
    [request] = receiver.requests
    # version, trace id, parent id; the flags say sampled (and, with newer SDKs, a random trace id).
    version, sent_trace_id, parent_id, flags = (request.headers.get("traceparent") or "").split("-")
    assert (version, sent_trace_id, parent_id) == ("00", trace_id[2:], post["context"]["span_id"][2:])
    assert int(flags, 16) & 1


@pytest.mark.redis
def test_a_worker_process_runs_a_workflow_in_the_trace_of_its_start(
    sql_store: SqlOutboundWebhookStore, redis_conn: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """The run's spans, made in the worker, are children of the start's span, made here."""
    app = close_later(build_app(sql_store.engine.url.render_as_string(hide_password=False), redis_url))
    with recording() as exporter, app.app_context(), tracer().start_as_current_span("POST /orders"):
        service = get_engine().workflows
        assert service is not None
        handle, _ = service.start("traced", 21)
        [start] = named(exporter.get_finished_spans(), "start traced")
    assert start.context is not None
    started_trace, start_id = f"0x{start.context.trace_id:032x}", f"0x{start.context.span_id:016x}"
    spans = _run_worker(tmp_path, sql_store, redis_url)
    with app.app_context():
        assert handle.result(timeout=30) == 42
    [run] = [s for s in spans if s["name"] == "run traced"]
    [step] = [s for s in spans if s["name"] == "step double"]
    [end] = [s for s in spans if s["name"] == "end traced"]
    assert run["kind"] == "SpanKind.CONSUMER"
    assert run["parent_id"] == end["parent_id"] == start_id
    assert step["parent_id"] == run["context"]["span_id"]
    assert run["attributes"]["harvest.execution.id"] == handle.execution_id
    assert run["attributes"]["harvest.workflow.state"] == "Completed"
    assert {run["context"]["trace_id"], step["context"]["trace_id"], end["context"]["trace_id"]} == {
        started_trace
    }


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_start_up_adds_the_trace_context_columns_to_the_tables_of_an_earlier_version(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """Tables created before tracing get the nullable column on start-up; their rows keep none."""
    engine: sa.Engine = request.getfixturevalue(f"{kind}_engine")
    ensures: list[Callable[[], None]] = [
        SqlOutboundWebhookStore(engine).ensure_schema,
        SqlWorkflowStore(engine).ensure_schema,
        SqlCallbackStore(engine).ensure_schema,
    ]
    for ensure in ensures:
        ensure()
    tables = [
        "harvest_webhook_deliveries",
        "harvest_outbox",
        "harvest_workflow_executions",
        "harvest_completion_deliveries",
    ]
    with engine.begin() as conn:
        for table in tables:
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN trace_context")
    assert all("trace_context" not in _columns(engine, table) for table in tables)
    for ensure in ensures:
        ensure()
    assert all("trace_context" in _columns(engine, table) for table in tables)


def _columns(engine: sa.Engine, table: str) -> set[str]:
    return {column["name"] for column in sa.inspect(engine).get_columns(table)}


_CARRIERS = st.one_of(
    st.text(max_size=200),
    st.builds(
        json.dumps,
        st.dictionaries(
            st.sampled_from(["traceparent", "tracestate", "baggage", ""]),
            st.one_of(st.text(max_size=80), st.integers(), st.none(), st.lists(st.text(max_size=5))),
        ),
    ),
    st.builds(
        lambda trace_id, span_id, flags: json.dumps({"traceparent": f"00-{trace_id}-{span_id}-{flags}"}),
        st.text("0123456789abcdefXYZ", min_size=30, max_size=34),
        st.text("0123456789abcdef-", min_size=14, max_size=18),
        st.text("0123456789af", min_size=1, max_size=3),
    ),
)


@BUDGET
@given(stored=_CARRIERS)
def test_any_stored_text_is_read_as_a_context_or_ignored_never_raised(stored: str) -> None:
    """A stored trace context is data another process wrote: whatever it holds, reading it back
    gives a valid context or none, and a span can always start from it."""
    context = tracing._parent(stored)
    assert context is None or trace.get_current_span(context).get_span_context().is_valid
    with recording() as exporter:
        with tracing.process("t", "id", 1, stored):
            pass
        [span] = exporter.get_finished_spans()
    assert (span.parent is not None) == (context is not None)


def test_a_captured_context_reads_back_as_the_same_span() -> None:
    with recording(), tracer().start_as_current_span("request") as current:
        stored = tracing.capture()
    assert stored is not None
    context = tracing._parent(stored)
    assert context is not None
    assert trace.get_current_span(context).get_span_context().span_id == current.get_span_context().span_id


#: With the API but no tracer provider: a span is the inert one unless a span is current (one an
#: incoming request carried), whose trace the stored context still names.
_NO_PROVIDER = """
import json
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from flask_harvest import tracing

with tracing.span("alone") as alone:
    print(json.dumps({"alone": tracing.capture(), "inert": alone is tracing._NO_SPAN}))
incoming = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1))
with trace.use_span(NonRecordingSpan(incoming)):
    with tracing.span("carried") as carried:
        print(json.dumps({"carried": tracing.capture(), "inert": carried is tracing._NO_SPAN}))
"""


def test_without_a_provider_a_span_carries_an_incoming_trace_and_is_inert_otherwise() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _NO_PROVIDER], capture_output=True, text=True, timeout=60, check=True
    )
    alone, carried = (json.loads(line) for line in done.stdout.splitlines())
    assert alone == {"alone": None, "inert": True}
    assert carried["inert"] is False
    assert json.loads(carried["carried"])["traceparent"].startswith("00-" + f"{0x1234:032x}")
