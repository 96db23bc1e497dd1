"""S6: the transactional outbox. (a) A request transaction that saves a row, with and without
``dispatch_in_tx`` in it (Flask-SQLAlchemy session, one app context per request, interleaved);
(b) relaying committed outbox messages into deliveries and jobs.

Goals: the added time's p95 <= 2 ms; relay >= 1,000 messages/s.
"""

from __future__ import annotations

import sys
import time

import sqlalchemy as sa

from flask_harvest import get_engine
from flask_harvest.webhooks.payload import encode_payload
from flask_harvest.webhooks.stores.sql import deliveries_table

from ._app import Order, db
from ._receivers import Receiver
from ._report import Context, Result, Row, median, percentile
from ._scenario import payload, subscribe
from ._services import redis_client, reset_all
from .s2_throughput import ceiling

ID = "S6"
TITLE = "dispatch_in_tx overhead and outbox relay"
TOPIC = "order.created"


def request_transactions(ctx: Context, count: int) -> dict[str, list[float]]:
    app = ctx.app()
    subscribe(app, ["http://127.0.0.1:9/s6"], topic=TOPIC)
    manager = get_engine(app).manager
    times: dict[str, list[float]] = {"with": [], "without": []}
    for number in range(count + 20):
        order = ("without", "with") if number % 2 == 0 else ("with", "without")
        for kind in order:
            started = time.perf_counter()
            with app.app_context():  # one request
                db.session.add(Order(reference=f"ref-{kind}-{number}", total=number))
                if kind == "with":
                    manager.dispatch_in_tx(db.session, TOPIC, payload(number))
                db.session.commit()
            elapsed = (time.perf_counter() - started) * 1000
            if number >= 20:  # warm-up
                times[kind].append(elapsed)
            time.sleep(0.005)  # between requests; the after-commit relay runs meanwhile
    manager.close()  # let the last relays finish
    return times


def relay(ctx: Context, count: int) -> dict[str, float]:
    reset_all(ctx.engine)
    app = ctx.app()
    subscribe(app, ["http://127.0.0.1:9/s6"], topic=TOPIC)
    manager = get_engine(app).manager
    engine = get_engine(app).store.engine  # type: ignore[attr-defined]
    for start in range(0, count, 500):
        with engine.begin() as conn:  # a bare connection: no relay after commit, it waits
            for number in range(start, min(count, start + 500)):
                manager.dispatch_in_tx(conn, TOPIC, payload(number))
    started = time.perf_counter()
    relayed = failed = 0
    while True:
        report = manager.relay_outbox(limit=500)
        relayed += report.relayed
        failed += report.failed
        if report.relayed + report.failed == 0:
            break
    elapsed = time.perf_counter() - started
    with engine.connect() as conn:
        deliveries = conn.execute(sa.select(sa.func.count()).select_from(deliveries_table)).scalar_one()
    client = redis_client()
    queued = client.llen(f"rq:queue:{get_engine(app).settings.webhooks_queue}")
    client.close()
    return {
        "messages": count,
        "relayed": relayed,
        "failed": failed,
        "seconds": elapsed,
        "per_s": relayed / elapsed,
        "deliveries": deliveries,
        "jobs_queued": queued,
    }


def run(ctx: Context) -> Result:
    reset_all(ctx.engine)
    times = request_transactions(ctx, ctx.pick(1000, 200))
    ctx.close_apps()
    relayed = relay(ctx, ctx.pick(10_000, 1_000))
    with Receiver() as receiver:  # the machine's ceiling in this run, beside the absolute goal
        top = ceiling(receiver, ctx.pick(5_000, 2_000), encode_payload(payload(0)).encode())
    with_tx, without = times["with"], times["without"]
    added_p95 = percentile(with_tx, 95) - percentile(without, 95)
    added_p50 = median(with_tx) - median(without)
    complete = relayed["relayed"] == relayed["messages"] == relayed["deliveries"]
    result = Result()
    result.rows += [
        Row(
            ID,
            "request transaction + dispatch_in_tx, p95",
            percentile(with_tx, 95),
            "ms",
            "added p95 <= 2 ms",
            added_p95 <= 2,
            baseline=percentile(without, 95),
            baseline_label="same transaction without",
            note=f"added: p95 {added_p95:.2f} ms, median {added_p50:.2f} ms",
        ),
        Row(
            ID,
            f"outbox relay ({relayed['messages']:,} committed messages)",
            relayed["per_s"],
            "msg/s",
            ">= 1,000 msg/s",
            relayed["per_s"] >= 1000 and complete,
            ceiling=top,
            note="" if complete else "not every message became a delivery",
        ),
    ]
    result.details = {
        "transaction_ms": {
            kind: {"median": median(v), "p95": percentile(v, 95), "p99": percentile(v, 99), "n": len(v)}
            for kind, v in times.items()
        },
        "added_ms": {"p95": added_p95, "median": added_p50},
        "relay": relayed,
        "ceiling_per_s": top,
    }
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
