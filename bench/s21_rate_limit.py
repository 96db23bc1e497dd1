"""S21: a subscription's rate limit across worker processes: one subscription limited to
``RATE`` deliveries per second (burst ``BURST``) and one unlimited beside it, both with a backlog
queued beforehand, the documented production setup (2 processes x the default ``--concurrency``).

Baseline: the limit itself; the figure is the rate the limited receiver got over the window
(from ``WARMUP`` s after its first request, so the initial burst is not counted). Goal: within 5%
of the limit. Also reported: the most requests in any one-second window against the bound
``rate + burst`` (a correctness bound, which the tests assert too), and the unlimited
subscription's rate in the same run (it must not be held back by its neighbour's limit).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from flask_harvest import WebhookSubscription, generate_secret, get_engine
from flask_harvest.outbound.rate import RateLimit

from . import _workers
from ._receivers import Receiver, Record
from ._report import Context, Result, Row
from ._scenario import dispatch_many
from ._services import reset_all

ID = "S21"
TITLE = "a subscription's rate limit shared by two worker processes, an unlimited one beside it"
PROCESSES = 2
CONCURRENCY = _workers.DEFAULT_CONCURRENCY
RATE = 50.0
BURST = 10
#: Seconds after the limited receiver's first request that are not judged (the burst).
WARMUP = 1.0


def most_in_window(records: list[Record], seconds: float) -> int:
    """The most requests received within any window of ``seconds`` (half-open)."""
    times = sorted(r.received_at for r in records)
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= seconds:
            first += 1
        most = max(most, last - first + 1)
    return most


def run(ctx: Context) -> Result:
    window = ctx.pick(20.0, 5.0)
    with Receiver() as receiver:
        reset_all(ctx.engine)
        app = ctx.app()
        with app.app_context():
            store = get_engine(app).store
            store.add_subscription(
                WebhookSubscription(
                    receiver.url("/limited/"),
                    ["bench.limited"],
                    generate_secret(),
                    rate_limit=RateLimit(per_second=RATE, burst=BURST),
                )
            )
            store.add_subscription(
                WebhookSubscription(receiver.url("/free/"), ["bench.free"], generate_secret())
            )
        # More than the limit lets through in the run, so the limit, not the backlog, sets the pace.
        limited_count = int(BURST + (WARMUP + window + 2) * RATE)
        free_count = ctx.pick(4000, 1000)
        dispatch_many(app, limited_count, "bench.limited")
        dispatch_many(app, free_count, "bench.free")
        workers = [
            _workers.harvest_worker(ctx.log_dir, CONCURRENCY, tag=f"s21-{n}") for n in range(PROCESSES)
        ]
        try:
            if not receiver.wait_count(1, timeout=120, prefix="/limited/"):
                raise RuntimeError(f"no request arrived\n{workers[0].log_tail()}")
            time.sleep(WARMUP + window + 0.5)
        finally:
            _workers.stop_all(workers, grace=2)
        records = receiver.records()
    limited = [r for r in records if r.path.startswith("/limited/")]
    free = [r for r in records if r.path.startswith("/free/")]
    first = min(r.received_at for r in limited)
    start, end = first + WARMUP, first + WARMUP + window
    achieved = sum(1 for r in limited if start <= r.received_at < end) / window
    free_span = max(r.received_at for r in free) - min(r.received_at for r in free) if free else 0.0
    peak = most_in_window(limited, 1.0)
    details: dict[str, Any] = {
        "rate": RATE,
        "burst": BURST,
        "window_s": window,
        "limited_dispatched": limited_count,
        "limited_received": len(limited),
        "achieved_per_s": achieved,
        "most_in_one_second": peak,
        # Requests in each second from the first: where a shortfall happened.
        "limited_by_second": [
            sum(1 for r in limited if first + k <= r.received_at < first + k + 1)
            for k in range(int(WARMUP + window) + 1)
        ],
        "free_dispatched": free_count,
        "free_received": len(free),
        "free_per_s": len(free) / free_span if free_span else None,
    }
    result = Result()
    result.rows += [
        Row(
            ID,
            f"limited subscription's rate over {window:g} s (limit {RATE:g}/s, burst {BURST})",
            achieved,
            "/s",
            "within 5% of the limit",
            abs(achieved - RATE) <= 0.05 * RATE,
            baseline=RATE,
            baseline_label="the limit, /s",
            ratio=achieved / RATE,
        ),
        Row(
            ID,
            "most requests in any 1 s window (bound: rate + burst)",
            float(peak),
            "",
            f"<= {RATE + BURST:g}",
            peak <= RATE + BURST,
            baseline=RATE + BURST,
            baseline_label="rate + burst",
            ratio=peak / (RATE + BURST),
            note=(
                f"the unlimited subscription beside it: {len(free):,} of {free_count:,} delivered "
                f"({details['free_per_s'] or 0:.0f}/s)"
            ),
        ),
    ]
    result.details = details
    return result


if __name__ == "__main__":
    from .__main__ import main as bench_main

    raise SystemExit(bench_main(["--only", ID, *sys.argv[1:]]))
