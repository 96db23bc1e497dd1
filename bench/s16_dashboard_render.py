"""S16: the render time of every console page with a history of 1,000,000 deliveries and as many
workflow executions (each with its steps, completion-callback delivery and trigger fire) in
PostgreSQL, through the Flask test client, signed in.

Each page is set against the same page on a history of 1,000 rows (``bench._history``, shared
with S13); renders alternate between the two databases. Pages that need an id open a real row of
the seeded history, the same position in both databases (the newest dead-lettered delivery, the
newest parent run, ...), so both render the same amount. Goal: every page's p95 <= 1.2x its p95
on 1,000 rows, and < 50 ms. The last row names the slowest page.
"""

from __future__ import annotations

import html
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from flask import Flask
from flask.testing import FlaskClient
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import CompletionTrigger, Harvest, get_engine
from flask_harvest._time import utcnow
from flask_harvest.workflows import WorkflowContext

from ._history import (
    CODE_TRIGGER_ID,
    PARENT_EVERY,
    PENDING,
    QUEUE,
    SMALL_HISTORY,
    STORED_TRIGGER_ID,
    WORKFLOWS,
    History,
    alternate,
    database_url,
    delivery_id,
    execution_id,
    seeded,
    subscription_id,
    waiting_execution_id,
)
from ._plans import captured, plans
from ._report import Context, Result, Row, percentile

ID = "S16"
TITLE = "console render time, every page, with 1M rows of history"
HISTORY = 1_000_000
RATIO_GOAL = 1.2
ABSOLUTE_GOAL_MS = 50.0
GOAL = f"<= {RATIO_GOAL}x on {SMALL_HISTORY:,} rows, < {ABSOLUTE_GOAL_MS:.0f} ms"
TOKEN = "bench-dashboard-token-0123456789"  # noqa: S105 (a local benchmark app's)
PREFIX = "/harvest"
#: A scheduled workflow, for the schedules page.
NIGHTLY = "bench_nightly"
CONFIG = {
    "HARVEST_DASHBOARD": True,
    "HARVEST_ACTUATOR_TOKEN": TOKEN,
    "SECRET_KEY": "bench-dashboard-secret-key-0123456789abcdef",
    # No sweep from the web process during the measurement.
    "HARVEST_SWEEP_INTERVAL_SECONDS": 3600,
}
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
_NEXT = re.compile(r'href="([^"]*[?&](?:amp;)?cursor=[^"]*)"')


def _noop(ctx: WorkflowContext, value: Any) -> Any:
    return value


def make_app(url: str) -> Flask:
    """The console's app on ``url``: the history's workflows (one on the queue, one scheduled), the
    trigger declared in code, completion callbacks; the dashboard open to a token."""
    app = Flask("bench_console")
    app.config.update(CONFIG, SQLALCHEMY_DATABASE_URI=url)
    db = SQLAlchemy(app)
    harvest = Harvest(db=db)
    harvest.queue(QUEUE, concurrency=4)
    for name in WORKFLOWS[:-1]:
        harvest.workflow(name)(_noop)
    harvest.workflow(WORKFLOWS[-1], queue=QUEUE)(_noop)
    harvest.workflow(NIGHTLY, schedule="0 3 * * *")(_noop)
    harvest.completion_trigger(CompletionTrigger(WORKFLOWS[0], WORKFLOWS[1], id=CODE_TRIGGER_ID))
    harvest.init_app(app)
    app.extensions["bench_db"] = db
    return app


def close(app: Flask) -> None:
    get_engine(app).close()
    with app.app_context():
        app.extensions["bench_db"].engine.dispose()


def signed_in(app: Flask) -> FlaskClient:
    """A test client signed in through the dashboard's form."""
    client = app.test_client()
    form = client.get(f"{PREFIX}/sign-in").get_data(as_text=True)
    found = _CSRF.search(form)
    if found is None:
        raise AssertionError("the sign-in form has no CSRF token")
    answer = client.post(f"{PREFIX}/sign-in", data={"token": TOKEN, "csrf_token": found.group(1)})
    if answer.status_code != 303:
        raise AssertionError(f"sign-in answered {answer.status_code}")
    return client


@dataclass(frozen=True)
class Page:
    """A console page: its label, its path on a history of ``n`` rows, the status it answers."""

    label: str
    path: Callable[[int], str]
    status: int = 200
    #: Open the next page of this list (its link's cursor) instead of the first.
    second: bool = False


def _parent(history: int) -> str:
    """The newest parent run whose children are all in the history."""
    return execution_id(history - history % PARENT_EVERY - PARENT_EVERY)


def pages(since: str) -> list[Page]:
    """Every GET page of the console (``since``: the deliveries list's time filter, an hour ago)."""
    p, stored = PREFIX, STORED_TRIGGER_ID
    return [
        Page("overview", lambda n: f"{p}/"),
        Page("sign-in form", lambda n: f"{p}/sign-in"),
        Page("subscriptions list", lambda n: f"{p}/webhooks/subscriptions"),
        Page("subscriptions list, active", lambda n: f"{p}/webhooks/subscriptions?status=active"),
        Page("subscription", lambda n: f"{p}/webhooks/subscriptions/{subscription_id(3)}"),
        Page("new subscription form", lambda n: f"{p}/webhooks/subscriptions/new"),
        Page(
            "delete subscription (confirm)",
            lambda n: f"{p}/webhooks/subscriptions/{subscription_id(3)}/delete",
        ),
        Page("deliveries list", lambda n: f"{p}/webhooks/deliveries"),
        Page("deliveries list, page 2", lambda n: f"{p}/webhooks/deliveries", second=True),
        Page("DLQ (deliveries list, dlq)", lambda n: f"{p}/webhooks/deliveries?state=dlq"),
        Page(
            "deliveries of a subscription",
            lambda n: f"{p}/webhooks/deliveries?subscription_id={subscription_id(3)}",
        ),
        Page("deliveries of a topic", lambda n: f"{p}/webhooks/deliveries?topic=bench.event.2"),
        Page("deliveries, last hour", lambda n: f"{p}/webhooks/deliveries?since={since}"),
        Page("delivery (dead-lettered)", lambda n: f"{p}/webhooks/deliveries/{delivery_id(n)}"),
        Page("replay DLQ form", lambda n: f"{p}/webhooks/replay"),
        Page("workflows list", lambda n: f"{p}/workflows"),
        Page("workflows list, page 2", lambda n: f"{p}/workflows", second=True),
        Page("workflows list, Failed", lambda n: f"{p}/workflows?state=Failed"),
        Page("workflows list, one workflow", lambda n: f"{p}/workflows?name={WORKFLOWS[1]}"),
        Page("workflow run (steps, timeline, children)", lambda n: f"{p}/workflows/{_parent(n)}"),
        Page("retry from step (fork form)", lambda n: f"{p}/workflows/{_parent(n)}/fork?from_step=1"),
        Page("cancel run (confirm)", lambda n: f"{p}/workflows/{waiting_execution_id(1)}/cancel"),
        Page("terminate run (confirm)", lambda n: f"{p}/workflows/{waiting_execution_id(1)}/terminate"),
        Page("start a run form", lambda n: f"{p}/workflows/start"),
        Page("failed callbacks", lambda n: f"{p}/workflows/completion-deliveries/failed"),
        Page("queues", lambda n: f"{p}/workflow-queues"),
        Page("schedules", lambda n: f"{p}/workflow-schedules"),
        Page("triggers list", lambda n: f"{p}/triggers"),
        Page("trigger (recent fires)", lambda n: f"{p}/triggers/{stored}"),
        Page("new trigger form", lambda n: f"{p}/triggers/new"),
        Page("edit trigger form", lambda n: f"{p}/triggers/{stored}/edit"),
        Page("delete trigger (confirm)", lambda n: f"{p}/triggers/{stored}/delete"),
        Page("search form", lambda n: f"{p}/search"),
        Page("search, a delivery id", lambda n: f"{p}/search?q={delivery_id(n)}", status=303),
        Page("search, a workflow_id", lambda n: f"{p}/search?q=wf-{n}", status=303),
        Page("search, no match", lambda n: f"{p}/search?q=dlv_none", status=404),
    ]


class Render:
    """GET a page with each app's signed-in client; an answer other than the page's status fails
    the scenario."""

    def __init__(self, clients: dict[int, FlaskClient], paths: dict[int, str], status: int) -> None:
        self.clients, self.paths, self.status = clients, paths, status

    def __call__(self, app: Flask) -> None:
        path = self.paths[id(app)]
        answer = self.clients[id(app)].get(path)
        if answer.status_code != self.status:
            raise AssertionError(f"{path} answered {answer.status_code}, not {self.status}")


def second_page(client: FlaskClient, path: str) -> str:
    """The path of the next page of the list at ``path`` (its *Next* link)."""
    body = client.get(path).get_data(as_text=True)
    links = [html.unescape(link) for link in _NEXT.findall(body)]
    if not links:
        raise AssertionError(f"{path} has no next page")
    return links[-1]


def statements(app: Flask, render: Render) -> int:
    """How many statements one render of the page sends to the database."""
    engine = get_engine(app).store.capabilities.engine
    assert engine is not None
    with app.app_context(), captured(engine) as sent:
        render(app)
    return len(sent)


def run(ctx: Context) -> Result:
    reps = ctx.pick(500, 40)
    seeds: dict[str, History] = {
        "small": seeded(database_url("history_small"), history=SMALL_HISTORY, pending=PENDING),
        "big": seeded(database_url("history"), history=HISTORY, pending=PENDING),
    }
    apps = {name: make_app(seed.database_url) for name, seed in seeds.items()}
    try:
        return _measure(apps, seeds, reps)
    finally:
        for app in apps.values():
            close(app)


def _measure(apps: dict[str, Flask], seeds: dict[str, History], reps: int) -> Result:
    clients = {id(app): signed_in(app) for app in apps.values()}
    since = (utcnow() - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    result = Result()
    summary: list[tuple[str, float, bool]] = []
    for page in pages(since):
        paths = {}
        for name, app in apps.items():
            path = page.path(seeds[name].history)
            paths[id(app)] = second_page(clients[id(app)], path) if page.second else path
        render = Render(clients, paths, page.status)
        times = alternate(apps, render, reps)
        p95, small_p95 = percentile(times["big"], 95), percentile(times["small"], 95)
        p50, small_p50 = percentile(times["big"], 50), percentile(times["small"], 50)
        ratio = p95 / small_p95
        met = ratio <= RATIO_GOAL and p95 < ABSOLUTE_GOAL_MS
        sent = statements(apps["big"], render)
        summary.append((page.label, p95, met))
        result.rows.append(
            Row(
                ID,
                f"{page.label} (p95)",
                p95,
                "ms",
                GOAL,
                met,
                baseline=small_p95,
                baseline_label=f"{SMALL_HISTORY:,} rows",
                ratio=ratio,
                note=f"p50 {p50:.1f} ms vs {small_p50:.1f} ms ({p50 / small_p50:.2f}x); {sent} statements",
            )
        )
        result.details[page.label] = {
            "path": paths[id(apps["big"])],
            "status": page.status,
            "statements": sent,
            "render_ms": {
                name: {"p50": percentile(t, 50), "p95": percentile(t, 95), "reps": len(t)}
                for name, t in times.items()
            },
            # The plans of a page that misses its goal: which statement grows with the history.
            "plans": [] if met else plans(apps["big"], render, touching="harvest_"),
        }
    slowest = max(summary, key=lambda item: item[1])
    missed = [label for label, _, met in summary if not met]
    result.rows.append(
        Row(
            ID,
            f"every console page ({len(summary)}), slowest p95: {slowest[0]}",
            slowest[1],
            "ms",
            GOAL,
            not missed,
            note=f"{len(summary) - len(missed)} of {len(summary)} pages meet the goal"
            + (f"; missed: {', '.join(missed)}" if missed else ""),
        )
    )
    result.details["seed_seconds"] = {name: seed.seed_seconds for name, seed in seeds.items()}
    result.details["verdict"] = {
        "met": not missed,
        "slowest": slowest[0],
        "slowest_p95": slowest[1],
        "missed": missed,
    }
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
