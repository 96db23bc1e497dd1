"""``flask harvest ...`` through ``app.test_cli_runner()``, on every store."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from click.testing import Result
from flask import Flask
from hypothesis import given
from hypothesis import strategies as st
from rq import Queue
from rq.job import Job

from flask_harvest import get_engine
from flask_harvest.jobs.base import row_id_of
from flask_harvest.jobs.rq import BATCH_TASK
from flask_harvest.webhooks.models import (
    AttemptResult,
    DeliveryAttempt,
    DeliveryLog,
    DeliveryState,
    WebhookSubscription,
    WebhookSubscriptionStatus,
    utcnow,
)
from flask_harvest.webhooks.operations import STATS_COUNT_CAP
from flask_harvest.webhooks.stores import InMemoryOutboundWebhookHandler, OutboundWebhookHandler
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .pipeline import before_first_update, make_app
from .properties import BUDGET, TEXT
from .test_actuator import dead_letters
from .workflow_support import SQL_KINDS

SECRET = "whsec_c2VjcmV0LW9mLXRoZS1jbGktdGVzdHMtMDEyMzQ1Njc4OQ=="
OTHER_SECRET = "whsec_YW5vdGhlci1zZWNyZXQtb2YtdGhlLWNsaS10ZXN0cy0wMTI="
URL = "http://127.0.0.1:9/hooks"
BASE = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)

Cli = Callable[..., Result]


@pytest.fixture
def app(store: OutboundWebhookHandler) -> Flask:
    return make_app(store, HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS=True)


@pytest.fixture
def cli(app: Flask) -> Cli:
    runner = app.test_cli_runner()

    def invoke(*args: str, input: str | None = None) -> Result:
        return runner.invoke(args=["harvest", *args], input=input)

    return invoke


def ok(result: Result) -> Result:
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result


def as_json(result: Result) -> Any:
    return json.loads(ok(result).stdout)


def fails(result: Result, *, code: int = 1) -> str:
    """Assert the command failed with ``code`` and one ``Error:`` line; return that line."""
    assert result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # not an uncaught exception
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.output
    if code == 1:  # not a usage error: the reason is all there is
        assert result.output.strip() == errors[0]
    return errors[0]


def add_subscription(store: OutboundWebhookHandler, subscription_id: str = "sub_a", **changes: Any) -> None:
    values: dict[str, Any] = {"target_url": URL, "event_topics": ["order.*"], "secret": SECRET}
    values.update(changes)
    store.add_subscription(WebhookSubscription(id=subscription_id, **values))


def log(
    store: OutboundWebhookHandler,
    delivery_id: str,
    *,
    subscription_id: str = "sub_a",
    state: DeliveryState = DeliveryState.DLQ,
    minutes: int = 0,
    **changes: Any,
) -> None:
    at = BASE + timedelta(minutes=minutes)
    values: dict[str, Any] = {
        "topic": "order.created",
        "payload": '{"order": 1}',
        "attempt": 5,
        "max_attempts": 5,
        "response_status": 500,
        "last_error": "HTTP 500",
        "timestamp": at,
        "created_at": at,
        "next_attempt_at": None,
    }
    values.update(changes)
    delivery = DeliveryLog(id=delivery_id, subscription_id=subscription_id, state=state, **values)
    assert store.log_deliveries([delivery]) == [delivery_id]


def assert_no_secret(result: Result) -> None:
    assert SECRET not in result.output
    assert OTHER_SECRET not in result.output


# -- the group -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("group", "commands"),
    [
        (
            (),
            [
                *("init-db", "subscriptions", "dlq", "deliveries", "purge", "stats", "sweep", "worker"),
                *("operational", "outbox", "completion-delivery", "workflows"),
                *("triggers", "event-types"),
            ],
        ),
        (("event-types",), ["list", "show", "rst"]),
        (
            ("subscriptions",),
            ["add", "list", "show", "enable", "disable", "rotate-secret", "remove", "update"],
        ),
        (("dlq",), ["list", "replay", "skip", "redrive"]),
        (("deliveries",), ["show"]),
        (
            ("workflows",),
            [
                "start",
                "list",
                "show",
                "steps",
                "result",
                "chain",
                "cancel",
                "terminate",
                "fork",
                "schedules",
                "queues",
                "children",
            ],
        ),
        (("workflows", "schedules"), ["pause", "resume"]),
    ],
)
def test_help_lists_every_command(cli: Cli, group: tuple[str, ...], commands: list[str]) -> None:
    text = ok(cli(*group, "--help")).output
    listed = [line.split()[0] for line in text.split("Commands:")[1].strip().splitlines()]
    assert sorted(listed) == sorted(commands), text


def test_the_completion_delivery_group_is_listed_once_and_answers_to_its_aliases(cli: Cli) -> None:
    listed = ok(cli("--help")).output.split("Commands:")[1]
    assert listed.count("completion-deliver") == 1 and "callbacks " not in listed
    for name in ("completion-delivery", "completion-deliveries", "callbacks"):
        assert "list" in ok(cli(name, "--help")).output


def test_init_db(cli: Cli, store: OutboundWebhookHandler) -> None:
    if not isinstance(store, SqlOutboundWebhookStore):
        assert "nothing to create" in ok(cli("init-db")).output
        return
    log(store, "dlv_1")
    attempts = sa.Table("harvest_webhook_attempts", sa.MetaData(), autoload_with=store.engine)
    attempts.drop(store.engine)
    # A missing table is a one-line error that says how to fix it...
    assert "ensure_schema" in fails(cli("deliveries", "show", "dlv_1"))
    assert "tables are in place" in ok(cli("init-db")).output
    ok(cli("init-db"))  # ...and init-db is safe to run again
    assert ok(cli("deliveries", "show", "dlv_1"))


def test_worker_needs_rq_and_sweep_runs(cli: Cli) -> None:
    assert "rq backend" in fails(cli("worker", "--burst"))
    assert "requeued 0 delivery(ies)" in ok(cli("sweep")).output


def _a_port(text: str) -> bool:
    """Whether click's ``--metrics-port`` takes ``text`` (``int()`` takes " 80" and "8_0" too)."""
    try:
        return 1 <= int(text) <= 65535
    except ValueError:
        return False


BAD_PORTS = st.one_of(
    st.integers(max_value=0), st.integers(min_value=65536), st.sampled_from([2**63, -(2**63)])
).map(str) | TEXT.filter(lambda text: not _a_port(text))
# What no IP address and no host name can be: a character neither has, an empty or overlong label,
# a label that starts or ends with '-', a name over 253 characters.
BAD_ADDRESSES = st.one_of(
    st.builds(
        "".join,
        st.tuples(
            st.text("ab1.:", max_size=6),
            st.sampled_from([" ", "/", "?", "#", "@", ",", "*", "..", "\n", "\x00", "\udcff", "\u202e", "é"]),
            st.text("ab1.:", max_size=6),
        ),
    ),
    st.sampled_from(["", ".", "-", "-a", "a-", "a.-b", "x" * 64, "a." * 127 + "a", "1.2.3.4:80", "::g"]),
)
BAD_METRICS_OPTIONS = st.one_of(
    BAD_PORTS.map(lambda port: ["--metrics-port", port]),
    st.tuples(st.integers(1024, 65535), BAD_ADDRESSES).map(
        lambda option: ["--metrics-port", str(option[0]), "--metrics-address", option[1]]
    ),
    BAD_ADDRESSES.map(lambda address: ["--metrics-address", address]),
)


@pytest.fixture
def metrics_app(redis_url: str) -> Flask:
    """An app whose worker may serve metrics: only the options stand in its way."""
    return make_app(
        InMemoryOutboundWebhookHandler(),
        HARVEST_METRICS=True,
        HARVEST_JOBS_BACKEND="rq",
        HARVEST_REDIS_URL=redis_url,
    )


@BUDGET
@given(options=BAD_METRICS_OPTIONS)
def test_bad_metrics_options_are_a_usage_error_and_start_nothing(
    metrics_app: Flask, redis_conn: redis.Redis, options: list[str]
) -> None:
    threads = set(threading.enumerate())
    # --burst: were the options taken, the worker would run and end with status 0.
    result = metrics_app.test_cli_runner().invoke(args=["harvest", "worker", "--burst", *options])
    error = fails(result, code=2)
    assert "--metrics-port" in error or "--metrics-address" in error
    assert "startup sweep" not in result.output  # the worker never started...
    assert redis_conn.keys("rq:*") == []  # ...nor registered in RQ
    assert set(threading.enumerate()) <= threads  # and no metrics server listens


# -- subscriptions ---------------------------------------------------------------------------------


def test_add_prints_the_generated_secret_once(cli: Cli, store: OutboundWebhookHandler) -> None:
    result = ok(cli("subscriptions", "add", URL, "--topic", "order.*", "--topic", "invoice.paid"))
    (created,) = store.list_subscriptions()
    assert created.event_topics == ("order.*", "invoice.paid")
    assert created.secret.startswith("whsec_")
    assert created.secret in result.output
    assert created.id in result.output
    assert "Store this secret now" in result.output
    for args in (["list"], ["show", created.id]):
        for extra in ([], ["--json"]):
            assert created.secret not in ok(cli("subscriptions", *args, *extra)).output


def test_add_json_with_given_secret_and_id(cli: Cli, store: OutboundWebhookHandler) -> None:
    args = [URL, "--topic", "order.created", "--secret", SECRET, "--id", "sub_x", "--description", "shop"]
    data = as_json(cli("subscriptions", "add", *args, "--json"))
    assert data["secret"] == SECRET
    assert data["id"] == "sub_x"
    assert data["target_url"] == URL
    assert data["event_topics"] == ["order.created"]
    assert data["status"] == "active"
    assert data["description"] == "shop"
    stored = store.get_subscription("sub_x")
    assert stored is not None and stored.secret == SECRET


def test_a_plain_secret_is_stored_and_shown_in_the_standard_form(
    cli: Cli, store: OutboundWebhookHandler
) -> None:
    # Issue 12, defect 3: standardwebhooks receivers cannot verify with a plain string.
    standard = "whsec_" + base64.b64encode(b"plain-cli-secret").decode()
    data = as_json(
        cli("subscriptions", "add", URL, "--topic", "a.b", "--secret", "plain-cli-secret", "--json")
    )
    assert data["secret"] == standard
    stored = store.get_subscription(data["id"])
    assert stored is not None and stored.secret == standard
    rotated = as_json(cli("subscriptions", "rotate-secret", data["id"], "--secret", "next-plain", "--json"))
    assert rotated["secret"] == "whsec_" + base64.b64encode(b"next-plain").decode()


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["not-a-url", "--topic", "a.b"], "target_url"),
        (["ftp://example.com/x", "--topic", "a.b"], "target_url"),
        ([URL, "--topic", "bad topic!"], "event_topics"),
        ([URL, "--topic", "a.b", "--secret", "whsec_!!not-base64!!"], "secret"),
        ([URL, "--topic", "a.b", "--id", "sub_a"], "already exists"),
        # One limit for the actuator and the CLI, the model's (issue 16, item 13).
        ([URL, "--topic", "a.b", "--description", "d" * 2049], "description"),
    ],
)
def test_add_refuses_bad_input(cli: Cli, store: OutboundWebhookHandler, args: list[str], reason: str) -> None:
    add_subscription(store)
    line = fails(cli("subscriptions", "add", *args))
    assert reason in line
    assert "not-base64" not in line  # a mistyped secret is not echoed
    assert len(store.list_subscriptions()) == 1


def test_add_applies_the_ssrf_policy(store: OutboundWebhookHandler) -> None:
    app = make_app(store, HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS=False)
    result = app.test_cli_runner().invoke(args=["harvest", "subscriptions", "add", URL, "--topic", "a.b"])
    assert "target_url" in fails(result)
    assert store.list_subscriptions() == []


def test_add_needs_a_topic(cli: Cli) -> None:
    assert "--topic" in fails(cli("subscriptions", "add", URL), code=2)


def test_list_and_show(cli: Cli, store: OutboundWebhookHandler) -> None:
    assert "no subscriptions" in ok(cli("subscriptions", "list")).output
    add_subscription(store, "sub_a", description="the shop")
    add_subscription(store, "sub_b", event_topics=["invoice.paid"])
    table = ok(cli("subscriptions", "list"))
    assert table.output.split()[:5] == ["id", "status", "failures", "topics", "url"]
    assert "sub_a" in table.output and "invoice.paid" in table.output
    assert_no_secret(table)
    listed = as_json(cli("subscriptions", "list", "--json"))
    assert [s["id"] for s in listed] == ["sub_a", "sub_b"]
    assert all("secret" not in s for s in listed)
    shown = ok(cli("subscriptions", "show", "sub_a"))
    assert "the shop" in shown.output and URL in shown.output
    assert_no_secret(shown)
    data = as_json(cli("subscriptions", "show", "sub_a", "--json"))
    assert data["id"] == "sub_a" and data["event_topics"] == ["order.*"]
    assert "secret" not in data
    assert "'sub_missing'" in fails(cli("subscriptions", "show", "sub_missing"))


def test_enable_and_disable(cli: Cli, store: OutboundWebhookHandler) -> None:
    add_subscription(store, status=WebhookSubscriptionStatus.FAILED, consecutive_failures=7)
    assert "is now active" in ok(cli("subscriptions", "enable", "sub_a")).output
    enabled = store.get_subscription("sub_a")
    assert enabled is not None and enabled.is_active and enabled.consecutive_failures == 0
    data = as_json(cli("subscriptions", "disable", "sub_a", "--json"))
    assert data["status"] == "disabled"
    assert "secret" not in data
    disabled = store.get_subscription("sub_a")
    assert disabled is not None and disabled.status is WebhookSubscriptionStatus.DISABLED
    fails(cli("subscriptions", "enable", "sub_missing"))
    fails(cli("subscriptions", "disable", "sub_missing"))


def test_rotate_secret(cli: Cli, store: OutboundWebhookHandler) -> None:
    add_subscription(store)
    result = ok(cli("subscriptions", "rotate-secret", "sub_a", "--grace-seconds", "3600"))
    rotated = store.get_subscription("sub_a")
    assert rotated is not None and rotated.secret != SECRET
    assert rotated.secret in result.output
    assert SECRET not in result.output  # the old secret is never printed
    assert "previous secret keeps signing deliveries until" in result.output
    assert rotated.previous_secret_expires_at is not None
    assert rotated.previous_secret_expires_at - utcnow() > timedelta(minutes=59)
    data = as_json(cli("subscriptions", "rotate-secret", "sub_a", "--secret", OTHER_SECRET, "--json"))
    assert data["secret"] == OTHER_SECRET
    assert data["id"] == "sub_a" and data["previous_secret_expires_at"]
    assert rotated.secret not in json.dumps(data)
    shown = ok(cli("subscriptions", "show", "sub_a"))
    assert OTHER_SECRET not in shown.output and rotated.secret not in shown.output


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["sub_missing"], 1),
        (["sub_a", "--grace-seconds", "-1"], 2),
        (["sub_a", "--grace-seconds", "nan"], 2),
        (["sub_a", "--grace-seconds", "1e300"], 2),
        (["sub_a", "--secret", "whsec_"], 1),
    ],
)
def test_rotate_secret_refuses_bad_input(
    cli: Cli, store: OutboundWebhookHandler, args: list[str], code: int
) -> None:
    add_subscription(store)
    fails(cli("subscriptions", "rotate-secret", *args), code=code)
    unchanged = store.get_subscription("sub_a")
    assert unchanged is not None and unchanged.secret == SECRET


def test_remove(cli: Cli, store: OutboundWebhookHandler) -> None:
    add_subscription(store, "sub_a")
    add_subscription(store, "sub_b")
    declined = cli("subscriptions", "remove", "sub_a", input="n\n")
    assert declined.exit_code == 1 and "Aborted" in declined.output
    assert store.get_subscription("sub_a") is not None
    assert "removed subscription sub_a" in ok(cli("subscriptions", "remove", "sub_a", input="y\n")).output
    assert store.get_subscription("sub_a") is None
    assert "removed subscription sub_b" in ok(cli("subscriptions", "remove", "sub_b", "--yes")).output
    assert store.list_subscriptions() == []
    assert "'sub_a'" in fails(cli("subscriptions", "remove", "sub_a", "--yes"))


# -- dead letters and deliveries -------------------------------------------------------------------


def test_dlq_list_pages_with_a_cursor(cli: Cli, store: OutboundWebhookHandler) -> None:
    long_error = "connection refused by the receiver after a very long explanation " * 3
    log(store, "dlv_1", minutes=1, last_error=long_error, response_body=SECRET)
    log(store, "dlv_2", minutes=2, attempt=3)
    log(store, "dlv_3", minutes=3, subscription_id="sub_b", topic="invoice.paid")
    log(store, "dlv_ok", minutes=4, state=DeliveryState.DELIVERED)
    first = ok(cli("dlq", "list", "--limit", "2"))
    header, *rows, more = first.output.strip().splitlines()
    assert header.split() == [
        "id",
        "subscription",
        "topic",
        "attempt",
        "status",
        "last",
        "error",
        "timestamp",
    ]
    assert [row.split()[0] for row in rows] == ["dlv_3", "dlv_2"]
    assert "3/5" in rows[1] and "500" in rows[1]
    assert more.startswith("more: --cursor ")
    second = ok(cli("dlq", "list", "--limit", "2", "--cursor", more.split()[-1]))
    assert "dlv_1" in second.output and "more:" not in second.output
    assert long_error not in second.output and "..." in second.output  # truncated in the table
    data = as_json(cli("dlq", "list", "--json"))
    assert data["next_cursor"] is None
    assert [d["id"] for d in data["deliveries"]] == ["dlv_3", "dlv_2", "dlv_1"]
    assert data["deliveries"][2]["last_error"] == long_error
    assert {"subscription_id", "topic", "attempt", "max_attempts", "response_status", "timestamp"} <= set(
        data["deliveries"][0]
    )
    assert SECRET not in second.output  # the response body is not in the table


def test_dlq_list_filters(cli: Cli, store: OutboundWebhookHandler) -> None:
    log(store, "dlv_1", minutes=1)
    log(store, "dlv_2", minutes=2, subscription_id="sub_b", topic="invoice.paid")
    by_subscription = as_json(cli("dlq", "list", "--subscription", "sub_b", "--json"))
    assert [d["id"] for d in by_subscription["deliveries"]] == ["dlv_2"]
    by_topic = as_json(cli("dlq", "list", "--topic", "order.created", "--json"))
    assert [d["id"] for d in by_topic["deliveries"]] == ["dlv_1"]
    assert "no matching deliveries" in ok(cli("dlq", "list", "--topic", "nothing")).output
    assert "cursor" in fails(cli("dlq", "list", "--cursor", "garbage"))
    fails(cli("dlq", "list", "--limit", "0"), code=2)


def cli_for(app: Flask) -> Cli:
    runner = app.test_cli_runner()

    def invoke(*args: str, input: str | None = None) -> Result:
        return runner.invoke(args=["harvest", *args], input=input)

    return invoke


@pytest.fixture
def rq_app(store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str) -> Flask:
    """An app on the rq backend and the test Redis, with no worker: jobs stay queued."""
    return make_app(
        store,
        HARVEST_JOBS_BACKEND="rq",
        HARVEST_REDIS_URL=redis_url,
        HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS=True,
    )


@pytest.fixture
def enqueued(rq_app: Flask, redis_conn: redis.Redis) -> Callable[[], list[str]]:
    """Return a function listing the delivery ids of the jobs waiting in the real RQ queue."""
    queue = Queue(get_engine(rq_app).settings.webhooks_queue, connection=redis_conn)

    def delivery_ids(job: Job) -> list[str]:
        if job.func_name == BATCH_TASK:  # (kind, batch id, the members' own job ids)
            return [row_id_of(member, job.args[0]) for member in job.args[2]]
        return [job.args[1]]  # (kind, delivery id)

    return lambda: sorted(i for job in queue.jobs for i in delivery_ids(job))


def test_replay_one(rq_app: Flask, store: OutboundWebhookHandler, enqueued: Callable[[], list[str]]) -> None:
    cli = cli_for(rq_app)
    add_subscription(store)
    log(store, "dlv_1")
    assert "replayed 1 delivery(ies)\ndlv_1" in ok(cli("dlq", "replay", "dlv_1")).output
    replayed = store.get_delivery("dlv_1")
    assert replayed is not None and replayed.state is DeliveryState.PENDING and replayed.attempt == 1
    assert enqueued() == ["dlv_1"]
    log(store, "dlv_2")
    data = as_json(cli("dlq", "replay", "dlv_2", "--json"))
    assert data == {
        "dry_run": False,
        "count": 1,
        "delivery_ids": ["dlv_2"],
        "results": [{"delivery_id": "dlv_2", "outcome": "replayed"}],
    }


def test_replay_bulk(rq_app: Flask, store: OutboundWebhookHandler, enqueued: Callable[[], list[str]]) -> None:
    cli = cli_for(rq_app)
    add_subscription(store, "sub_a")
    add_subscription(store, "sub_b")
    for n in range(4):
        log(store, f"dlv_{n}", minutes=n)
    log(store, "dlv_b", subscription_id="sub_b")
    dry = ok(cli("dlq", "replay", "--subscription", "sub_a", "--dry-run"))
    assert "would replay 4 delivery(ies)" in dry.output
    assert enqueued() == []
    still = store.get_delivery("dlv_0")
    assert still is not None and still.is_dlq
    window = ["--since", "2024-05-01T12:01:00Z", "--until", "2024-05-01T12:03:00"]  # naive = UTC
    data = as_json(cli("dlq", "replay", "--subscription", "sub_a", *window, "--dry-run", "--json"))
    assert data["dry_run"] is True and data["count"] == 2 and data["delivery_ids"] == ["dlv_2", "dlv_1"]
    assert {row["outcome"] for row in data["results"]} == {"would_replay"}
    result = ok(cli("dlq", "replay", "--subscription", "sub_a", "--limit", "3"))
    assert "replayed 3 delivery(ies)" in result.output
    assert enqueued() == ["dlv_1", "dlv_2", "dlv_3"]
    left = as_json(cli("dlq", "list", "--json"))
    assert sorted(d["id"] for d in left["deliveries"]) == ["dlv_0", "dlv_b"]


@pytest.mark.parametrize("store", SQL_KINDS, indirect=True)
def test_a_bulk_replay_lists_the_rows_it_did_not_replay_and_queues_the_others(
    rq_app: Flask, store: SqlOutboundWebhookStore, enqueued: Callable[[], list[str]]
) -> None:
    # Another operator replays dlv_1 after this call read the DLQ: before, it exited with an
    # error and dlv_2, already pending, was neither reported nor queued.
    cli = cli_for(rq_app)
    add_subscription(store)
    for n in range(3):
        log(store, f"dlv_{n}", minutes=n)

    with before_first_update(store.engine, lambda: store.replay_delivery("dlv_1", now=BASE)):
        result = ok(cli("dlq", "replay", "--subscription", "sub_a"))

    lines = result.output.splitlines()
    assert lines[:4] == ["replayed 2 delivery(ies)", "dlv_2", "dlv_0", "not replayed: 1"]
    assert lines[4].startswith("dlv_1  not_replayable: delivery 'dlv_1' is pending, not dead-lettered")
    assert enqueued() == ["dlv_0", "dlv_2"]


def test_replay_warns_when_the_backend_is_down(store: OutboundWebhookHandler) -> None:
    # Nothing listens on port 9: a real Redis client that cannot connect.
    down = make_app(store, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL="redis://127.0.0.1:9/0")
    log(store, "dlv_1")
    result = ok(cli_for(down)("dlq", "replay", "dlv_1", "--json"))
    assert "Warning: replayed, but not queued (Redis refused the jobs" in result.stderr
    data = json.loads(result.stdout)
    assert data["count"] == 1 and "Redis refused the jobs" in data["warning"]
    replayed = store.get_delivery("dlv_1")
    assert replayed is not None and replayed.state is DeliveryState.PENDING


@pytest.mark.parametrize(
    ("args", "code", "reason"),
    [
        ([], 2, "give LOG_ID"),
        (["dlv_1", "--subscription", "sub_a"], 2, "not both"),
        (["dlv_1", "--dry-run"], 2, "not both"),
        (["dlv_missing"], 1, "no delivery with id 'dlv_missing'"),
        (["dlv_done"], 1, ""),
        (["--subscription", "sub_missing"], 1, "'sub_missing'"),
        (["--since", "yesterday"], 2, "ISO 8601"),
        (["--since", "2024-05-02", "--until", "2024-05-01"], 1, "since"),
        (["--subscription", "sub_a", "--limit", "5000"], 2, "--limit"),
    ],
)
def test_replay_refuses(
    rq_app: Flask,
    store: OutboundWebhookHandler,
    enqueued: Callable[[], list[str]],
    args: list[str],
    code: int,
    reason: str,
) -> None:
    cli = cli_for(rq_app)
    add_subscription(store)
    log(store, "dlv_1")
    log(store, "dlv_done", state=DeliveryState.DELIVERED)
    assert reason in fails(cli("dlq", "replay", *args), code=code)
    assert enqueued() == []
    untouched = store.get_delivery("dlv_1")
    assert untouched is not None and untouched.is_dlq


def test_deliveries_show_with_attempts(cli: Cli, store: OutboundWebhookHandler) -> None:
    add_subscription(store)
    log(store, "dlv_1", state=DeliveryState.PENDING, attempt=1, next_attempt_at=BASE, last_error=None)
    claim = store.claim_delivery("dlv_1", now=BASE, lease_seconds=60, max_attempts=5)
    assert claim is not None
    error = "HTTP 503: \x1b[31mdown\x1b[0m\nretry later"
    attempt = DeliveryAttempt("dlv_1", 1, BASE, response_status=503, elapsed_ms=42, error=error)
    result = AttemptResult(
        DeliveryState.PENDING, 1, BASE + timedelta(minutes=1), error, BASE, attempt=attempt
    )
    store.finish_attempt("dlv_1", claim.lease_token, result)
    shown = ok(cli("deliveries", "show", "dlv_1"))
    assert "attempts:" in shown.output and "503" in shown.output and "42" in shown.output
    assert "\x1b" not in shown.output  # receivers' text cannot drive the terminal
    assert "HTTP 503: [31mdown [0m retry later" in shown.output
    assert_no_secret(shown)
    data = as_json(cli("deliveries", "show", "dlv_1", "--json"))
    assert data["id"] == "dlv_1" and data["state"] == "pending" and data["payload"] == '{"order": 1}'
    assert data["attempts"][-1]["response_status"] == 503
    assert data["attempts"][-1]["error"] == error
    assert "'dlv_missing'" in fails(cli("deliveries", "show", "dlv_missing"))


# -- maintenance -----------------------------------------------------------------------------------


def test_purge(cli: Cli, store: OutboundWebhookHandler) -> None:
    log(store, "dlv_old", state=DeliveryState.DELIVERED, minutes=-600 * 24 * 60)
    log(store, "dlv_old_dlq", minutes=-600 * 24 * 60)
    log(store, "dlv_new", state=DeliveryState.DELIVERED, timestamp=utcnow())
    declined = cli("purge", "--before", "2023-01-01T02:00:00+02:00", input="n\n")
    assert declined.exit_code == 1 and "Aborted" in declined.output  # it asks first
    assert store.get_delivery("dlv_old") is not None
    # Answered by --yes: click 8.2.0's test runner echoes a typed answer to stdout, which a real
    # terminal does not, and which would break the JSON document.
    data = as_json(cli("purge", "--before", "2023-01-01T02:00:00+02:00", "--json", "--yes"))
    assert data == {"removed": 1, "before": "2023-01-01T00:00:00Z"}
    assert store.get_delivery("dlv_old") is None
    assert store.get_delivery("dlv_old_dlq") is not None  # dead letters stay
    assert "removed 0 delivered log(s)" in ok(cli("purge", "--older-than", "3600", "--yes")).output
    assert "removed 1 delivered log(s)" in ok(cli("purge", "--older-than", "0", "--yes")).output
    assert store.get_delivery("dlv_new") is None


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ([], "exactly one"),
        (["--before", "2024-01-01", "--older-than", "5"], "exactly one"),
        (["--before", "2024-13-45"], "ISO 8601"),
        (["--before", ""], "ISO 8601"),
        (["--older-than", "-5"], "--older-than"),
    ],
)
def test_purge_refuses(cli: Cli, args: list[str], reason: str) -> None:
    assert reason in fails(cli("purge", *args), code=2)


def test_stats(cli: Cli, store: OutboundWebhookHandler) -> None:
    add_subscription(store)
    log(store, "dlv_1")
    log(store, "dlv_2", state=DeliveryState.DELIVERED)
    table = ok(cli("stats"))
    assert table.output.split()[:6] == ["subscription", "pending", "inflight", "delivered", "dlq", "skipped"]
    assert "(all)" in table.output and "sub_a" in table.output
    assert_no_secret(table)
    data = as_json(cli("stats", "--json"))
    assert data["overall"]["dlq_depth"] == 1
    assert data["subscriptions"]["sub_a"]["counts"]["delivered"] == 1
    assert data["overall"]["capped"]["dlq"] is False and "1+" not in table.output


def test_stats_show_a_capped_count_with_a_plus(cli: Cli, store: OutboundWebhookHandler) -> None:
    dead_letters(store, STATS_COUNT_CAP + 1, subscription_id="sub_a")
    table = ok(cli("stats")).output
    overall = next(line for line in table.splitlines() if line.startswith("(all)"))
    assert overall.split()[4] == f"{STATS_COUNT_CAP}+"
    data = as_json(cli("stats", "--json"))
    assert data["overall"]["counts"]["dlq"] == STATS_COUNT_CAP and data["overall"]["capped"]["dlq"] is True


def test_triggers_commands_say_in_one_line_that_the_app_has_no_triggers(cli: Cli) -> None:
    # The command list is the same for every app; an app without triggers says so.
    assert "completion triggers are off" in fails(cli("triggers", "list"))
