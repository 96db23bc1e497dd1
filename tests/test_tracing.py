"""Traces of webhook deliveries with OpenTelemetry: one trace from the dispatch to every attempt,
a ``traceparent`` on every POST, and nothing changed or imported without the ``otel`` extra."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis
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
from flask_harvest.testing import CapturingReceiver, drain
from flask_harvest.webhooks.models import standard_secret
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .pipeline import make_app, rq_app, wait_final
from .tracing_support import named, recording, traceparent, tracer
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
#: delivers through the SQL store and prints what got imported and sent.
_WITHOUT_OTEL = """
import importlib.abc, json, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Block())
import sqlalchemy as sa
from flask import Flask
from flask_harvest import OutboundWebhookPlugin, WebhookSubscription, get_engine, tracing
from flask_harvest.testing import CapturingReceiver, drain
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

store = SqlOutboundWebhookStore(sa.create_engine(sys.argv[1]))
store.ensure_schema()
app = Flask("no_otel")
app.config.update(HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS=True)
OutboundWebhookPlugin(store, app)
with CapturingReceiver().start() as receiver, app.app_context():
    store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["a.*"], "s" * 32, id="sub_1"))
    [delivery_id] = get_engine().manager.dispatch("a.b", {"n": 1})
    drain(app)
    print(json.dumps({
        "enabled": tracing.ENABLED,
        "imported": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
        "state": store.get_delivery(delivery_id).state.value,
        "headers": sorted(receiver.requests[0].headers),
    }))
    get_engine().close()
"""


def test_without_the_otel_extra_nothing_is_imported_and_delivery_works(tmp_path: Path) -> None:
    """Without OpenTelemetry installed nothing changes: no import, no header, a normal delivery."""
    database = f"sqlite:///{tmp_path}/no_otel.db"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_WITHOUT_OTEL), database],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["enabled"] is False
    assert seen["imported"] == []
    assert seen["state"] == "delivered"
    assert "traceparent" not in seen["headers"] and "webhook-signature" in seen["headers"]


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
    app = rq_app(sql_store, redis_url)
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
    spans_file = tmp_path / "spans.jsonl"
    worker = start_worker(
        tmp_path,
        sql_store,
        redis_url,
        "--burst",
        app="tests.tracing_worker_app:create_app",
        env={"TEST_SPANS_FILE": str(spans_file)},
    )
    try:
        assert worker.wait(timeout=120) == 0, (tmp_path / "worker.log").read_text()
    finally:
        stop(worker, signal.SIGTERM)
    assert wait_final(sql_store, [delivery_id], timeout=10) == [DeliveryState.DELIVERED]
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
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
