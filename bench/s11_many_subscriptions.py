"""S11: ``dispatch()`` of one event to K = 1 matching subscription among N = 0, 1,000, 10,000 and
100,000 subscriptions of other topics (SQL store on PostgreSQL, ``rq`` backend).

dispatch looks the topic's candidate pattern keys up in the topic index, so the subscriptions of
other topics should cost nothing. Goal: time(N=100,000) / time(N=0) ≤ 1.5 (medians).

Each N has a database of its own on the same server (the benchmark's for N=0, ``<it>_s11_n<N>``
for the others, dropped at the end), and an app on it; the calls alternate between the apps call
by call, in a rotating order, so the drift of a shared machine hits every N alike.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from flask import Flask

from flask_harvest import WebhookSubscription, generate_secret, get_engine
from flask_harvest.webhooks.stores._schema import subscription_values, topic_rows
from flask_harvest.webhooks.stores.sql import subscription_topics_table, subscriptions_table

from ._report import Context, Result, Row, median, percentile
from ._services import DATABASE_URL, drop_database, ensure_database, reset_all, reset_database

ID = "S11"
TITLE = "dispatch() to 1 subscription among N others"
TOPIC = "order.created"
GOAL = 1.5
_CHUNK = 5_000


def _patterns(n: int) -> tuple[str, ...]:
    """Patterns near the topic that never select it: other tenants, other events, longer topics,
    and wildcards that share a segment with it."""
    shapes = (
        f"tenant{n}.order.created",
        f"tenant{n}.*",
        f"order.c{n}",
        f"order.created.v{n}",
        f"*.c{n}",
        f"order.*.v{n}",
    )
    return (shapes[n % len(shapes)], shapes[(n + 1) % len(shapes)])


def _others(count: int) -> Iterator[WebhookSubscription]:
    # One secret for all: generating 100,000 takes longer than inserting them.
    secret = generate_secret()
    for n in range(count):
        yield WebhookSubscription(
            target_url=f"http://127.0.0.1:9/other/{n}", event_topics=_patterns(n), secret=secret
        )


def _add_others(engine: sa.Engine, count: int) -> None:
    """Insert ``count`` subscriptions with their topic index rows, in bulk through the store's
    tables (what ``add_subscription`` writes, without 100,000 transactions)."""
    batch: list[WebhookSubscription] = []
    for subscription in _others(count):
        batch.append(subscription)
        if len(batch) == _CHUNK:
            _insert(engine, batch)
            batch = []
    if batch:
        _insert(engine, batch)
    with engine.begin() as conn:
        # As autovacuum would soon: the planner sees the tables as they now are.
        conn.exec_driver_sql(f"ANALYZE {subscriptions_table.name}, {subscription_topics_table.name}")


def _insert(engine: sa.Engine, subscriptions: list[WebhookSubscription]) -> None:
    with engine.begin() as conn:
        conn.execute(sa.insert(subscriptions_table), [subscription_values(s) for s in subscriptions])
        keys = [row for s in subscriptions for row in topic_rows(s.id, s.event_topics, s.tenant)]
        conn.execute(sa.insert(subscription_topics_table), keys)


def _database_url(size: int) -> str:
    if size == 0:
        return DATABASE_URL
    url = sa.make_url(DATABASE_URL)
    return url.set(database=f"{url.database}_s11_n{size}").render_as_string(hide_password=False)


def _prepare(ctx: Context, size: int) -> tuple[Flask, float]:
    """An app on N=``size``'s database, holding the matching subscription and ``size`` others;
    return it and the seconds the inserts took."""
    database_url = _database_url(size)
    ensure_database(database_url)
    engine = sa.create_engine(database_url)
    try:
        reset_database(engine)
        started = time.perf_counter()
        _add_others(engine, size)
        seconds = time.perf_counter() - started
    finally:
        engine.dispose()
    app = ctx.app({"SQLALCHEMY_DATABASE_URI": database_url})
    with app.app_context():
        get_engine(app).store.add_subscription(
            WebhookSubscription("http://127.0.0.1:9/matching", [TOPIC], generate_secret())
        )
    return app, seconds


def _measure(apps: dict[int, Flask], reps: int) -> dict[int, list[float]]:
    """Time dispatch() on every app, alternating call by call in a rotating order; return each
    N's milliseconds."""
    payload: dict[str, Any] = {"order_id": "ord_1", "total": 4200, "items": [{"sku": "A", "qty": 1}]}
    sizes = list(apps)
    times: dict[int, list[float]] = {size: [] for size in sizes}
    for rep in range(reps + 5):
        shift = rep % len(sizes)
        for size in sizes[shift:] + sizes[:shift]:
            with apps[size].app_context():
                manager = get_engine(apps[size]).manager
                started = time.perf_counter()
                delivered = manager.dispatch(TOPIC, payload)
                elapsed = time.perf_counter() - started
            if len(delivered) != 1:
                raise AssertionError(f"dispatch at N={size} logged {len(delivered)} deliveries, not 1")
            if rep >= 5:  # the first few warm caches and connections
                times[size].append(elapsed * 1000)
    return times


def run(ctx: Context) -> Result:
    reset_all(ctx.engine)
    sizes = ctx.pick((0, 1_000, 10_000, 100_000), (0, 1_000, 10_000))
    reps = ctx.pick(400, 60)
    apps: dict[int, Flask] = {}
    insert_seconds: dict[int, float] = {}
    try:
        for size in sizes:
            apps[size], insert_seconds[size] = _prepare(ctx, size)
        times = _measure(apps, reps)
    finally:
        ctx.close_apps()
        for size in sizes[1:]:
            drop_database(_database_url(size))
    result = Result()
    base = median(times[0])
    for size in sizes:
        result.rows.append(
            Row(
                ID,
                f"dispatch, K=1 among N={size:,} (median)",
                median(times[size]),
                "ms",
                "report",
                None,
                baseline=base if size else None,
                baseline_label="N=0" if size else "",
                ratio=median(times[size]) / base if size else None,
                note=f"p95 {percentile(times[size], 95):.2f} ms",
            )
        )
        result.details[f"n{size}"] = {
            "reps": len(times[size]),
            "dispatch_ms": {
                "median": median(times[size]),
                "p95": percentile(times[size], 95),
                "min": min(times[size]),
            },
            "insert_seconds": insert_seconds[size],
        }
    largest = sizes[-1]
    scaling = median(times[largest]) / base
    result.rows.append(
        Row(
            ID,
            f"time(N={largest:,}) / time(N=0)",
            scaling,
            "x",
            f"<= {GOAL}",
            scaling <= GOAL,
            note="medians, calls alternated between the N",
        )
    )
    result.details["scaling"] = scaling
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
