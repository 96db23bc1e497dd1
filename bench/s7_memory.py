"""S7: the resident memory of one worker process (``--concurrency 32``) over many deliveries to
10 subscriptions on a receiver that answers at once.

Baseline: its RSS once the first 1,000 deliveries were received. Goal: growth <= 10% by the end.
"""

from __future__ import annotations

import sys
import threading
import time

from . import _workers
from ._receivers import Receiver
from ._report import Context, Result, Row
from ._scenario import delivery_states, dispatch_many, subscribe
from ._services import reset_all

ID = "S7"
TITLE = "worker memory over many deliveries"
SUBSCRIPTIONS = 10
FIRST = 1000


def run(ctx: Context) -> Result:
    total = ctx.pick(20_000, 2_000)
    reset_all(ctx.engine)
    samples: list[tuple[float, int, int]] = []
    with Receiver() as receiver:
        app = ctx.app()
        subscribe(app, [receiver.url(f"/ok/s7/{n}") for n in range(SUBSCRIPTIONS)])
        feeder = threading.Thread(target=dispatch_many, args=(app, total // SUBSCRIPTIONS), daemon=True)
        feeder.start()
        worker = _workers.harvest_worker(ctx.log_dir, 32, tag="s7")
        started = time.monotonic()
        try:
            while True:
                count = receiver.count("/ok/s7/")
                rss = worker.rss_bytes()
                if rss is None:
                    raise RuntimeError(f"the worker exited\n{worker.log_tail()}")
                samples.append((time.monotonic() - started, count, rss))
                if count >= total:
                    break
                if time.monotonic() - started > 120 + total / 20:
                    raise RuntimeError(f"only {count} of {total} deliveries in time")
                time.sleep(0.25)
            time.sleep(1)  # let the last outcomes be recorded
            final = worker.rss_bytes() or samples[-1][2]
        finally:
            worker.stop()
            feeder.join(timeout=60)
    at_first = next(rss for _, count, rss in samples if count >= FIRST)
    peak = max(rss for _, _, rss in samples)
    growth = final / at_first - 1
    seconds = samples[-1][0]
    result = Result()
    result.rows.append(
        Row(
            ID,
            f"worker RSS after {total:,} deliveries",
            final / 2**20,
            "MiB",
            "growth <= 10%",
            growth <= 0.10,
            baseline=at_first / 2**20,
            baseline_label=f"after first {FIRST:,}",
            ratio=final / at_first,
            note=f"growth {growth * 100:.1f}%, peak {peak / 2**20:.1f} MiB",
        )
    )
    step = max(1, len(samples) // 200)
    result.details = {
        "deliveries": total,
        "seconds": seconds,
        "rss_mib_after_first": at_first / 2**20,
        "rss_mib_final": final / 2**20,
        "rss_mib_peak": peak / 2**20,
        "growth": growth,
        "samples": [[round(t, 2), n, round(r / 2**20, 2)] for t, n, r in samples[::step]],
        "states": dict(delivery_states(ctx.engine)),
    }
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
