"""S11: ``dispatch()`` of one event to K = 1 matching subscription among N = 0, 1,000, 10,000 and
100,000 subscriptions of other topics (SQL store on PostgreSQL, ``rq`` backend).

dispatch looks the topic's candidate pattern keys up in the topic index, so the subscriptions of
other topics should cost nothing. Goal: time(N=100,000) / time(N=0) ≤ 1.5 (medians). N=0 is
timed first and again last (after removing the others), and time(N=0) is the mean of the two, so
drift on a shared machine does not favour either end. Each N is also timed beside S1's floor (a
Core insert of the delivery row and an RQ enqueue), interleaved, and the note shows the ratio of
the dispatch/floor ratios as well.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from flask import Flask
from rq import Queue

from flask_harvest import WebhookSubscription, generate_secret, get_engine
from flask_harvest.webhooks.payload import encode_payload
from flask_harvest.webhooks.stores._schema import subscription_values, topic_rows
from flask_harvest.webhooks.stores.sql import (
    deliveries_table,
    subscription_topics_table,
    subscriptions_table,
)

from ._report import Context, Result, Row, median, percentile
from ._services import reset_all
from .s1_dispatch import _baseline

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


def _others(start: int, stop: int) -> Iterator[WebhookSubscription]:
    # One secret for all: generating 100,000 takes longer than inserting them.
    secret = generate_secret()
    for n in range(start, stop):
        yield WebhookSubscription(
            target_url=f"http://127.0.0.1:9/other/{n}", event_topics=_patterns(n), secret=secret
        )


def _add_others(engine: sa.Engine, start: int, stop: int) -> None:
    """Insert subscriptions ``start`` to ``stop`` with their topic index rows, in bulk through the
    store's tables (what ``add_subscription`` writes, without 100,000 transactions)."""
    batch: list[WebhookSubscription] = []
    for subscription in _others(start, stop):
        batch.append(subscription)
        if len(batch) == _CHUNK:
            _insert(engine, batch)
            batch = []
    if batch:
        _insert(engine, batch)
    with engine.begin() as conn:
        # As autovacuum would soon: the planner sees the tables as they now are.
        conn.exec_driver_sql(f"ANALYZE {subscriptions_table.name}, {subscription_topics_table.name}")


def _remove_others(engine: sa.Engine, *, keep: str) -> None:
    with engine.begin() as conn:
        conn.execute(sa.delete(subscriptions_table).where(subscriptions_table.c.id != keep))
        conn.execute(
            sa.delete(subscription_topics_table).where(subscription_topics_table.c.subscription_id != keep)
        )
        # Also clear the deliveries the runs logged, as the first N=0 run found none.
        conn.execute(sa.delete(deliveries_table))
    # VACUUM cannot run in a transaction.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f"VACUUM ANALYZE {subscriptions_table.name}, {subscription_topics_table.name}")


def _insert(engine: sa.Engine, subscriptions: list[WebhookSubscription]) -> None:
    with engine.begin() as conn:
        conn.execute(sa.insert(subscriptions_table), [subscription_values(s) for s in subscriptions])
        keys = [row for s in subscriptions for row in topic_rows(s.id, s.event_topics)]
        conn.execute(sa.insert(subscription_topics_table), keys)


def _measure(app: Flask, reps: int, subscription_id: str) -> tuple[list[float], list[float]]:
    """Time dispatch() and the floor, interleaved; return both lists of milliseconds."""
    payload: dict[str, Any] = {"order_id": "ord_1", "total": 4200, "items": [{"sku": "A", "qty": 1}]}
    body = encode_payload(payload)
    with app.app_context():
        state = get_engine(app)
        engine = state.store.engine  # type: ignore[attr-defined]
        queue = Queue("bench-s11-baseline", connection=state.backend.connection)  # type: ignore[attr-defined]
        ours: list[float] = []
        theirs: list[float] = []
        for rep in range(reps + 5):
            order = (0, 1) if rep % 2 == 0 else (1, 0)
            for which in order:
                started = time.perf_counter()
                if which == 0:
                    delivered = state.manager.dispatch(TOPIC, payload)
                else:
                    _baseline(engine, queue, [subscription_id], TOPIC, body)
                elapsed = time.perf_counter() - started
                if which == 0 and len(delivered) != 1:
                    raise AssertionError(f"dispatch logged {len(delivered)} deliveries, not 1")
                if rep >= 5:  # the first few warm caches and connections
                    (ours if which == 0 else theirs).append(elapsed * 1000)
    return ours, theirs


def run(ctx: Context) -> Result:
    reset_all(ctx.engine)
    app = ctx.app()
    sizes = ctx.pick((0, 1_000, 10_000, 100_000), (0, 1_000, 10_000))
    reps = ctx.pick(300, 60)
    with app.app_context():
        matching = get_engine(app).store.add_subscription(
            WebhookSubscription("http://127.0.0.1:9/matching", [TOPIC], generate_secret())
        )
    result = Result()
    medians: dict[str, tuple[float, float]] = {}
    inserted = 0
    for size in (*sizes, 0):
        started = time.perf_counter()
        if size == 0 and inserted:
            _remove_others(ctx.engine, keep=matching.id)
        else:
            _add_others(ctx.engine, inserted, size)
        insert_seconds = time.perf_counter() - started
        label = f"n{size}" if f"n{size}" not in medians else "n0_again"
        inserted = size
        ours, theirs = _measure(app, reps, matching.id)
        medians[label] = (median(ours), median(theirs))
        result.rows.append(
            Row(
                ID,
                f"dispatch, K=1 among N={size:,}{', again' if label == 'n0_again' else ''} (median)",
                median(ours),
                "ms",
                "report",
                None,
                baseline=median(theirs),
                baseline_label="Core insert + enqueue",
                ratio=median(ours) / median(theirs),
                note=f"p95 {percentile(ours, 95):.2f} ms",
            )
        )
        result.details[label] = {
            "reps": len(ours),
            "dispatch_ms": {"median": median(ours), "p95": percentile(ours, 95), "min": min(ours)},
            "baseline_ms": {"median": median(theirs), "p95": percentile(theirs, 95)},
            "insert_seconds": insert_seconds,
        }
    largest = sizes[-1]
    top, first, last = medians[f"n{largest}"], medians["n0"], medians["n0_again"]
    scaling = top[0] / ((first[0] + last[0]) / 2)
    # The same ratio with each dispatch median divided by its interleaved floor: drift removed.
    normalized = (top[0] / top[1]) / ((first[0] / first[1] + last[0] / last[1]) / 2)
    result.rows.append(
        Row(
            ID,
            f"time(N={largest:,}) / time(N=0)",
            scaling,
            "x",
            f"<= {GOAL}",
            scaling <= GOAL,
            note=f"N=0 the mean of first and last; {normalized:.2f}x against the floor of each run",
        )
    )
    result.details["scaling"] = scaling
    result.details["scaling_against_floor"] = normalized
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
