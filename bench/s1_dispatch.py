"""S1: ``dispatch()`` of one event to K = 1, 10, 100 matching subscriptions (SQL store on PostgreSQL,
``rq`` backend), beside the least work any design must do: a raw SQLAlchemy Core multi-row insert
of K delivery rows plus an RQ enqueue of K jobs in one pipeline.

Goals: ratio to the baseline ≤ 1.5 at every K; time(K=100) / time(K=1) ≤ 10.
"""

from __future__ import annotations

import sys
import time
import uuid
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from flask import Flask
from rq import Queue

from flask_harvest import WebhookSubscription, generate_secret, get_engine
from flask_harvest.webhooks.payload import encode_payload
from flask_harvest.webhooks.stores.sql import deliveries_table, subscriptions_table

from ._report import Context, Result, Row, median, percentile
from ._services import reset_all

ID = "S1"
TITLE = "dispatch() to K subscriptions"
KS = (1, 10, 100)
OTHERS = 1000
BASELINE_TASK = "bench._jobs.noop"


def _baseline(engine: sa.Engine, queue: Queue, subscription_ids: list[str], topic: str, body: str) -> None:
    """The floor: K rows in one multi-row INSERT, K jobs in one Redis pipeline."""
    now = datetime.now(timezone.utc)
    rows = [
        {
            "id": f"msg_{uuid.uuid4().hex}",
            "subscription_id": sid,
            "topic": topic,
            "payload": body,
            "state": "pending",
            "attempt": 1,
            "max_attempts": 5,
            "request_headers": {},
            "timestamp": now,
            "next_attempt_at": now,
            "created_at": now,
        }
        for sid in subscription_ids
    ]
    with engine.begin() as conn:
        # executemany of a Core insert: SQLAlchemy's "insertmanyvalues" sends it as one multi-row
        # INSERT, with the compiled statement cached (the fastest Core spelling on psycopg 3).
        conn.execute(sa.insert(deliveries_table), rows)
    jobs = [
        Queue.prepare_data(
            BASELINE_TASK,
            args=(row["id"],),
            job_id=f"base-{row['id']}",
            timeout=70,
            result_ttl=0,
            failure_ttl=24 * 3600,
            description=f"deliver {row['id']}",
        )
        for row in rows
    ]
    with queue.connection.pipeline() as pipe:
        queue.enqueue_many(jobs, pipeline=pipe)
        pipe.execute()


def _measure(ctx: Context, app: Flask, reps: int, k: int, others: int = 0) -> tuple[list[float], list[float]]:
    """Time dispatch() and the baseline, interleaved, with K matching subscriptions (and
    ``others`` that match another topic); return both lists of milliseconds."""
    with ctx.engine.begin() as conn:
        conn.execute(sa.delete(subscriptions_table))
    topic = f"bench.k{k}"
    with app.app_context():
        state = get_engine(app)
        store, manager = state.store, state.manager
        engine = store.engine  # type: ignore[attr-defined]
        baseline_queue = Queue("bench-s1-baseline", connection=state.backend.connection)  # type: ignore[attr-defined]
        subscription_ids = []
        for n in range(k + others):
            subscription = WebhookSubscription(
                target_url=f"http://127.0.0.1:9/k{k}/{n}",
                event_topics=(topic if n < k else "bench.other",),
                secret=generate_secret(),
            )
            store.add_subscription(subscription)
            if n < k:
                subscription_ids.append(subscription.id)
        payload: dict[str, Any] = {"order_id": "ord_1", "total": 4200, "items": [{"sku": "A", "qty": 1}]}
        body = encode_payload(payload)
        ours: list[float] = []
        theirs: list[float] = []
        for rep in range(reps + 5):
            # Alternate which goes first, so drift on a shared machine hits both alike.
            order = (0, 1) if rep % 2 == 0 else (1, 0)
            for which in order:
                started = time.perf_counter()
                if which == 0:
                    manager.dispatch(topic, payload)
                else:
                    _baseline(engine, baseline_queue, subscription_ids, topic, body)
                elapsed = time.perf_counter() - started
                if rep >= 5:  # the first few warm caches and connections
                    (ours if which == 0 else theirs).append(elapsed * 1000)
    return ours, theirs


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": median(values), "p95": percentile(values, 95), "min": min(values)}


def run(ctx: Context) -> Result:
    reset_all(ctx.engine)
    app = ctx.app()
    reps = {1: ctx.pick(400, 60), 10: ctx.pick(300, 40), 100: ctx.pick(150, 20)}
    result = Result()
    medians: dict[int, float] = {}
    for k in KS:
        ours, theirs = _measure(ctx, app, reps[k], k)
        medians[k] = median(ours)
        ratio = median(ours) / median(theirs)
        result.rows.append(
            Row(
                ID,
                f"dispatch, K={k} (median)",
                median(ours),
                "ms",
                "<= 1.5x baseline",
                ratio <= 1.5,
                baseline=median(theirs),
                baseline_label="Core insert + pipeline",
                ratio=ratio,
                note=f"p95 {percentile(ours, 95):.2f} ms vs {percentile(theirs, 95):.2f} ms",
            )
        )
        result.details[f"k{k}"] = {
            "reps": len(ours),
            "dispatch_ms": _summary(ours),
            "baseline_ms": _summary(theirs),
        }
    scaling = medians[100] / medians[1]
    result.rows.append(
        Row(ID, "time(K=100) / time(K=1)", scaling, "x", "<= 10", scaling <= 10, note="medians")
    )
    result.details["scaling_k100_over_k1"] = scaling
    # Not a goal here: S11 measures the subscriptions of other topics, up to 100,000 of them.
    ours, theirs = _measure(ctx, app, ctx.pick(100, 20), 1, others=OTHERS)
    result.rows.append(
        Row(
            ID,
            f"dispatch, K=1 among {OTHERS:,} other subscriptions",
            median(ours),
            "ms",
            "report",
            None,
            baseline=median(theirs),
            baseline_label="Core insert + pipeline",
            ratio=median(ours) / median(theirs),
        )
    )
    result.details[f"k1_among_{OTHERS}"] = {"dispatch_ms": _summary(ours), "baseline_ms": _summary(theirs)}
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
