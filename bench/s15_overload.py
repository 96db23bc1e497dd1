"""S15: a receiver with a fixed capacity (it answers ``503`` when more than 20 requests are in
flight, each taking 100 ms), one subscription, the documented production setup (2 processes x
the default ``--concurrency``, 64, default settings: the adaptive per-endpoint limit).

Baseline: the same run with the limit fixed at the old default cap of 16 per process
(``HARVEST_WEBHOOKS_MIN_INFLIGHT_PER_SUBSCRIPTION = HARVEST_WEBHOOKS_MAX_INFLIGHT_PER_SUBSCRIPTION
= 16``), which puts up to 32 in flight against the receiver's 20.
Goals (issue 18): no more than 5% of the requests answered ``503`` after the first seconds, while
the receiver is kept busy with most of its 20 (mean in flight >= 15).

The queue is filled beforehand with more than the receiver can take in the measured window, the
workers start, and the window runs from ``WARMUP`` seconds after the first request for
``window`` seconds; then the workers stop. Deliveries refused with 503 are retried as usual.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from . import _workers
from ._receivers import Receiver, Record
from ._report import Context, Result, Row
from ._scenario import dispatch_many, subscribe, subscription_statuses
from ._services import reset_all

ID = "S15"
TITLE = "receiver at capacity (503 past 20 in flight), documented production setup"
PROCESSES = 2
CONCURRENCY = _workers.DEFAULT_CONCURRENCY
CAPACITY = 20
DELAY_MS = 100
#: Seconds after the first request that are not judged: the limits start small and find the
#: receiver's capacity by overshooting it once (slow start).
WARMUP = 2.0
#: The old default: a fixed cap of 16 per process.
FIXED = {
    "HARVEST_WEBHOOKS_MIN_INFLIGHT_PER_SUBSCRIPTION": 16,
    "HARVEST_WEBHOOKS_MAX_INFLIGHT_PER_SUBSCRIPTION": 16,
}


def overlap(records: list[Record], start: float, end: float) -> float:
    """Mean requests in flight at the receiver between ``start`` and ``end``."""
    held = sum(
        max(0.0, min(end, r.answered_at) - max(start, r.received_at))
        for r in records
        if r.answered_at is not None
    )
    return held / (end - start)


def one_run(
    ctx: Context, receiver: Receiver, *, window: float, config: dict[str, Any] | None, tag: str
) -> dict[str, Any]:
    reset_all(ctx.engine)
    receiver.reset()
    app = ctx.app()
    prefix = f"/limit/{CAPACITY}/{DELAY_MS}/{tag}/"
    subscribe(app, [receiver.url(prefix + "0")])
    # More than the receiver can take in the whole run (at most CAPACITY / 0.1 s = 200/s).
    count = int((WARMUP + window) * CAPACITY / (DELAY_MS / 1000) * 1.3)
    dispatch_many(app, count)
    workers = [
        _workers.harvest_worker(ctx.log_dir, CONCURRENCY, config=config, tag=f"s15-{tag}-{n}")
        for n in range(PROCESSES)
    ]
    try:
        stats = receiver.stats
        if not _workers.wait_for(lambda: stats()["count"] + stats()["refused"] > 0, timeout=120):
            raise RuntimeError(f"{tag}: no request arrived\n{workers[0].log_tail()}")
        time.sleep(WARMUP + window + 0.5)
    finally:
        _workers.stop_all(workers, grace=2)
    records = [r for r in receiver.records() if r.path.startswith(prefix)]
    first = min(r.received_at for r in records)
    start, end = first + WARMUP, first + WARMUP + window
    judged = [r for r in records if start <= r.received_at < end]
    refused = sum(1 for r in judged if r.status == 503)
    early = [r for r in records if r.received_at < start]
    return {
        "dispatched": count,
        "config": config or {},
        "window_s": window,
        "requests": len(judged),
        "refused": refused,
        "refused_fraction": refused / len(judged) if judged else None,
        "delivered_per_s": (len(judged) - refused) / window,
        "mean_in_flight": overlap(records, start, end),
        "warmup_requests": len(early),
        "warmup_refused": sum(1 for r in early if r.status == 503),
        # 50 failures in a row (HARVEST_WEBHOOKS_FAILURE_THRESHOLD) turn the subscription off as
        # ``failed``: a fixed cap that keeps the receiver refusing gets there (read at the end).
        "subscriptions": dict(subscription_statuses(ctx.engine)),
    }


def run(ctx: Context) -> Result:
    window = ctx.pick(20.0, 5.0)
    with Receiver() as receiver:
        adaptive = one_run(ctx, receiver, window=window, config=None, tag="adaptive")
        ctx.close_apps()
        fixed = one_run(ctx, receiver, window=window, config=FIXED, tag="fixed")
        ctx.close_apps()
    share, base = adaptive["refused_fraction"], fixed["refused_fraction"]
    result = Result()
    result.rows += [
        Row(
            ID,
            f"503s after the first {WARMUP:g} s ({window:g} s, {adaptive['requests']:,} requests)",
            None if share is None else share * 100,
            "%",
            "<= 5%",
            share is not None and share <= 0.05,
            baseline=None if base is None else base * 100,
            baseline_label="fixed cap 16 per process, %",
            ratio=None if share is None or not base else share / base,
            note=f"warm-up: {adaptive['warmup_refused']} of {adaptive['warmup_requests']} refused",
        ),
        Row(
            ID,
            f"mean in flight at the receiver (capacity {CAPACITY})",
            adaptive["mean_in_flight"],
            "",
            ">= 15 (most of 20)",
            adaptive["mean_in_flight"] >= 15,
            baseline=fixed["mean_in_flight"],
            baseline_label="fixed cap 16 per process",
            ratio=adaptive["mean_in_flight"] / CAPACITY,
            note=(
                f"ratio is to the capacity; {adaptive['delivered_per_s']:.0f} vs "
                f"{fixed['delivered_per_s']:.0f} delivered/s (ideal {CAPACITY * 1000 // DELAY_MS}/s)"
                + "".join(
                    f"; {name}: subscription {status} by the end of the run "
                    f"({run['warmup_refused']} refusals in the warm-up alone)"
                    for name, run in (("adaptive", adaptive), ("fixed cap", fixed))
                    for status in run["subscriptions"]
                    if status != "active"
                )
            ),
        ),
    ]
    result.details = {"adaptive": adaptive, "fixed": fixed}
    return result


if __name__ == "__main__":
    from .__main__ import main as bench_main

    raise SystemExit(bench_main(["--only", ID, *sys.argv[1:]]))
