"""S16: the dashboard's render time with 1,000,000 delivery rows in PostgreSQL (issue 17): the
deliveries list and the overview, through the Flask test client, signed in.

Each page's render is set against the raw SQL time of the statements that render sends (captured,
then run again through a plain psycopg connection, prepared as psycopg prepares them), and against
the same page on S13's 1,000-row history. Goal: p95 <= 2x the raw SQL p95, and < 200 ms. The
databases are S13's (``bench._history``).
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any

import psycopg
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from flask_harvest import get_engine

from ._history import alternate, history_apps
from ._plans import captured, plans
from ._report import Context, Result, Row, percentile
from ._services import reset_redis

ID = "S16"
TITLE = "dashboard render time with 1M delivery rows"
RATIO_GOAL = 2.0
ABSOLUTE_GOAL_MS = 200.0
TOKEN = "bench-dashboard-token-0123456789"  # noqa: S105 (a local benchmark app's)
PAGES = {"deliveries list": "/harvest/webhooks/deliveries", "overview": "/harvest/"}
CONFIG = {
    "HARVEST_DASHBOARD": True,
    "HARVEST_ACTUATOR_TOKEN": TOKEN,
    "SECRET_KEY": "bench-dashboard-secret-key-0123456789abcdef",
}
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def signed_in(app: Flask) -> FlaskClient:
    """A test client signed in through the dashboard's form."""
    client = app.test_client()
    form = client.get("/harvest/sign-in").get_data(as_text=True)
    found = _CSRF.search(form)
    if found is None:
        raise AssertionError("the sign-in form has no CSRF token")
    answer = client.post("/harvest/sign-in", data={"token": TOKEN, "csrf_token": found.group(1)})
    if answer.status_code != 303:
        raise AssertionError(f"sign-in answered {answer.status_code}")
    return client


class Render:
    """GET a page with each app's signed-in client; a non-200 answer fails the scenario."""

    def __init__(self, clients: dict[int, FlaskClient], path: str) -> None:
        self.clients, self.path = clients, path

    def __call__(self, app: Flask) -> None:
        answer = self.clients[id(app)].get(self.path)
        if answer.status_code != 200:
            raise AssertionError(f"{self.path} answered {answer.status_code}")


def statements(app: Flask, render: Render) -> list[tuple[str, Any]]:
    """The statements one render of the page sends to the database."""
    engine = get_engine(app).store.capabilities.engine
    assert engine is not None
    with captured(engine) as sent:
        render(app)
    return list(sent)


def raw_sql_ms(database_url: str, sent: list[tuple[str, Any]], reps: int, warmup: int = 5) -> list[float]:
    """Milliseconds to run ``sent`` (and fetch every row) on a plain psycopg connection, per rep;
    psycopg prepares each statement from its fifth run, as it does for the app."""
    url = sa.make_url(database_url).set(drivername="postgresql")
    times = []
    with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as conn:
        for rep in range(reps + warmup):
            started = time.perf_counter()
            for statement, parameters in sent:
                with conn.cursor() as cursor:
                    cursor.execute(statement, parameters)
                    if cursor.description is not None:
                        cursor.fetchall()
            if rep >= warmup:
                times.append((time.perf_counter() - started) * 1000)
    return times


def run(ctx: Context) -> Result:
    reset_redis()
    history = 1_000_000
    reps = ctx.pick(200, 40)
    apps, seeds = history_apps(ctx, history, CONFIG)
    clients = {id(app): signed_in(app) for app in apps.values()}
    result = Result()
    for label, path in PAGES.items():
        render = Render(clients, path)
        times = alternate(apps, render, reps)
        sent = statements(apps["big"], render)
        raw = raw_sql_ms(seeds["big"].database_url, sent, reps)
        p95, raw_p95 = percentile(times["big"], 95), percentile(raw, 95)
        small_p95 = percentile(times["small"], 95)
        ratio = p95 / raw_p95
        result.rows.append(
            Row(
                ID,
                f"{label} render, {history:,} rows (p95)",
                p95,
                "ms",
                f"<= {RATIO_GOAL}x raw SQL, < {ABSOLUTE_GOAL_MS:.0f} ms",
                ratio <= RATIO_GOAL and p95 < ABSOLUTE_GOAL_MS,
                baseline=raw_p95,
                baseline_label=f"raw SQL of its {len(sent)} statements",
                ratio=ratio,
                note=f"p95 on 1,000 rows {small_p95:.1f} ms ({p95 / small_p95:.2f}x)",
            )
        )
        result.details[label] = {
            "path": path,
            "render_ms": {
                name: {"p50": percentile(t, 50), "p95": p95_of, "reps": len(t)}
                for name, t in times.items()
                for p95_of in [percentile(t, 95)]
            },
            "raw_sql_ms": {"p50": percentile(raw, 50), "p95": raw_p95, "statements": len(sent)},
            "plans": plans(apps["big"], render, touching=""),
        }
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
