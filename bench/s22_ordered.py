"""S22: ordered delivery over many keys against unordered delivery, in the same run.

One subscription, an instant receiver, two worker processes at the default concurrency. First a
backlog of ``COUNT`` unordered events is dispatched and the workers started; then, with fresh
workers, ``COUNT`` events spread over ``KEYS`` ordering keys. The figure is each phase's rate
(deliveries over the span from its first to its last request); the ratio is ordered over
unordered, with a goal of at least 0.5. Also checked: each key's requests arrived in dispatch
order.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from typing import Any

from flask import Flask

from flask_harvest import WebhookSubscription, generate_secret, get_engine

from . import _workers
from ._receivers import Receiver, Record
from ._report import Context, Result, Row
from ._scenario import payload
from ._services import reset_all

ID = "S22"
TITLE = "ordered delivery over 100 keys against unordered, one subscription, 2 worker processes"
PROCESSES = 2
CONCURRENCY = _workers.DEFAULT_CONCURRENCY
KEYS = 100


def _dispatch(app: Flask, count: int, topic: str, keyed: bool) -> dict[str, list[str]]:
    """Dispatch ``count`` events; return each key's delivery ids in dispatch order."""
    lines: dict[str, list[str]] = defaultdict(list)
    with app.app_context():
        manager = get_engine(app).manager
        for number in range(count):
            key = f"key-{number % KEYS}" if keyed else None
            lines[key or ""].extend(manager.dispatch(topic, payload(number), ordering_key=key))
    return lines


def _phase(
    ctx: Context, receiver: Receiver, app: Flask, count: int, prefix: str, keyed: bool
) -> list[Record]:
    lines = _dispatch(app, count, f"bench.{prefix.strip('/')}", keyed)
    workers = [
        _workers.harvest_worker(ctx.log_dir, CONCURRENCY, tag=f"s22-{prefix.strip('/')}-{n}")
        for n in range(PROCESSES)
    ]
    try:
        if not receiver.wait_count(count, timeout=600, prefix=prefix):
            raise RuntimeError(f"{prefix}: not every delivery arrived\n{workers[0].log_tail()}")
    finally:
        _workers.stop_all(workers, grace=2)
    records = [r for r in receiver.records() if r.path.startswith(prefix)]
    if keyed:
        first: dict[str, float] = {}
        for record in records:
            first.setdefault(record.webhook_id, record.received_at)
        for key, ids in lines.items():
            if sorted(ids, key=first.__getitem__) != ids:
                raise RuntimeError(f"key {key}: requests out of dispatch order")
    return records


def _rate(records: list[Record]) -> float:
    span = max(r.received_at for r in records) - min(r.received_at for r in records)
    return len({r.webhook_id for r in records}) / span if span else 0.0


def run(ctx: Context) -> Result:
    count = ctx.pick(4000, 1000)
    with Receiver() as receiver:
        reset_all(ctx.engine)
        app = ctx.app()
        with app.app_context():
            store = get_engine(app).store
            for name in ("plain", "ordered"):
                store.add_subscription(
                    WebhookSubscription(receiver.url(f"/{name}/"), [f"bench.{name}"], generate_secret())
                )
        started = time.perf_counter()
        plain = _phase(ctx, receiver, app, count, "/plain/", keyed=False)
        ordered = _phase(ctx, receiver, app, count, "/ordered/", keyed=True)
        elapsed = time.perf_counter() - started
    plain_rate, ordered_rate = _rate(plain), _rate(ordered)
    ratio = ordered_rate / plain_rate if plain_rate else 0.0
    details: dict[str, Any] = {
        "count": count,
        "keys": KEYS,
        "unordered_per_s": plain_rate,
        "ordered_per_s": ordered_rate,
        "ratio": ratio,
        "seconds": elapsed,
    }
    result = Result()
    result.rows.append(
        Row(
            ID,
            f"ordered delivery over {KEYS} keys, {count:,} events",
            ordered_rate,
            "/s",
            ">= 0.5x unordered",
            ratio >= 0.5,
            baseline=plain_rate,
            baseline_label="unordered, same run, /s",
            ratio=ratio,
            note="every key's requests arrived in dispatch order",
        )
    )
    result.details = details
    return result


if __name__ == "__main__":
    from .__main__ import main as bench_main

    raise SystemExit(bench_main(["--only", ID, *sys.argv[1:]]))
