"""S17: fan-out through child runs: P parents each start C children (one no-op step each) and wait
for every one, through the documented production setup (2 ``flask harvest worker`` processes at
``--concurrency 32``), against DBOS Transact running the same parent, which enqueues its children
on its queue and waits for their handles (2 worker processes, worker concurrency 32, 50 ms
polling), on the same PostgreSQL. The workers are up before the parents start; rounds alternate.

Figures: children/s (first to last child completion), and each parent's end-to-end time (its
start to its completion). Goal: at least DBOS's children/s.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable

import sqlalchemy as sa
from flask import Flask

from flask_harvest import workflow_service
from flask_harvest.workflows._schema import executions_table

from . import _dbos_app, _workers
from ._app import FANOUT_CHILD, FANOUT_PARENT
from ._report import Context, Result, Row, rate
from ._services import reset_all
from ._workflow_runs import dbos_prepare, dbos_workers, harvest_workers

ID = "S17"
TITLE = "fan-out through child runs, ours vs DBOS"


def _harvest_finished(engine: sa.Engine, name: str) -> dict[str, tuple[float, float]]:
    table = executions_table
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(table.c.execution_id, table.c.created_at, table.c.completed_at).where(
                table.c.state == "Completed", table.c.workflow_name == name
            )
        ).all()
    return {row[0]: (row[1].timestamp(), row[2].timestamp()) for row in rows}


def _harvest_start(app: Flask, children: int) -> Callable[[int], str]:
    def start(number: int) -> str:
        with app.app_context():
            handle, _ = workflow_service(app).start(FANOUT_PARENT, {"children": children, "n": number})
        return handle.execution_id

    return start


def _round(
    start: Callable[[int], str],
    parents: int,
    children: int,
    finished: Callable[[str], dict[str, tuple[float, float]]],
    workers: list[_workers.WorkerProcess],
) -> dict[str, float]:
    try:
        cpu_before = sum(worker.cpu_seconds() for worker in workers)
        begun = time.time()
        for number in range(parents):
            start(number)
        done = _workers.wait_for(
            lambda: len(finished(FANOUT_PARENT)) >= parents,
            timeout=parents * children / 5 + 120,
            interval=0.25,
        )
        cpu = sum(worker.cpu_seconds() for worker in workers) - cpu_before
    finally:
        _workers.stop_all(workers)
    tops = finished(FANOUT_PARENT)
    kids = finished(FANOUT_CHILD)
    if not done or len(kids) < parents * children:
        raise RuntimeError(f"{len(tops)} of {parents} parents and {len(kids)} children completed")
    end_to_end = [end - created for created, end in tops.values()]
    return {
        "children_per_s": rate([end for _, end in kids.values()]),
        "parent_p50_s": statistics.median(end_to_end),
        "parent_max_s": max(end_to_end),
        "wall_s": max(end for _, end in tops.values()) - begun,
        "worker_cpu_ms_per_child": cpu * 1000 / (parents * children),
    }


def run(ctx: Context) -> Result:
    parents = ctx.pick(20, 4)
    children = ctx.pick(50, 10)
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
                _round(
                    _harvest_start(app, children),
                    parents,
                    children,
                    lambda name: _harvest_finished(ctx.engine, name),
                    harvest_workers(ctx.log_dir, f"s17-{number}"),
                )
            )
            _dbos_app.reset(dbos_engine)
            theirs.append(
                _round(
                    lambda n: _dbos_app.enqueue_named(client, FANOUT_PARENT, {"children": children, "n": n}),
                    parents,
                    children,
                    lambda name: _dbos_app.finished_named(dbos_engine, name),
                    dbos_workers(ctx.log_dir, f"s17-{number}"),
                )
            )
    finally:
        client.destroy()
        dbos_engine.dispose()
    best = max(ours, key=lambda r: r["children_per_s"])
    base = max(theirs, key=lambda r: r["children_per_s"])
    ratio = best["children_per_s"] / base["children_per_s"]
    result = Result()
    result.rows += [
        Row(
            ID,
            f"children/s, {parents} parents x {children} children, 2 processes",
            best["children_per_s"],
            "/s",
            ">= DBOS",
            ratio >= 1 and not math.isnan(ratio),
            baseline=base["children_per_s"],
            baseline_label="DBOS",
            ratio=ratio,
            note=f"best of {rounds}; worker CPU {best['worker_cpu_ms_per_child']:.1f} vs "
            f"{base['worker_cpu_ms_per_child']:.1f} ms per child",
        ),
        Row(
            ID,
            "parent end-to-end, p50",
            best["parent_p50_s"] * 1000,
            "ms",
            "report",
            None,
            baseline=base["parent_p50_s"] * 1000,
            baseline_label="DBOS",
            ratio=best["parent_p50_s"] / base["parent_p50_s"],
        ),
        Row(
            ID,
            "parent end-to-end, slowest",
            best["parent_max_s"] * 1000,
            "ms",
            "report",
            None,
            baseline=base["parent_max_s"] * 1000,
            baseline_label="DBOS",
            ratio=best["parent_max_s"] / base["parent_max_s"],
        ),
    ]
    result.details = {
        "parents": parents,
        "children": children,
        "rounds": rounds,
        "harvest": ours,
        "dbos": theirs,
    }
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
