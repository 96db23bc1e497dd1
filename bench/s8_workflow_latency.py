"""S8: start -> completion latency of a 3-step no-op workflow at a steady 20 starts/s, 2 worker
processes, against DBOS Transact running the same workflow through a DBOS queue (2 processes,
worker concurrency 32, 50 ms polling) on the same PostgreSQL, in alternating segments.

Latency is the run's completion time as its row records it (our ``completed_at``, DBOS's
``updated_at``) minus the time the harness called start (``time.time()`` just before).

Goal (issue 13): p50 no higher than DBOS's.
"""

from __future__ import annotations

import sys
from typing import Any

from . import _dbos_app, _workers
from ._report import Context, Result, Row, median, percentile
from ._services import reset_all
from ._workflow_runs import (
    SteadyStarter,
    dbos_prepare,
    dbos_starter,
    dbos_workers,
    harvest_finished,
    harvest_starter,
    harvest_workers,
)

ID = "S8"
TITLE = "workflow latency at 20 starts/s, ours vs DBOS"
RATE = 20.0


def _segment(starter: SteadyStarter, finished: Any, count: int) -> tuple[list[float], float]:
    starter.start()
    starter.join(timeout=count / RATE + 60)
    if starter.error is not None:
        raise starter.error
    done = _workers.wait_for(lambda: set(starter.sent) <= set(finished()), timeout=60, interval=0.2)
    if not done:
        raise RuntimeError(f"only {len(set(starter.sent) & set(finished()))} of {count} runs completed")
    ends = finished()
    return [(ends[key][1] - sent) * 1000 for key, sent in starter.sent.items()], starter.behind


def run(ctx: Context) -> Result:
    per_segment = ctx.pick(300, 60)
    segments = ctx.pick(2, 1)
    dbos_engine = dbos_prepare()
    client = _dbos_app.client()
    ours: list[float] = []
    theirs: list[float] = []
    behind = 0.0
    try:
        for segment in range(segments):
            reset_all(ctx.engine)
            app = ctx.app()
            workers = harvest_workers(ctx.log_dir, f"s8-{segment}")
            try:
                latencies, late = _segment(
                    SteadyStarter(harvest_starter(app), per_segment, RATE),
                    lambda: harvest_finished(ctx.engine),
                    per_segment,
                )
                ours += latencies
                behind = max(behind, late)
            finally:
                _workers.stop_all(workers)
            _dbos_app.reset(dbos_engine)
            workers = dbos_workers(ctx.log_dir, f"s8-{segment}")
            try:
                latencies, late = _segment(
                    SteadyStarter(dbos_starter(client), per_segment, RATE),
                    lambda: _dbos_app.finished_times(dbos_engine),
                    per_segment,
                )
                theirs += latencies
                behind = max(behind, late)
            finally:
                _workers.stop_all(workers)
    finally:
        client.destroy()
        dbos_engine.dispose()
    p50, p95, p99 = median(ours), percentile(ours, 95), percentile(ours, 99)
    d50, d95, d99 = median(theirs), percentile(theirs, 95), percentile(theirs, 99)
    total = per_segment * segments
    result = Result()
    result.rows += [
        Row(
            ID,
            f"p50 start -> completion, 3 no-op steps ({total:,} at {RATE:g}/s)",
            p50,
            "ms",
            "<= DBOS's p50",
            p50 <= d50,
            baseline=d50,
            baseline_label="DBOS",
            ratio=p50 / d50,
        ),
        Row(ID, "p95", p95, "ms", "report", None, baseline=d95, baseline_label="DBOS", ratio=p95 / d95),
        Row(ID, "p99", p99, "ms", "report", None, baseline=d99, baseline_label="DBOS", ratio=p99 / d99),
    ]
    result.details = {
        "runs_each": total,
        "segments": segments,
        "starter_behind_s": behind,
        "harvest_ms": {"p50": p50, "p95": p95, "p99": p99, "max": max(ours)},
        "dbos_ms": {"p50": d50, "p95": d95, "p99": d99, "max": max(theirs)},
        "dbos": {
            "worker_concurrency": _dbos_app.WORKER_CONCURRENCY,
            "polling_interval_s": _dbos_app.POLLING_INTERVAL,
        },
    }
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
