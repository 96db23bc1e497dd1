"""S9: throughput of a 3-step no-op workflow, N runs started at once (before the workers start),
through the documented production setup (2 ``flask harvest worker`` processes), against DBOS
Transact running the same workflow through a DBOS queue with 2 worker processes (worker
concurrency 32, 50 ms polling) on the same PostgreSQL. Runs alternate, best of each.

Throughput is counted from the completion times the rows record, first to last.

Goal (issue 13): at least 2x DBOS's workflows/s.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable

from . import _dbos_app, _workers
from ._report import Context, Result, Row, rate
from ._services import reset_all
from ._workflow_runs import (
    dbos_prepare,
    dbos_starter,
    dbos_workers,
    harvest_finished,
    harvest_starter,
    harvest_workers,
)

ID = "S9"
TITLE = "workflow throughput, N started at once, ours vs DBOS"
STEPS = 3


def _drain(
    start: Callable[[int], str],
    count: int,
    finished: Callable[[], dict[str, tuple[float, float]]],
    workers: Callable[[], list[_workers.WorkerProcess]],
) -> dict[str, float]:
    begun = time.perf_counter()
    for number in range(count):
        start(number)
    start_seconds = time.perf_counter() - begun
    running = workers()
    try:
        done = _workers.wait_for(lambda: len(finished()) >= count, timeout=count / 5 + 60, interval=0.25)
        cpu = sum(worker.cpu_seconds() for worker in running)
    finally:
        _workers.stop_all(running)
    ends = [end for _, end in finished().values()]
    if not done:
        raise RuntimeError(f"only {len(ends)} of {count} runs completed")
    per_second = rate(ends)
    return {
        "workflows_per_s": per_second,
        "start_ms_each": start_seconds * 1000 / count,
        "worker_cpu_ms_per_workflow": cpu * 1000 / count,
        "span_s": max(ends) - min(ends),
    }


def run(ctx: Context) -> Result:
    count = ctx.pick(2000, 300)
    rounds = ctx.pick(2, 1)
    dbos_engine = dbos_prepare()
    client = _dbos_app.client()
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    try:
        for number in range(rounds):
            reset_all(ctx.engine)
            app = ctx.app()
            ours.append(
                _drain(
                    harvest_starter(app),
                    count,
                    lambda: harvest_finished(ctx.engine),
                    lambda: harvest_workers(ctx.log_dir, f"s9-{number}"),  # noqa: B023 (called at once)
                )
            )
            _dbos_app.reset(dbos_engine)
            theirs.append(
                _drain(
                    dbos_starter(client),
                    count,
                    lambda: _dbos_app.finished_times(dbos_engine),
                    lambda: dbos_workers(ctx.log_dir, f"s9-{number}"),  # noqa: B023 (called at once)
                )
            )
    finally:
        client.destroy()
        dbos_engine.dispose()
    best = max(ours, key=lambda r: r["workflows_per_s"])
    base = max(theirs, key=lambda r: r["workflows_per_s"])
    ratio = best["workflows_per_s"] / base["workflows_per_s"]
    result = Result()
    result.rows += [
        Row(
            ID,
            f"workflows/s, 2 processes, {count:,} started at once",
            best["workflows_per_s"],
            "/s",
            ">= 2x DBOS",
            ratio >= 2 and not math.isnan(ratio),
            baseline=base["workflows_per_s"],
            baseline_label="DBOS",
            ratio=ratio,
            note=f"best of {rounds}; worker CPU {best['worker_cpu_ms_per_workflow']:.1f} vs "
            f"{base['worker_cpu_ms_per_workflow']:.1f} ms per workflow",
        ),
        Row(
            ID,
            f"steps/s ({STEPS} per workflow)",
            best["workflows_per_s"] * STEPS,
            "/s",
            "report",
            None,
            baseline=base["workflows_per_s"] * STEPS,
            baseline_label="DBOS",
            ratio=ratio,
        ),
        Row(
            ID,
            "start, ms per call (harness, one at a time)",
            best["start_ms_each"],
            "ms",
            "report",
            None,
            baseline=base["start_ms_each"],
            baseline_label="DBOS enqueue",
            ratio=best["start_ms_each"] / base["start_ms_each"],
        ),
    ]
    result.details = {"count": count, "rounds": rounds, "harvest": ours, "dbos": theirs}
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
