"""S18: what a workflow queue costs, in S9's setup: the same 3-step no-op workflow, N runs started
at once before 2 ``flask harvest worker`` processes start, run (a) in no queue (S9 itself), (b) in a
queue with no limit, and (c) in a queue whose runs carry a concurrency key with a limit of 1 (as
many keys as the workers have threads, so the limit is checked on every claim but rarely binds).
Rounds alternate, best of each.

Goal: the key-limited queue costs at most 1.2x the unlimited queue (its throughput at least 1/1.2
of it).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from flask import Flask

from flask_harvest import workflow_service

from . import _workers
from ._app import BENCH_QUEUE, NOOP3
from ._report import Context, Result, Row, rate
from ._services import reset_all
from ._workflow_runs import CONCURRENCY, PROCESSES, harvest_finished, harvest_workers

ID = "S18"
TITLE = "workflow queue cost: no queue, an unlimited queue, a queue with a key limit"
#: The most a key limit may cost over an unlimited queue.
LIMIT = 1.2
KEYS = CONCURRENCY * PROCESSES


def _starter(app: Flask, variant: str) -> Callable[[int], str]:
    def start(number: int) -> str:
        fields: dict[str, Any] = {}
        if variant != "none":
            fields["queue"] = BENCH_QUEUE
        if variant == "keyed":
            fields.update(concurrency_key=f"key-{number % KEYS}", concurrency_limit=1)
        with app.app_context():
            handle, _ = workflow_service(app).start(NOOP3, {"n": number}, **fields)
        return handle.execution_id

    return start


def _drain(ctx: Context, variant: str, count: int, tag: str) -> dict[str, float]:
    reset_all(ctx.engine)
    start = _starter(ctx.app(), variant)
    begun = time.perf_counter()
    for number in range(count):
        start(number)
    start_seconds = time.perf_counter() - begun
    running = harvest_workers(ctx.log_dir, tag)
    try:
        done = _workers.wait_for(
            lambda: len(harvest_finished(ctx.engine)) >= count, timeout=count / 5 + 60, interval=0.25
        )
        cpu = sum(worker.cpu_seconds() for worker in running)
    finally:
        _workers.stop_all(running)
    ends = [end for _, end in harvest_finished(ctx.engine).values()]
    if not done:
        raise RuntimeError(f"{variant}: only {len(ends)} of {count} runs completed")
    return {
        "workflows_per_s": rate(ends),
        "start_ms_each": start_seconds * 1000 / count,
        "worker_cpu_ms_per_workflow": cpu * 1000 / count,
    }


def run(ctx: Context) -> Result:
    count = ctx.pick(2000, 300)
    rounds = ctx.pick(2, 1)
    variants = ("none", "open", "keyed")
    results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for number in range(rounds):
        for variant in variants:
            results[variant].append(_drain(ctx, variant, count, f"s17-{variant}-{number}"))
    best = {v: max(results[v], key=lambda r: r["workflows_per_s"]) for v in variants}
    keyed, open_, plain = best["keyed"], best["open"], best["none"]
    cost = open_["workflows_per_s"] / keyed["workflows_per_s"]
    result = Result()
    result.rows += [
        Row(
            ID,
            f"workflows/s, a queue with a key limit, {count:,} started at once",
            keyed["workflows_per_s"],
            "/s",
            f"<= {LIMIT}x the cost of an unlimited queue",
            cost <= LIMIT,
            baseline=open_["workflows_per_s"],
            baseline_label="unlimited queue",
            ratio=keyed["workflows_per_s"] / open_["workflows_per_s"],
            note=f"best of {rounds}; cost {cost:.2f}x; worker CPU {keyed['worker_cpu_ms_per_workflow']:.1f} "
            f"vs {open_['worker_cpu_ms_per_workflow']:.1f} ms per workflow",
        ),
        Row(
            ID,
            "workflows/s, an unlimited queue",
            open_["workflows_per_s"],
            "/s",
            "report",
            None,
            baseline=plain["workflows_per_s"],
            baseline_label="no queue",
            ratio=open_["workflows_per_s"] / plain["workflows_per_s"],
            note=f"worker CPU {open_['worker_cpu_ms_per_workflow']:.1f} vs "
            f"{plain['worker_cpu_ms_per_workflow']:.1f} ms per workflow",
        ),
        Row(
            ID,
            "start, ms per call, a queue with a key limit",
            keyed["start_ms_each"],
            "ms",
            "report",
            None,
            baseline=plain["start_ms_each"],
            baseline_label="no queue",
            ratio=keyed["start_ms_each"] / plain["start_ms_each"],
        ),
    ]
    result.details = {"count": count, "rounds": rounds, **results}
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
