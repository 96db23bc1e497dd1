"""Prometheus metrics of webhook deliveries: counters, the attempt histogram, the queue gauges on
every store, the guarded scrape route, and a real ``flask harvest worker`` counting in
multiprocess mode, scraped over HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path

import pytest
import redis
import requests
import sqlalchemy as sa
from flask import Flask
from hypothesis import given
from hypothesis import strategies as st
from werkzeug.wrappers import Response

from flask_harvest import (
    DeliveryState,
    OutboundWebhookHandler,
    WebhookSubscription,
    WebhookSubscriptionStatus,
    generate_secret,
    get_engine,
)
from flask_harvest.config import load_settings
from flask_harvest.errors import ConfigurationError
from flask_harvest.testing import CapturingReceiver, drain
from flask_harvest.webhooks.models import DeliveryLog, new_id, utcnow
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .live_server import live_server
from .metrics_support import delta, parse, value
from .pipeline import make_app, wait_final
from .properties import BUDGET, TEXT, quoted
from .worker_process import start_worker, stop

TOKEN = "metrics-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ROUTE = "/actuator/webhooks/metrics"
SECRET = generate_secret()
DELIVERY_STATES = ("pending", "inflight", "delivered", "dlq", "skipped")


def metrics_app(store: OutboundWebhookHandler, **config: object) -> Flask:
    """An app with metrics on, the actuator token set, and one attempt per delivery by default."""
    settings: dict[str, object] = {
        "HARVEST_METRICS": True,
        "HARVEST_ACTUATOR_TOKEN": TOKEN,
        "HARVEST_WEBHOOKS_MAX_ATTEMPTS": 1,
        **config,
    }
    return make_app(store, **settings)


def scrape(app: Flask, path: str = ROUTE) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = app.test_client().get(path, headers=AUTH)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.content_type.startswith("text/plain; version=")
    return parse(response.get_data(as_text=True))


def subscribe(store: OutboundWebhookHandler, url: str, sub_id: str) -> None:
    store.add_subscription(WebhookSubscription(url, ["order.*"], SECRET, id=sub_id))


# -- counters and gauges in one process --------------------------------------------------------


def test_deliveries_are_counted_by_outcome_and_timed(
    sql_store: SqlOutboundWebhookStore, receiver: CapturingReceiver
) -> None:
    app = metrics_app(sql_store)
    receiver.handle("/bad", lambda _request: Response("no", status=500))
    subscribe(sql_store, receiver.url("/ok"), "sub_ok")
    subscribe(sql_store, receiver.url("/bad"), "sub_bad")
    subscribe(sql_store, receiver.url("/off"), "sub_off")
    sql_store.set_subscription_status("sub_off", WebhookSubscriptionStatus.DISABLED)
    before = scrape(app)
    with app.app_context():
        ids = [i for n in range(3) for i in get_engine().manager.dispatch("order.created", {"n": n})]
    drain(app)

    after = scrape(app)
    assert len(ids) == 6
    name = "harvest_webhook_delivery_attempts_total"
    assert delta(before, after, name, outcome="delivered") == 3
    assert delta(before, after, name, outcome="dead_lettered") == 3  # one attempt allowed, 500
    assert delta(before, after, name, outcome="failed") == 0
    finished = "harvest_webhook_deliveries_finished_total"
    assert delta(before, after, finished, outcome="delivered") == 3
    assert delta(before, after, finished, outcome="dead_lettered") == 3
    assert delta(before, after, finished, outcome="skipped") == 3  # the disabled subscription's: no attempt
    # Every attempt that made a request is timed; skips made none. Each 2xx times its dispatch.
    assert delta(before, after, "harvest_webhook_attempt_duration_seconds_count") == 6
    assert delta(before, after, "harvest_webhook_delivery_latency_seconds_count") == 3
    assert value(after, "harvest_webhook_dlq_size") == 3
    assert value(after, "harvest_webhook_queue_lag_seconds") == 0
    assert value(after, "harvest_metrics_store_up") == 1
    # The store's rows by state, read at scrape time.
    by_state = {state: value(after, "harvest_webhook_deliveries", state=state) for state in DELIVERY_STATES}
    assert by_state == {"pending": 0, "inflight": 0, "delivered": 3, "dlq": 3, "skipped": 3}
    # Bounded labels: the fixed outcomes and nothing else, however many deliveries and endpoints.
    series = {labels for (metric, labels) in after if metric == name}
    assert series == {(("outcome", outcome),) for outcome in ("delivered", "failed", "dead_lettered")}
    assert not [metric for (metric, _) in after if metric.endswith("_created")]
    subscriptions = {
        s: value(after, "harvest_webhook_subscriptions", status=s) for s in ("active", "disabled")
    }
    assert subscriptions == {"active": 2, "disabled": 1}
    # The local backend runs its jobs in this process: there are no worker processes to count.
    assert not [metric for (metric, _) in after if metric == "harvest_workers"]


def test_a_retry_counts_as_failed(sql_store: SqlOutboundWebhookStore, receiver: CapturingReceiver) -> None:
    app = metrics_app(sql_store, HARVEST_WEBHOOKS_MAX_ATTEMPTS=2)
    receiver.respond("/flaky", 503)
    subscribe(sql_store, receiver.url("/flaky"), "sub_flaky")
    before = scrape(app)
    with app.app_context():
        get_engine().manager.dispatch("order.created", {})
    drain(app, retries=True)
    after = scrape(app)
    name = "harvest_webhook_delivery_attempts_total"
    assert (
        delta(before, after, name, outcome="failed"),
        delta(before, after, name, outcome="delivered"),
        delta(before, after, "harvest_webhook_deliveries_finished_total", outcome="delivered"),
    ) == (1, 1, 1)


def test_a_delivery_dead_lettered_without_a_request_is_finished_not_attempted(
    sql_store: SqlOutboundWebhookStore, receiver: CapturingReceiver
) -> None:
    """An attempt counts a recorded attempt: a delivery past a lowered attempt limit is
    dead-lettered without a request, so it counts only as finished."""
    app = metrics_app(sql_store, HARVEST_SWEEP_INTERVAL_SECONDS=3600)
    subscribe(sql_store, receiver.url("/ok"), "sub_ok")
    row = DeliveryLog(
        id=new_id("dlv"), subscription_id="sub_ok", topic="order.created", payload="{}", attempt=3
    )
    sql_store.log_deliveries([row.replace(next_attempt_at=utcnow())])
    before = scrape(app)
    drain(app)
    after = scrape(app)
    assert sql_store.get_deliveries([row.id])[0].state is DeliveryState.DLQ
    assert delta(before, after, "harvest_webhook_delivery_attempts_total", outcome="dead_lettered") == 0
    assert delta(before, after, "harvest_webhook_deliveries_finished_total", outcome="dead_lettered") == 1
    assert receiver.requests == []


def test_a_subscription_turned_off_by_a_410_is_counted_and_shown(
    sql_store: SqlOutboundWebhookStore, receiver: CapturingReceiver
) -> None:
    app = metrics_app(sql_store)
    receiver.respond("/gone", 410)
    subscribe(sql_store, receiver.url("/gone"), "sub_gone")
    before = scrape(app)
    with app.app_context():
        get_engine().manager.dispatch("order.created", {})
    drain(app)
    after = scrape(app)
    assert delta(before, after, "harvest_webhook_subscriptions_turned_off_total", status="disabled") == 1
    assert delta(before, after, "harvest_webhook_subscriptions_turned_off_total", status="failed") == 0
    assert value(after, "harvest_webhook_subscriptions", status="disabled") == 1
    assert value(after, "harvest_webhook_subscriptions", status="active") == 0


def seed_queue(store: OutboundWebhookHandler, *, dead: int, waiting_seconds: float) -> list[str]:
    now = utcnow()
    rows = [
        DeliveryLog(
            id=new_id("dlv"), subscription_id="sub_1", topic="t", payload="{}", state=DeliveryState.DLQ
        )
        for _ in range(dead)
    ]
    rows += [
        DeliveryLog(
            id=new_id("dlv"),
            subscription_id="sub_1",
            topic="t",
            payload="{}",
            next_attempt_at=now - timedelta(seconds=seconds),
        )
        for seconds in (waiting_seconds, 1)
    ]
    rows.append(
        DeliveryLog(
            id=new_id("dlv"),
            subscription_id="sub_1",
            topic="t",
            payload="{}",
            next_attempt_at=now + timedelta(hours=1),
        )
    )
    store.log_deliveries(rows)
    return [row.id for row in rows]


def test_the_gauges_read_the_store_at_scrape_time(store: OutboundWebhookHandler) -> None:
    # The rows are logged, not dispatched, and the sweeper waits an hour: nothing sends them.
    app = metrics_app(store, HARVEST_SWEEP_INTERVAL_SECONDS=3600)
    assert value(scrape(app), "harvest_webhook_dlq_size") == 0
    ids = seed_queue(store, dead=4, waiting_seconds=120)

    samples = scrape(app)
    assert value(samples, "harvest_webhook_dlq_size") == 4
    # At least the 120 s the oldest due row has waited (the scrape comes later than the seeding).
    assert 120 <= value(samples, "harvest_webhook_queue_lag_seconds") < 3600
    by_state = {state: value(samples, "harvest_webhook_deliveries", state=state) for state in DELIVERY_STATES}
    assert by_state == {"pending": 3, "inflight": 0, "delivered": 0, "dlq": 4, "skipped": 0}
    text = app.test_client().get(ROUTE, headers=AUTH).get_data(as_text=True)
    assert not [i for i in ids if i in text]  # never a delivery id as a label


def test_a_count_stops_at_the_configured_limit(sql_store: SqlOutboundWebhookStore) -> None:
    """What a scrape reads is bounded: past HARVEST_METRICS_COUNT_LIMIT a series stays at it."""
    app = metrics_app(sql_store, HARVEST_SWEEP_INTERVAL_SECONDS=3600, HARVEST_METRICS_COUNT_LIMIT=2)
    seed_queue(sql_store, dead=4, waiting_seconds=10)
    samples = scrape(app)
    assert value(samples, "harvest_webhook_deliveries", state="dlq") == 2
    assert value(samples, "harvest_webhook_dlq_size") == 2
    assert value(samples, "harvest_webhook_deliveries", state="pending") == 2  # of 3
    with pytest.raises(ConfigurationError, match="HARVEST_METRICS_COUNT_LIMIT"):
        load_settings({"HARVEST_METRICS_COUNT_LIMIT": 0}, {})


def test_a_store_that_fails_still_answers_the_scrape(sqlite_engine: sa.Engine) -> None:
    store = SqlOutboundWebhookStore(sqlite_engine)
    app = metrics_app(store, HARVEST_SWEEP_INTERVAL_SECONDS=3600)
    with sqlite_engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE harvest_webhook_deliveries"))
    samples = scrape(app)
    assert value(samples, "harvest_metrics_store_up") == 0
    # What could not be read is left out, never shown as zeros that look healthy.
    assert ("harvest_webhook_dlq_size", ()) not in samples
    assert not [metric for (metric, _) in samples if metric == "harvest_webhook_deliveries"]


# -- the route ----------------------------------------------------------------------------------


def test_the_route_is_closed_like_the_actuator(sqlite_engine: sa.Engine) -> None:
    store = SqlOutboundWebhookStore(sqlite_engine)
    closed = make_app(store, HARVEST_METRICS=True).test_client()
    assert closed.get(ROUTE).status_code == 403  # no token, no authorizer: nobody
    client = metrics_app(SqlOutboundWebhookStore(sqlite_engine)).test_client()
    refused = client.get(ROUTE)
    assert refused.status_code == 401 and "harvest-metrics" in refused.headers["WWW-Authenticate"]
    assert client.get(ROUTE, headers={"Authorization": "Bearer " + "x" * len(TOKEN)}).status_code == 401
    assert client.get(ROUTE, headers=AUTH).status_code == 200
    assert client.post(ROUTE, headers=AUTH).status_code == 405


def test_metrics_are_off_unless_enabled(sqlite_engine: sa.Engine) -> None:
    client = make_app(SqlOutboundWebhookStore(sqlite_engine), HARVEST_ACTUATOR_TOKEN=TOKEN).test_client()
    assert client.get(ROUTE, headers=AUTH).status_code == 404


def test_a_path_of_its_own_and_an_unauthenticated_scrape(sqlite_engine: sa.Engine) -> None:
    store = SqlOutboundWebhookStore(sqlite_engine)
    app = metrics_app(store, HARVEST_METRICS_PATH="/metrics", HARVEST_METRICS_UNAUTHENTICATED=True)
    client = app.test_client()
    assert client.get("/metrics").status_code == 200
    assert client.get(ROUTE, headers=AUTH).status_code == 404


@pytest.mark.parametrize("path", ["metrics", "/a b", "/<int:x>", "/m?x", "/m#x"])
def test_a_metrics_path_must_be_plain(path: str) -> None:
    with pytest.raises(ConfigurationError, match="HARVEST_METRICS_PATH"):
        load_settings({"HARVEST_METRICS_PATH": path}, {})


@BUDGET
@given(
    method=st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PROPFIND"]),
    suffix=TEXT,
    query=TEXT,
    # Any header value a client can send: everything but a line break.
    authorization=st.one_of(
        st.none(), TEXT, st.just(AUTH["Authorization"]), TEXT.map("Bearer ".__add__)
    ).filter(lambda value: value is None or not {"\r", "\n"} & set(value)),
)
def test_no_request_to_the_route_gets_a_5xx(
    sqlite_engine: sa.Engine, method: str, suffix: str, query: str, authorization: str | None
) -> None:
    app = _property_app(sqlite_engine)
    headers = {"Authorization": authorization} if authorization is not None else {}
    path = ROUTE + quoted(suffix) + "?q=" + quoted(query)
    response = app.test_client().open(path, method=method, headers=headers)
    assert response.status_code < 500
    if response.status_code == 200 and method == "GET":
        assert authorization == AUTH["Authorization"]
        parse(response.get_data(as_text=True))  # a well-formed exposition


_property_apps: dict[str, Flask] = {}


def _property_app(engine: sa.Engine) -> Flask:
    # One app per database for the whole property test: hypothesis calls the body many times.
    key = str(engine.url)
    if key not in _property_apps:
        _property_apps.clear()
        _property_apps[key] = metrics_app(
            SqlOutboundWebhookStore(engine), HARVEST_SWEEP_INTERVAL_SECONDS=3600
        )
    return _property_apps[key]


def test_secrets_and_urls_never_reach_the_scrape(
    sql_store: SqlOutboundWebhookStore, receiver: CapturingReceiver
) -> None:
    app = metrics_app(sql_store)
    subscribe(sql_store, receiver.url("/ok?token=" + SECRET), "sub_secret")
    with app.app_context():
        ids = get_engine().manager.dispatch("order.created", {"card": "4242"})
    drain(app)
    text = app.test_client().get(ROUTE, headers=AUTH).get_data(as_text=True)
    for leak in (SECRET, TOKEN, "127.0.0.1", str(receiver.port), "sub_secret", "4242", *ids):
        assert leak not in text


def test_importing_needs_no_prometheus_client_and_enabling_says_what_to_install(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["prometheus_client"] = None  # as if it were not installed
        from flask import Flask
        from flask_harvest import InMemoryOutboundWebhookHandler, OutboundWebhookPlugin
        from flask_harvest.errors import ConfigurationError

        OutboundWebhookPlugin(InMemoryOutboundWebhookHandler(), Flask("off"))
        try:
            app = Flask("on")
            app.config["HARVEST_METRICS"] = True
            OutboundWebhookPlugin(InMemoryOutboundWebhookHandler(), app)
        except ConfigurationError as exc:
            print(exc)
        else:
            print("no error")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env={**os.environ}
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'flask-harvest[metrics]'" in done.stdout
    assert "prometheus_client" in done.stdout


# -- a worker process, scraped over HTTP ---------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def get_when_up(url: str) -> requests.Response:
    """GET ``url`` once its server listens (the worker starts it after loading the app)."""
    for _ in range(300):
        try:
            return requests.get(url, timeout=10)
        except requests.ConnectionError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens at {url}")


def test_metrics_port_needs_metrics(sqlite_engine: sa.Engine) -> None:
    app = make_app(SqlOutboundWebhookStore(sqlite_engine), HARVEST_JOBS_BACKEND="rq")
    result = app.test_cli_runner().invoke(args=["harvest", "worker", "--metrics-port", "9"])
    assert result.exit_code == 2
    assert "--metrics-port needs HARVEST_METRICS = True" in result.output


Serve = Callable[[Flask], str]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Serve an app on 127.0.0.1 from a thread until the test ends; return its base URL."""
    with ExitStack() as servers:
        yield lambda app: servers.enter_context(live_server(app)).url


@pytest.mark.redis
def test_a_worker_process_counts_and_the_app_scrapes_it_over_http(
    sql_store: SqlOutboundWebhookStore,
    redis_conn: redis.Redis,
    redis_url: str,
    receiver: CapturingReceiver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    serve: Serve,
) -> None:
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    # This process scrapes what the worker's process wrote (its own counters stay in its memory:
    # prometheus_client was imported here before the variable was set).
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(multiproc))
    app = metrics_app(sql_store, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)
    receiver.handle("/bad", lambda _request: Response("no", status=500))
    subscribe(sql_store, receiver.url("/ok"), "sub_ok")
    sql_store.add_subscription(WebhookSubscription(receiver.url("/bad"), ["refund.*"], SECRET, id="sub_bad"))
    with app.app_context():
        ok = [get_engine().manager.dispatch("order.created", {"n": n})[0] for n in range(3)]
        bad = [get_engine().manager.dispatch("refund.created", {"n": n})[0] for n in range(2)]

    port = free_port()
    worker = start_worker(
        tmp_path,
        sql_store,
        redis_url,
        "--metrics-port",
        str(port),
        config={"HARVEST_METRICS": True, "HARVEST_WEBHOOKS_MAX_ATTEMPTS": 1},
        env={"PROMETHEUS_MULTIPROC_DIR": str(multiproc)},
    )
    try:
        wait_final(sql_store, ok + bad, timeout=60)
        assert [d.state for d in sql_store.get_deliveries(ok + bad)].count(DeliveryState.DELIVERED) == 3
        assert {d.id for d in sql_store.get_deliveries(ok + bad) if d.state is DeliveryState.DLQ} == set(bad)
        # The worker's own scrape target (unauthenticated, on 127.0.0.1) ...
        from_worker = parse(get_when_up(f"http://127.0.0.1:{port}/").text)
        # ... and the web app's route, which adds up every process of the directory.
        base = serve(app)
        response = requests.get(base + ROUTE, headers=AUTH, timeout=10)
        assert response.status_code == 200
        from_app = parse(response.text)
    finally:
        stop(worker, signal.SIGTERM)
    assert [p for p in multiproc.iterdir() if p.suffix == ".db"], "the worker wrote no metric files"
    for samples in (from_worker, from_app):
        name = "harvest_webhook_delivery_attempts_total"
        assert value(samples, name, outcome="delivered") == 3
        assert value(samples, name, outcome="dead_lettered") == 2
        assert value(samples, "harvest_webhook_attempt_duration_seconds_count") == 5
        assert value(samples, "harvest_webhook_dlq_size") == 2
    assert requests.get(base + ROUTE, timeout=10).status_code == 401


def test_a_multiprocess_directory_that_is_missing_is_refused(
    sqlite_engine: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "missing"))
    with pytest.raises(ConfigurationError, match="PROMETHEUS_MULTIPROC_DIR"):
        metrics_app(SqlOutboundWebhookStore(sqlite_engine))


def test_workers_without_a_multiprocess_directory_are_warned_about(
    sqlite_engine: sa.Engine,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics_app(
        SqlOutboundWebhookStore(sqlite_engine), HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url
    )
    assert any("PROMETHEUS_MULTIPROC_DIR is not set" in r.getMessage() for r in caplog.records)
