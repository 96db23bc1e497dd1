"""Completion callbacks end to end: a Flask app on SQLite and PostgreSQL, its workers (the local
backend's threads), and a real HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any

import pytest
import redis
import sqlalchemy as sa
import standardwebhooks
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from hypothesis import given
from hypothesis import strategies as st
from werkzeug import Request, Response

from flask_harvest import Harvest, get_engine, signals
from flask_harvest.callbacks import (
    CALLBACK_JOB,
    CallbackPolicy,
    CallbackTargetRejected,
    CompletionCallbacks,
    CompletionDelivery,
    build_envelope,
    parse_allowlist,
)
from flask_harvest.callbacks._schema import CALLBACK_TABLES
from flask_harvest.callbacks.service import endpoint_of
from flask_harvest.errors import ConfigurationError
from flask_harvest.jobs.rq import RqBackend
from flask_harvest.outbound.admission import INITIAL_LIMIT
from flask_harvest.outbound.transport import Transport
from flask_harvest.receiver import verify_completion_callback
from flask_harvest.testing import CapturingReceiver
from flask_harvest.worker import DeliveryPool, HarvestWorker, delivery_pool
from flask_harvest.workflows.context import WorkflowContext
from flask_harvest.workflows.models import TERMINAL_STATES, ExecutionState, utcnow
from flask_harvest.workflows.service import WorkflowService

from .pipeline import close_later
from .properties import BODY_TEXTS, BUDGET, DATETIME_TEXTS, TEXT
from .workflow_support import SQL_KINDS

SECRET = "cb-SECRET-CANARY-5e1d9a"
TOKEN = "admin-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(params=SQL_KINDS)
def db_url(request: pytest.FixtureRequest) -> str:
    engine: sa.Engine = request.getfixturevalue(f"{request.param}_engine")
    return engine.url.render_as_string(hide_password=False)


AppFactory = Callable[..., Flask]


@pytest.fixture
def make_app(db_url: str) -> AppFactory:
    def factory(**config: Any) -> Flask:
        app = Flask("callbacks_test")
        app.config.update(
            SQLALCHEMY_DATABASE_URI=db_url,
            HARVEST_ACTUATOR_TOKEN=TOKEN,
            HARVEST_COMPLETION_CALLBACK_ALLOWLIST="127.0.0.1",
            HARVEST_COMPLETION_CALLBACK_ALLOW_PRIVATE_TARGETS=True,
            HARVEST_COMPLETION_CALLBACK_SECRET=SECRET,
            HARVEST_SWEEP_INTERVAL_SECONDS=0.2,
        )
        app.config.update({f"HARVEST_{k.upper()}": v for k, v in config.items()})
        db = SQLAlchemy()
        db.init_app(app)
        workflows = Harvest(db=db)

        @workflows.workflow("echo")
        def echo(ctx: WorkflowContext, data: Any) -> Any:
            return {"echo": data}

        @workflows.workflow("boom")
        def boom(ctx: WorkflowContext, data: Any) -> Any:
            raise RuntimeError("boom")

        @workflows.workflow("nap")
        def nap(ctx: WorkflowContext, data: Any) -> Any:
            ctx.sleep(timedelta(hours=1))
            return None

        try:
            workflows.init_app(app)
        except Exception:
            # init_app stopped the engine it built; the app's own engine is the test's to free.
            assert "harvest" not in app.extensions
            with app.app_context():
                db.engine.dispose()
            raise
        return close_later(app)

    return factory


def callbacks_of(app: Flask) -> CompletionCallbacks:
    callbacks = get_engine(app).callbacks
    assert callbacks is not None
    return callbacks


def service_of(app: Flask) -> WorkflowService:
    service = get_engine(app).workflows
    assert service is not None
    return service


def wait(predicate: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def rows(app: Flask, execution_id: str) -> list[CompletionDelivery]:
    return callbacks_of(app).deliveries(execution_id)


def settled(
    app: Flask, execution_id: str, count: int, *states: str, attempts: int = 1
) -> list[CompletionDelivery]:
    """Wait until the execution has ``count`` deliveries in ``states``, each attempted at least
    ``attempts`` times."""

    def look() -> list[CompletionDelivery] | None:
        found = rows(app, execution_id)
        ok = len(found) == count and all(r.wire_state in states and r.attempts >= attempts for r in found)
        return found if ok else None

    result: list[CompletionDelivery] = wait(look, f"{count} deliveries in {states}")
    return result


def target(receiver: CapturingReceiver, path: str, kind: str = "AnyTerminal", **data: Any) -> dict[str, Any]:
    return {"url": receiver.url(path), "filter": {"type": kind, **data}}


def napping(app: Flask, callbacks: list[dict[str, Any]]) -> str:
    """Start a run that sleeps for an hour (open, not due) and return its id."""
    handle, _ = service_of(app).start("nap", None, completion_callbacks=callbacks)
    wait(lambda: service_of(app).get(handle.execution_id).next_run_at is not None, "the run to sleep")
    return handle.execution_id


# -- registration and enqueue ----------------------------------------------------------------------


def test_each_terminal_state_against_each_filter(make_app: AppFactory, receiver: CapturingReceiver) -> None:
    app = make_app()
    store = service_of(app).store
    targets = [
        target(receiver, "/any"),
        target(receiver, "/completed", "CompletedOnly"),
        target(receiver, "/failed-or-timed-out", "States", data=["Failed", "TimedOut"]),
    ]
    fired: dict[ExecutionState, set[str]] = {}
    for state in TERMINAL_STATES:
        execution_id = napping(app, targets)
        output = {"ok": True} if state is ExecutionState.COMPLETED else None
        error = None if state is ExecutionState.COMPLETED else f"ended {state.value}"
        assert store.finish(execution_id, state, output=output, error=error, now=utcnow()) is not None
        found = rows(app, execution_id)
        fired[state] = {r.target_url.rsplit("/", 1)[1] for r in found}
        settled(app, execution_id, len(found), "DELIVERED")
    assert fired == {
        ExecutionState.COMPLETED: {"any", "completed"},
        ExecutionState.FAILED: {"any", "failed-or-timed-out"},
        ExecutionState.CANCELLED: {"any"},
        ExecutionState.TIMED_OUT: {"any", "failed-or-timed-out"},
        ExecutionState.TERMINATED: {"any"},
    }
    got = [json.loads(r.body) for r in receiver.requests]
    assert sorted((g["state"], p.path) for g, p in zip(got, receiver.requests, strict=True)) == sorted(
        (s.value, f"/{name}") for s, names in fired.items() for name in names
    )


def test_a_completed_run_delivers_the_exact_signed_envelope(
    make_app: AppFactory, receiver: CapturingReceiver
) -> None:
    app = make_app()
    handle, _ = service_of(app).start(
        "echo",
        {"n": 1, "s": "é"},
        workflow_id="refund-r-123",
        completion_callbacks=[target(receiver, "/hook")],
    )
    [request] = receiver.wait_for(1, timeout=20)
    execution = service_of(app).get(handle.execution_id)
    [row] = settled(app, handle.execution_id, 1, "DELIVERED")
    assert request.body == build_envelope(row.delivery_id, execution) == row.body.encode()
    assert list(json.loads(request.body)) == [
        "delivery_id", "execution_id", "workflow_name", "workflow_id", "state", "result", "completed_at",
    ]  # fmt: skip
    data = json.loads(request.body)
    assert data["result"] == {"echo": {"n": 1, "s": "é"}} and data["workflow_id"] == "refund-r-123"
    expected = "sha256=" + hmac.new(SECRET.encode(), request.body, hashlib.sha256).hexdigest()
    assert request.headers["x-harvest-signature"] == expected
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", request.headers["x-harvest-timestamp"])
    assert verify_completion_callback(SECRET, request.body, headers=request.headers, tolerance_seconds=300)
    # The Standard Webhooks headers: a receiver's own library checks the signed id and time.
    assert request.headers["webhook-id"] == row.delivery_id
    assert standardwebhooks.Webhook(SECRET.encode()).verify(request.body, dict(request.headers)) == data
    assert row.attempts == 1 and row.last_status == 200


@pytest.mark.redis
def test_under_rq_the_worker_thread_that_ends_a_run_makes_the_first_attempt(
    make_app: AppFactory, receiver: CapturingReceiver, redis_url: str, redis_conn: redis.Redis
) -> None:
    """The fast path under a real RQ worker: the runner's thread that ends the run (in
    ``flask harvest worker``) makes the callback's first attempt itself, with no callback job."""
    app = make_app(jobs_backend="rq", redis_url=redis_url)
    backend = get_engine(app).backend
    assert isinstance(backend, RqBackend)
    ended_on: list[int] = []
    attempted_on: list[int] = []
    service_of(app).store.hooks.register(lambda conn, execution: ended_on.append(threading.get_ident()))

    def delivered(sender: Flask, delivery: CompletionDelivery, **extra: Any) -> None:
        attempted_on.append(threading.get_ident())

    signals.completion_callback_delivered.connect(delivered, app)
    try:
        with app.app_context():
            handle, _ = service_of(app).start("echo", 1, completion_callbacks=[target(receiver, "/hook")])
            HarvestWorker([backend.queue], connection=backend.connection, app=app).work(burst=True)
            # The job handed the run to the runner's threads, which may outlive the burst.
            handle.result(timeout=30)
        # Without the fast path a callback job would wait in the queue for a worker that is gone
        # (this never settles), or the burst worker's own thread would have made the attempt.
        [row] = settled(app, handle.execution_id, 1, "DELIVERED")
    finally:
        signals.completion_callback_delivered.disconnect(delivered, app)
    assert row.attempts == 1 and len(ended_on) == 1
    assert attempted_on == ended_on  # the same thread
    assert backend.queue.count == 0


def test_a_failed_run_sends_its_error(make_app: AppFactory, receiver: CapturingReceiver) -> None:
    app = make_app()
    handle, _ = service_of(app).start("boom", None, completion_callbacks=[target(receiver, "/hook")])
    [request] = receiver.wait_for(1, timeout=20)
    data = json.loads(request.body)
    assert data["state"] == "Failed" and "result" not in data and "boom" in data["error"]
    assert data["execution_id"] == handle.execution_id


def test_defaults_union_and_deduplication(make_app: AppFactory, receiver: CapturingReceiver) -> None:
    defaults = [target(receiver, "/shared"), target(receiver, "/default", "CompletedOnly")]
    app = make_app(completion_callback_defaults=defaults)
    callbacks_of(app).add_default(receiver.url("/python"), {"type": "AnyTerminal"})
    own = [
        target(receiver, "/own"),
        target(receiver, "/shared"),
        target(receiver, "/shared", "CompletedOnly"),
    ]
    execution_id = napping(app, own)
    stored = service_of(app).get(execution_id).completion_callbacks
    assert [(t["callback_index"], t["url"].rsplit("/", 1)[1], t["filter"]["type"]) for t in stored] == [
        (0, "own", "AnyTerminal"),
        (1, "shared", "AnyTerminal"),
        (2, "shared", "CompletedOnly"),
        (3, "default", "CompletedOnly"),
        (4, "python", "AnyTerminal"),
    ]
    # A run without targets of its own still gets the defaults.
    plain = napping(app, [])
    assert len(service_of(app).get(plain).completion_callbacks) == 3


def test_no_target_means_no_rows(make_app: AppFactory, receiver: CapturingReceiver) -> None:
    app = make_app()
    handle, _ = service_of(app).start("echo", 1)
    wait(lambda: service_of(app).get(handle.execution_id).terminal, "the run to end")
    assert service_of(app).get(handle.execution_id).completion_callbacks is None
    assert rows(app, handle.execution_id) == []
    with callbacks_of(app).store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(CALLBACK_TABLES[0])).scalar() == 0


def test_rerunning_the_terminal_hooks_enqueues_nothing_new(
    make_app: AppFactory, receiver: CapturingReceiver
) -> None:
    app = make_app()
    execution_id = napping(app, [target(receiver, "/a"), target(receiver, "/b")])
    store = service_of(app).store
    store.finish(execution_id, ExecutionState.COMPLETED, output=1, now=utcnow())
    before = settled(app, execution_id, 2, "DELIVERED")
    execution = service_of(app).get(execution_id)
    with store.engine.begin() as conn:
        store.hooks.run(conn, execution)
        store.hooks.run(conn, execution)
    assert store.finish(execution_id, ExecutionState.FAILED, error="again", now=utcnow()) is None
    after = rows(app, execution_id)
    assert [(r.delivery_id, r.state, r.attempts) for r in after] == [
        (r.delivery_id, r.state, r.attempts) for r in before
    ]
    assert len(receiver.requests) == 2


def test_a_bad_default_fails_init_app(make_app: AppFactory) -> None:
    with pytest.raises(ConfigurationError, match="HARVEST_COMPLETION_CALLBACK_DEFAULTS"):
        make_app(completion_callback_defaults=[{"url": "https://evil.net/h"}])
    with pytest.raises(ConfigurationError, match="HARVEST_COMPLETION_CALLBACK_DEFAULTS"):
        make_app(completion_callback_defaults="not json")
    with pytest.raises(ConfigurationError, match="HARVEST_COMPLETION_CALLBACK_ALLOWLIST"):
        make_app(completion_callback_allowlist="*.")


def test_a_refused_target_refuses_the_start(make_app: AppFactory) -> None:
    app = make_app()
    for url in ("https://169.254.169.254/latest", "http://10.0.0.1/h", "https://user:pw@127.0.0.1/"):
        with pytest.raises(CallbackTargetRejected) as caught:
            service_of(app).start("echo", 1, completion_callbacks=[{"url": url}])
        assert caught.value.http_status == 422 and caught.value.rejection is not None
    assert service_of(app).list_executions()[0] == []


def test_admin_routes_answer_a_refused_target_with_422_and_the_rejection(make_app: AppFactory) -> None:
    from flask import Blueprint

    from flask_harvest.http.admin import install_admin_api

    app = make_app()
    probe = Blueprint("probe", __name__)
    install_admin_api(probe, realm="probe")

    @probe.post("/start")
    def start() -> Any:
        service_of(app).start("echo", 1, completion_callbacks=[{"url": "https://[::ffff:127.0.0.1]/h"}])
        return {}

    app.register_blueprint(probe, url_prefix="/probe")
    response = app.test_client().post("/probe/start", headers=AUTH)
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert error["code"] == "callback_target_rejected"
    assert error["rejection"]["type"] == "HostNotAllowed"


def test_a_target_no_longer_allowed_at_enqueue_is_skipped_with_a_warning(
    make_app: AppFactory, receiver: CapturingReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    execution_id = napping(app, [target(receiver, "/gone"), target(receiver, "/kept")])
    callbacks = callbacks_of(app)
    with caplog.at_level(logging.WARNING, logger="flask_harvest"):
        # The operator tightened the policy after the run registered its targets.
        callbacks.policy = CallbackPolicy(parse_allowlist("*.example.com"), allow_private=True)
        ended = service_of(app).store.finish(execution_id, ExecutionState.COMPLETED, output=1, now=utcnow())
    assert ended is not None and ended.state is ExecutionState.COMPLETED
    assert rows(app, execution_id) == []
    skipped = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 2 and all(r.levelno == logging.WARNING for r in skipped)
    assert all(r.harvest["rejection"]["type"] == "HostNotAllowed" for r in skipped)  # type: ignore[attr-defined]


# -- outcomes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_a_permanent_4xx_fails_at_once_with_the_dead_letter_reason(
    make_app: AppFactory, receiver: CapturingReceiver, status: int
) -> None:
    app = make_app()
    receiver.respond("/hook", status)
    handle, _ = service_of(app).start("echo", 1, completion_callbacks=[target(receiver, "/hook")])
    [row] = settled(app, handle.execution_id, 1, "FAILED")
    assert (row.attempts, row.last_status) == (1, status)
    assert callbacks_of(app).store.dead_letter(row.delivery_id) == {
        "type": "CallbackDeliveryExhausted",
        "delivery_id": row.delivery_id,
        "attempts": 1,
        "last_status": status,
        "target": receiver.url("/hook"),
    }


@pytest.mark.parametrize(
    ("status", "retry_after"), [(408, None), (421, None), (425, None), (429, None), (413, "1")]
)
def test_transient_4xx_are_retried(
    make_app: AppFactory, receiver: CapturingReceiver, status: int, retry_after: str | None
) -> None:
    app = make_app()
    receiver.respond("/hook", status, headers={"Retry-After": retry_after} if retry_after else None)
    handle, _ = service_of(app).start("echo", 1, completion_callbacks=[target(receiver, "/hook")])
    [row] = settled(app, handle.execution_id, 1, "PENDING")
    assert (row.attempts, row.last_status) == (1, status)
    # The outcome's clock reads just before the record's: a few milliseconds apart.
    assert row.next_attempt_at is not None and row.next_attempt_at >= row.updated_at + timedelta(seconds=29)


@pytest.mark.parametrize("form", ["seconds", "http-date", "capped"])
def test_retry_after_floors_the_next_attempt(
    make_app: AppFactory, receiver: CapturingReceiver, form: str
) -> None:
    app = make_app(completion_callback_initial_backoff_ms=1000)
    when = datetime.now(timezone.utc) + timedelta(seconds=300)
    value = {"seconds": "300", "http-date": format_datetime(when, usegmt=True), "capped": "86400"}[form]
    receiver.respond("/hook", 503, headers={"Retry-After": value})
    handle, _ = service_of(app).start("echo", 1, completion_callbacks=[target(receiver, "/hook")])
    [row] = settled(app, handle.execution_id, 1, "PENDING")
    assert row.next_attempt_at is not None and row.attempts == 1
    delay = (row.next_attempt_at - row.updated_at).total_seconds()
    if form == "capped":
        assert delay == pytest.approx(900, abs=1)
    else:
        assert 290 <= delay <= 301


def test_exhaustion_leaves_the_row_failed_and_dead_lettered(
    make_app: AppFactory, receiver: CapturingReceiver
) -> None:
    app = make_app(completion_callback_max_attempts=3, completion_callback_initial_backoff_ms=1)
    receiver.respond("/hook", 500, times=10)
    dead: list[CompletionDelivery] = []
    signals.completion_callback_dead_lettered.connect(
        lambda sender, delivery: dead.append(delivery), weak=False
    )
    try:
        handle, _ = service_of(app).start("echo", 1, completion_callbacks=[target(receiver, "/hook")])
        [row] = settled(app, handle.execution_id, 1, "FAILED")
        # The signal follows the record's commit, on the attempt's thread: the row shows first.
        wait(lambda: dead, "the dead-letter signal")
    finally:
        signals.completion_callback_dead_lettered.receivers.clear()
    assert (row.attempts, row.last_status) == (3, 500)
    assert len(receiver.requests) == 3
    assert len({r.body for r in receiver.requests}) == 1
    reason = callbacks_of(app).store.dead_letter(row.delivery_id)
    assert reason is not None and reason["attempts"] == 3 and reason["type"] == "CallbackDeliveryExhausted"
    assert [d.delivery_id for d in dead] == [row.delivery_id]


# -- management API and redrive --------------------------------------------------------------------


def test_list_and_redrive_over_the_admin_api(make_app: AppFactory, receiver: CapturingReceiver) -> None:
    app = make_app()
    receiver.respond("/hook", 403)
    handle, _ = service_of(app).start(
        "echo", 1, completion_callbacks=[target(receiver, "/hook"), target(receiver, "/ok")]
    )
    execution_id = handle.execution_id
    wait(
        lambda: {r.wire_state for r in rows(app, execution_id)} == {"FAILED", "DELIVERED"},
        "one failed, one delivered",
    )
    client = app.test_client()
    base = f"/api/harvest/workflows/{execution_id}/completion-deliveries"
    assert client.get(base).status_code in (401, 403)
    listed = client.get(base, headers=AUTH).get_json()["deliveries"]
    assert [(d["callback_index"], d["state"]) for d in listed] == [(0, "FAILED"), (1, "DELIVERED")]
    assert all("body" not in d and "lease_token" not in d for d in listed)
    failed, delivered = listed[0]["delivery_id"], listed[1]["delivery_id"]
    first = [r.body for r in receiver.requests if r.path == "/hook"]
    signed = [
        (r.headers["x-harvest-signature"], r.headers["webhook-id"])
        for r in receiver.requests
        if r.path == "/hook"
    ]

    # A redrive takes a JSON body ({}), so a cross-site form or text/plain post cannot send one.
    for refused in (
        {},
        {"Content-Type": "text/plain"},
        {"Content-Type": "application/x-www-form-urlencoded"},
    ):
        response = client.post(f"{base}/{failed}/redrive", data="{}", headers={**AUTH, **refused})
        assert response.status_code == 415, response.get_data(as_text=True)
    assert [r.wire_state for r in rows(app, execution_id)] == ["FAILED", "DELIVERED"]
    response = client.post(f"{base}/{failed}/redrive", json={}, headers=AUTH)
    assert (response.status_code, response.get_json()) == (200, {"outcome": "redriven"})
    [row] = [r for r in settled(app, execution_id, 2, "DELIVERED") if r.delivery_id == failed]
    assert row.attempts == 1
    again = [r.body for r in receiver.requests if r.path == "/hook"]
    assert again == first * 2  # byte-identical, same delivery_id
    resent = [r for r in receiver.requests if r.path == "/hook"][-1]
    # The same X-Harvest-Signature and webhook-id; only the attempt's time (and what signs it) moved.
    assert (
        [(resent.headers["x-harvest-signature"], resent.headers["webhook-id"])]
        == signed
        == [(signed[0][0], failed)]
    )
    assert standardwebhooks.Webhook(SECRET.encode()).verify(resent.body, dict(resent.headers))
    assert callbacks_of(app).store.dead_letter(failed) is None

    response = client.post(f"{base}/{delivered}/redrive", json={}, headers=AUTH)
    assert (response.status_code, response.get_json()) == (200, {"outcome": "not_failed"})
    assert client.post(f"{base}/nope/redrive", json={}, headers=AUTH).status_code == 404
    other = f"/api/harvest/workflows/another-execution/completion-deliveries/{failed}/redrive"
    assert client.post(other, json={}, headers=AUTH).status_code == 404


# -- the CLI ---------------------------------------------------------------------------------------


def test_cli_list_redrive_aliases_and_bulk_redrive(make_app: AppFactory, receiver: CapturingReceiver) -> None:
    app = make_app()
    receiver.respond("/hook", 404, times=2)
    ids = []
    for _ in range(2):
        handle, _ = service_of(app).start("echo", 1, completion_callbacks=[target(receiver, "/hook")])
        ids.append(handle.execution_id)
    for execution_id in ids:
        settled(app, execution_id, 1, "FAILED")
    runner = app.test_cli_runner()
    result = runner.invoke(args=["harvest", "completion-delivery", "list", ids[0], "--json"])
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.output)["deliveries"]
    assert row["state"] == "FAILED"
    for alias in ("completion-deliveries", "callbacks"):
        result = runner.invoke(args=["harvest", alias, "list", ids[0], "--state", "delivered", "--json"])
        assert json.loads(result.output) == {"deliveries": []}
    result = runner.invoke(args=["harvest", "callbacks", "redrive", ids[0], "nope"])
    assert result.exit_code == 1 and result.output.startswith("Error:") and "Traceback" not in result.output
    result = runner.invoke(
        args=["harvest", "dlq", "redrive", "--queue", "completion-callback", "--window", "bad"]
    )
    assert result.exit_code == 2
    result = runner.invoke(
        args=["harvest", "dlq", "redrive", "--queue", "completion-callback", "--window", "0s", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["redriven"] == 2
    for execution_id in ids:
        settled(app, execution_id, 1, "DELIVERED")
    result = runner.invoke(args=["harvest", "completion-delivery", "redrive", ids[0], row["delivery_id"]])
    assert result.exit_code == 0 and "not_failed" in result.output


def test_bulk_redrive_spreads_attempts_over_the_window(
    make_app: AppFactory, receiver: CapturingReceiver
) -> None:
    app = make_app()
    receiver.respond("/hook", 401, times=4)
    ids = [
        service_of(app).start("echo", i, completion_callbacks=[target(receiver, "/hook")])[0].execution_id
        for i in range(4)
    ]
    for execution_id in ids:
        settled(app, execution_id, 1, "FAILED")
    before = datetime.now(timezone.utc)
    redriven = callbacks_of(app).redrive_failed(3600)
    due = sorted(r.next_attempt_at for r in redriven if r.next_attempt_at is not None)
    assert len(due) == 4
    offsets = [(d - before).total_seconds() for d in due]
    assert offsets[0] < 5 and 850 < offsets[1] < 950 and 1750 < offsets[2] < 1850 and 2650 < offsets[3] < 2750


# -- secrets ---------------------------------------------------------------------------------------


def test_the_secret_is_in_no_table_log_or_error(
    make_app: AppFactory, receiver: CapturingReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        app = make_app()
        receiver.respond("/hook", 500)
        receiver.respond("/bad", 400)
        handle, _ = service_of(app).start(
            "echo", 1, completion_callbacks=[target(receiver, "/hook"), target(receiver, "/bad")]
        )
        wait(
            lambda: {r.wire_state for r in rows(app, handle.execution_id)} == {"PENDING", "FAILED"},
            "attempts",
        )
        with pytest.raises(CallbackTargetRejected) as caught:
            service_of(app).start("echo", 1, completion_callbacks=[{"url": "https://nope.example/"}])
    assert SECRET not in str(caught.value) and SECRET not in json.dumps(caught.value.error_details())
    assert SECRET not in caplog.text
    assert SECRET not in repr(callbacks_of(app)) and SECRET not in repr(get_engine(app).settings)
    engine = callbacks_of(app).store.engine
    with engine.connect() as conn:
        names = [t for t in sa.inspect(engine).get_table_names() if t.startswith("harvest_")]
        for name in names:
            for db_row in conn.execute(sa.select(sa.Table(name, sa.MetaData(), autoload_with=conn))).all():
                assert SECRET not in json.dumps([str(v) for v in db_row]), name
    listed = app.test_client().get(
        f"/api/harvest/workflows/{handle.execution_id}/completion-deliveries", headers=AUTH
    )
    assert SECRET not in listed.get_data(as_text=True)


def test_redirects_are_not_followed(make_app: AppFactory, receiver: CapturingReceiver) -> None:
    app = make_app()
    receiver.respond("/moved", 302, headers={"Location": receiver.url("/elsewhere")})
    handle, _ = service_of(app).start("echo", 1, completion_callbacks=[target(receiver, "/moved")])
    [row] = settled(app, handle.execution_id, 1, "PENDING")
    assert (row.attempts, row.last_status) == (1, 302)
    assert [r.path for r in receiver.requests] == ["/moved"]


def pool_worker(app: Flask, pool: DeliveryPool) -> HarvestWorker:
    """A burst-ready ``flask harvest worker`` of ``app`` with ``pool`` (webhooks and callbacks)."""
    backend = get_engine(app).backend
    assert isinstance(backend, RqBackend)
    return HarvestWorker([backend.queue], connection=backend.connection, app=app, pool=pool)


@pytest.mark.redis
def test_the_per_endpoint_cap_holds_and_gives_back_without_using_attempts(
    make_app: AppFactory, receiver: CapturingReceiver, redis_url: str, redis_conn: redis.Redis
) -> None:
    """Callbacks run on the worker's pool, under its per-endpoint admission: a ceiling of one."""
    app = make_app(completion_callback_max_inflight_per_endpoint=1, jobs_backend="rq", redis_url=redis_url)
    lock = threading.Lock()
    state = {"now": 0, "peak": 0}

    def slow(_request: Request) -> Response:
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.3)
        with lock:
            state["now"] -= 1
        return Response("", status=200)

    receiver.handle("/capped", slow)
    # A run that never ran (its job waits in the queue), ended here: its four deliveries are jobs.
    handle, _ = service_of(app).start(
        "nap", None, completion_callbacks=[target(receiver, f"/capped?n={n}") for n in range(4)]
    )
    service_of(app).store.finish(handle.execution_id, ExecutionState.COMPLETED, output=1, now=utcnow())
    for _ in range(20):  # a delivery given back comes round again as a scheduled job
        with app.app_context():  # a worker stops its pool as it ends: each gets its own
            pool_worker(app, delivery_pool(app, concurrency=8)).work(burst=True, with_scheduler=True)
        if all(r.wire_state == "DELIVERED" for r in rows(app, handle.execution_id)):
            break
        time.sleep(1.0)  # RQ's scheduler works in whole seconds
    found = settled(app, handle.execution_id, 4, "DELIVERED")
    assert state["peak"] == 1
    assert [r.attempts for r in found] == [1, 1, 1, 1]  # a give-back uses no attempt


@pytest.mark.redis
def test_the_fast_path_in_a_pool_worker_goes_through_the_pools_admission(
    make_app: AppFactory, receiver: CapturingReceiver, redis_url: str, redis_conn: redis.Redis
) -> None:
    """The worker thread that ends a run makes the first attempt itself, admitted by the pool
    like any delivery: the receiver's "overloaded" cuts that endpoint's limit, as for webhooks."""
    app = make_app(jobs_backend="rq", redis_url=redis_url)
    receiver.respond("/busy", 503)
    ended_on: list[int] = []
    attempted_on: list[int] = []
    service_of(app).store.hooks.register(lambda conn, execution: ended_on.append(threading.get_ident()))

    def failed(sender: Flask, delivery: CompletionDelivery, **extra: Any) -> None:
        attempted_on.append(threading.get_ident())

    signals.completion_callback_failed.connect(failed, app)
    pool = delivery_pool(app, concurrency=8)
    try:
        with app.app_context():
            handle, _ = service_of(app).start("echo", 1, completion_callbacks=[target(receiver, "/busy")])
            pool_worker(app, pool).work(burst=True)
            handle.result(timeout=30)
        [row] = settled(app, handle.execution_id, 1, "PENDING")
    finally:
        signals.completion_callback_failed.disconnect(failed, app)
    assert (row.attempts, row.last_status) == (1, 503)
    assert attempted_on == ended_on and len(ended_on) == 1  # the same thread
    assert pool.limit(endpoint_of(row.target_url), CALLBACK_JOB) < INITIAL_LIMIT


# -- the connect-time guard (DNS rebinding) ------------------------------------------------------


def test_a_name_that_resolves_to_loopback_at_send_time_is_refused_unless_the_dev_setting_is_on(
    make_app: AppFactory, receiver: CapturingReceiver
) -> None:
    """Validation resolves no DNS: an allowlisted name that resolves to loopback when the POST is
    made (DNS rebinding) is refused by the transport's connect-time guard; the development setting
    lets it through."""
    app = make_app(
        completion_callback_allowlist="*.example.com",
        completion_callback_allow_http=True,
        completion_callback_allow_private_targets=False,
    )
    callbacks = callbacks_of(app)
    resolved: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        resolved.append(host)
        return ["127.0.0.1"]

    callbacks.transport = Transport(connect_timeout=5, read_timeout=5, deadline=10, resolver=rebinding)
    url = f"http://hooks.example.com:{receiver.port}/rebound"
    handle, _ = service_of(app).start("echo", 1, completion_callbacks=[{"url": url}])
    [row] = settled(app, handle.execution_id, 1, "FAILED")
    assert resolved == ["hooks.example.com"] and receiver.requests == []
    assert row.attempts == 1 and row.last_status is None
    assert row.last_error is not None and "loopback_address" in row.last_error
    assert callbacks.store.dead_letter(row.delivery_id) is not None

    # A name over plain http needs the http setting too: the development one opens only addresses.
    callbacks.policy = CallbackPolicy(parse_allowlist("*.example.com"), allow_http=True, allow_private=True)
    handle, _ = service_of(app).start("echo", 2, completion_callbacks=[{"url": url}])
    [request] = receiver.wait_for(1, timeout=20, path="/rebound")
    [row] = settled(app, handle.execution_id, 1, "DELIVERED")
    assert json.loads(request.body)["result"] == {"echo": 2}


@pytest.mark.parametrize("execution_id", ["%00", "a%00b", "x" * 300, "%F0%9F%92%A9", "%ED%A0%80"])
def test_hostile_ids_in_the_admin_routes_get_a_4xx_or_an_empty_list(
    make_app: AppFactory, execution_id: str
) -> None:
    app = make_app()
    client = app.test_client()
    listed = client.get(f"/api/harvest/workflows/{execution_id}/completion-deliveries", headers=AUTH)
    assert listed.status_code == 200 or 400 <= listed.status_code < 500, listed.get_data(as_text=True)
    if listed.status_code == 200:
        assert listed.get_json() == {"deliveries": []}
    redriven = client.post(
        f"/api/harvest/workflows/{execution_id}/completion-deliveries/{execution_id}/redrive", headers=AUTH
    )
    assert 400 <= redriven.status_code < 500, redriven.get_data(as_text=True)


def test_a_run_started_over_http_with_a_target_ends_and_the_receiver_verifies_the_envelope(
    make_app: AppFactory, receiver: CapturingReceiver
) -> None:
    # The "done when": the start route, a real receiver, the receiver-side check.
    client = make_app().test_client()
    response = client.post(
        "/api/harvest/workflows/echo/start",
        json={"input": {"n": 7}, "completion_callbacks": [target(receiver, "/http-hook", "CompletedOnly")]},
        headers=AUTH,
    )
    assert response.status_code == 201, response.get_json()
    [request] = receiver.wait_for(1, timeout=20)
    assert request.path == "/http-hook"
    assert verify_completion_callback(SECRET, request.body, headers=request.headers, tolerance_seconds=300)
    data = json.loads(request.body)
    assert data["execution_id"] == response.get_json()["execution_id"]
    assert data["state"] == "Completed" and data["result"] == {"echo": {"n": 7}}


def test_the_http_start_route_answers_422_with_the_rejection_and_starts_nothing(
    make_app: AppFactory,
) -> None:
    app = make_app()
    client = app.test_client()
    response = client.post(
        "/api/harvest/workflows/echo/start",
        json={"input": None, "completion_callbacks": [{"url": "https://evil.example.net/h"}]},
        headers=AUTH,
    )
    assert response.status_code == 422
    body = response.get_json()
    assert "HostNotAllowed" in json.dumps(body)
    page, _ = service_of(app).list_executions(limit=10)
    assert page == []


# -- hostile input on the admin routes (property) ---------------------------------------------------

#: Ids for the routes' path segments: the seeded ones (so some examples reach the store and
#: succeed), and hostile text: NUL, lone surrogates, far longer than an id column.
ADMIN_IDS = st.one_of(
    st.sampled_from(["{execution}", "{failed}", "{delivered}", "nope", "\x00", "\ud800", "x" * 300]),
    TEXT,
    st.text(min_size=65, max_size=2_000),
)
ADMIN_BODIES = st.one_of(
    st.none(), BODY_TEXTS.map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=64)
)
ADMIN_QUERIES = st.dictionaries(TEXT, TEXT | DATETIME_TEXTS, max_size=3)
ADMIN_CONTENT_TYPES = st.sampled_from(
    ["application/json", "text/plain", "application/x-www-form-urlencoded", ""]
)


def delivery_rows(app: Flask) -> list[list[tuple[Any, ...]]]:
    """Every row of the completion-callback tables, in key order."""
    with callbacks_of(app).store.engine.connect() as conn:
        return [
            [tuple(row) for row in conn.execute(sa.select(table).order_by(*table.primary_key.columns))]
            for table in CALLBACK_TABLES
        ]


def quoted(text: str) -> str:
    return urllib.parse.quote(text.encode("utf-8", "surrogatepass"), safe="")


def test_hostile_admin_requests_get_json_and_no_5xx_and_a_refusal_changes_no_row(
    make_app: AppFactory, receiver: CapturingReceiver, redis_conn: redis.Redis, redis_url: str
) -> None:
    # One FAILED and one DELIVERED row, delivered by a first app on the local backend...
    seeding = make_app()
    receiver.respond("/hook", 403)
    handle, _ = service_of(seeding).start(
        "echo", 1, completion_callbacks=[target(receiver, "/hook"), target(receiver, "/ok")]
    )
    execution_id = handle.execution_id
    wait(
        lambda: {r.wire_state for r in rows(seeding, execution_id)} == {"FAILED", "DELIVERED"},
        "one failed, one delivered",
    )
    failed, delivered = (r.delivery_id for r in rows(seeding, execution_id))
    get_engine(seeding).close()
    # ...then the app under test on RQ with no worker and no sweep: a redrive queues its job in
    # Redis and nothing changes a row behind an example's back.
    app = make_app(jobs_backend="rq", redis_url=redis_url, sweep_interval_seconds=3600)
    known = {"{execution}": execution_id, "{failed}": failed, "{delivered}": delivered}
    client = app.test_client()

    @BUDGET
    @given(
        redrive=st.booleans(),
        execution=ADMIN_IDS,
        delivery=ADMIN_IDS,
        query=ADMIN_QUERIES,
        body=ADMIN_BODIES,
        content_type=ADMIN_CONTENT_TYPES,
    )
    def example(
        redrive: bool,
        execution: str,
        delivery: str,
        query: dict[str, str],
        body: bytes | None,
        content_type: str,
    ) -> None:
        path = f"/api/harvest/workflows/{quoted(known.get(execution, execution))}/completion-deliveries"
        if redrive:
            path += f"/{quoted(known.get(delivery, delivery))}/redrive"
        query_string = "&".join(f"{quoted(k)}={quoted(v)}" for k, v in query.items())
        before = delivery_rows(app)
        response = client.open(
            f"{path}?{query_string}" if query_string else path,
            method="POST" if redrive else "GET",
            data=body,
            headers={**AUTH, **({"Content-Type": content_type} if content_type else {})},
        )
        assert response.status_code < 500, response.get_data(as_text=True)
        if 300 <= response.status_code < 400:
            # WSGI decodes %2F in the path, and Werkzeug redirects an empty segment ("//") to
            # the merged path: routing, before any route of ours runs.
            assert "//" in urllib.parse.unquote(path), path
            assert delivery_rows(app) == before
            return
        answer = response.get_json()
        assert isinstance(answer, dict), (path, response.get_data(as_text=True))
        if response.status_code >= 400:
            assert answer["error"]["message"]
            assert delivery_rows(app) == before
        elif redrive:
            assert answer["outcome"] in ("redriven", "not_failed")
        else:
            assert isinstance(answer["deliveries"], list)

    example()
