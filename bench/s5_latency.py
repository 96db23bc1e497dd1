"""S5: dispatch -> receipt latency under light load: 20 events/s, one subscription, a receiver
that answers at once, the production setup (2 processes x the default ``--concurrency``, 64).

Goal: p50 <= 25 ms, p99 <= 150 ms.
"""

from __future__ import annotations

import sys

from . import _workers
from ._receivers import Receiver
from ._report import Context, Result, Row, median, percentile
from ._scenario import SteadyDispatcher, delivery_states, subscribe
from ._services import reset_all

ID = "S5"
TITLE = "latency under light load (20 events/s)"
PROCESSES = 2
CONCURRENCY = _workers.DEFAULT_CONCURRENCY
RATE = 20.0


def run(ctx: Context) -> Result:
    events = ctx.pick(1200, 160)
    result = Result()
    reset_all(ctx.engine)
    with Receiver() as receiver:
        app = ctx.app()
        subscribe(app, [receiver.url("/ok/s5")])
        workers = [_workers.harvest_worker(ctx.log_dir, CONCURRENCY, tag=f"s5-{n}") for n in range(PROCESSES)]
        try:
            _workers.wait_registered(PROCESSES, workers=workers)
            dispatcher = SteadyDispatcher(app, events, RATE)
            dispatcher.start()
            dispatcher.join(timeout=events / RATE + 60)
            if dispatcher.error is not None:
                raise dispatcher.error
            finished = receiver.wait_count(events, timeout=60, prefix="/ok/s5")
        finally:
            _workers.stop_all(workers)
        records = receiver.records()
    latencies = [r.latency * 1000 for r in records if r.latency is not None]
    p50, p99 = median(latencies), percentile(latencies, 99)
    result.rows += [
        Row(
            ID,
            f"p50 latency ({events:,} events at {RATE:g}/s)",
            p50,
            "ms",
            "<= 25 ms",
            p50 <= 25 and finished,
        ),
        Row(ID, "p99 latency", p99, "ms", "<= 150 ms", p99 <= 150 and finished),
    ]
    result.details = {
        "events": events,
        "received": len(records),
        "finished": finished,
        "dispatcher_behind_s": dispatcher.behind,
        "latency_ms": {
            "p50": p50,
            "p90": percentile(latencies, 90),
            "p99": p99,
            "max": max(latencies) if latencies else None,
        },
        "states": dict(delivery_states(ctx.engine)),
    }
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
