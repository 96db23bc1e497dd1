"""S20: what workflow shards cost, in S9's setup (the same 3-step no-op workflow, N runs started at
once before 2 ``flask harvest worker`` processes x ``--concurrency 32`` start), on (a) the unsharded
deployment (runs in the app's database), (b) one shard listed by the app's own database URL (the
same database and engine: the router alone), (c) one shard on a database of its own and (d) three
shards (three databases on the same PostgreSQL server).
Rounds alternate, best of each.

Then the cross-shard trigger latency: on three shards, a source workflow that ends at once is
started at a steady 20/s, and one completion trigger starts a target for each. A target whose
``workflow_id`` routes to another shard than its source's is started after the source's terminal
commit, through the trigger outbox; its latency is the target row's ``created_at`` minus the
source row's ``completed_at``. Targets on the source's own shard start in the same transaction and
are reported beside it.

Goals: one shard costs at most 1.05x the unsharded deployment (throughput at least 1/1.05 of it);
cross-shard trigger starts p50 < 100 ms.

On one machine the three shards share its CPU, its disk and one PostgreSQL server: the figures
show what routing costs, not what more servers would add.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from flask import Flask

from flask_harvest import get_engine, workflow_service
from flask_harvest.shards import shard_for_key, shard_of_id
from flask_harvest.triggers.firing import target_workflow_id
from flask_harvest.workflows._schema import executions_table

from . import _workers
from ._app import NOOP3
from ._report import Context, Result, Row, percentile, rate
from ._services import DATABASE_URL, ensure_database, reset_all, reset_database
from ._workflow_runs import CONCURRENCY, PROCESSES, SteadyStarter, harvest_finished

ID = "S20"
TITLE = "workflow shards: unsharded, 1 shard, 3 shards; cross-shard trigger latency"
#: The most one shard may cost over the unsharded deployment.
LIMIT = 1.05
#: Cross-shard trigger starts, p50 below this (ms).
TRIGGER_P50_MS = 100.0
SHARDS = 3


def shard_urls(count: int) -> list[str]:
    """``count`` shard databases beside the benchmark's (``<bench db>_s20_shard<k>``)."""
    base = sa.make_url(DATABASE_URL)
    return [
        base.set(database=f"{base.database}_s20_shard{k}").render_as_string(hide_password=False)
        for k in range(count)
    ]


def _reset_shards(urls: Sequence[str]) -> list[sa.Engine]:
    """Empty every shard's tables (the shard map too, so that a list of another length may use them)."""
    engines = []
    for url in urls:
        ensure_database(url)
        engine = sa.create_engine(url)
        reset_database(engine)
        engines.append(engine)
    return engines


def _workers_for(
    ctx: Context, app_path: str, config: dict[str, Any], tag: str
) -> list[_workers.WorkerProcess]:
    """2 ``flask harvest worker`` processes x ``--concurrency 32`` of ``app_path``, registered."""
    command = [sys.executable, "-m", "flask", "--app", app_path, "harvest", "worker"]
    command += ["--concurrency", str(CONCURRENCY)]
    workers = [
        _workers.WorkerProcess(command, ctx.log_dir / f"worker-{tag}-{n}-{time.monotonic_ns()}.log", config)
        for n in range(PROCESSES)
    ]
    try:
        _workers.wait_registered(PROCESSES, workers=workers)
    except BaseException:
        _workers.stop_all(workers)
        raise
    return workers


def _finished(engines: Sequence[sa.Engine]) -> dict[str, tuple[float, float]]:
    found: dict[str, tuple[float, float]] = {}
    for engine in engines:
        found.update(harvest_finished(engine))
    return found


def _drain(ctx: Context, variant: str, count: int, tag: str) -> dict[str, float]:
    """S9's drain on one layout: ``unsharded``, ``1`` or ``3`` shards."""
    reset_all(ctx.engine)
    config: dict[str, Any] = {}
    engines = [ctx.engine]
    if variant == "1-own":
        # One shard listed by the app's own database URL: the same database and engine as the
        # unsharded deployment, so the difference is the router alone.
        config["HARVEST_WORKFLOW_SHARDS"] = [ctx.engine.url.render_as_string(hide_password=False)]
    elif variant != "unsharded":
        urls = shard_urls(int(variant))
        engines = _reset_shards(urls)
        config["HARVEST_WORKFLOW_SHARDS"] = urls
    try:
        app = ctx.app(config)
        begun = time.perf_counter()
        with app.app_context():
            service = workflow_service(app)
            for number in range(count):
                service.start(NOOP3, {"n": number})
        start_seconds = time.perf_counter() - begun
        # Statistics for the tables the runs were just written to (a claim's plan on
        # a table without them walks every pending run), on every database of the layout.
        for engine in engines:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(sa.text("ANALYZE"))
        running = _workers_for(ctx, "bench._app:create_app", config, tag)
        try:
            done = _workers.wait_for(
                lambda: len(_finished(engines)) >= count, timeout=count / 5 + 60, interval=0.25
            )
            cpu = sum(worker.cpu_seconds() for worker in running)
        finally:
            _workers.stop_all(running)
        ends = [end for _, end in _finished(engines).values()]
    finally:
        for engine in engines:
            if engine is not ctx.engine:
                engine.dispose()
    if not done:
        raise RuntimeError(f"{variant}: only {len(ends)} of {count} runs completed")
    return {
        "workflows_per_s": rate(ends),
        "start_ms_each": start_seconds * 1000 / count,
        "worker_cpu_ms_per_workflow": cpu * 1000 / count,
    }


# -- cross-shard trigger latency -------------------------------------------------------------------


def _rows(engines: Sequence[sa.Engine], name: str) -> list[Any]:
    t = executions_table
    rows: list[Any] = []
    for engine in engines:
        with engine.connect() as conn:
            rows += conn.execute(
                sa.select(
                    t.c.execution_id, t.c.workflow_id, t.c.state, t.c.created_at, t.c.completed_at
                ).where(t.c.workflow_name == name)
            ).all()
    return rows


def _settle(engines: Sequence[sa.Engine], count: int, source: str, target: str) -> None:
    """Wait until every source has ended and every target exists, or nothing moved for 10 s (a
    build that refuses cross-shard targets never starts them, and their sources never end)."""
    last: tuple[int, int] | None = None
    still = time.monotonic()
    while time.monotonic() - still < 10:
        ended = sum(1 for r in _rows(engines, source) if r.completed_at is not None)
        now = (ended, len(_rows(engines, target)))
        if now[0] >= count and now[1] >= count:
            return
        if now != last:
            last, still = now, time.monotonic()
        time.sleep(0.5)


def _trigger_latency(ctx: Context, seconds: float, per_second: float) -> dict[str, Any]:
    """Sources at ``per_second`` for ``seconds`` on three shards; each target's start latency."""
    from . import _trigger_app

    reset_all(ctx.engine)
    urls = shard_urls(SHARDS)
    engines = _reset_shards(urls)
    config = {"HARVEST_WORKFLOW_SHARDS": urls}
    count = round(seconds * per_second)
    trigger_id = _trigger_app.TRIGGER.id
    app: Flask | None = None
    try:
        app = _trigger_app.create_app(config)
        running = _workers_for(ctx, "bench._trigger_app:create_app", config, "s20-triggers")
        try:

            def start(number: int) -> str:
                with app.app_context():
                    handle, _ = workflow_service(app).start(_trigger_app.SOURCE, {"n": number})
                return handle.execution_id

            starter = SteadyStarter(start, count, per_second)
            starter.start()
            starter.join()
            if starter.error is not None:
                raise starter.error

            _settle(engines, count, _trigger_app.SOURCE, _trigger_app.TARGET)
        finally:
            _workers.stop_all(running)
        sources = _rows(engines, _trigger_app.SOURCE)
        targets = {row.workflow_id: row for row in _rows(engines, _trigger_app.TARGET)}
    finally:
        if app is not None:
            with app.app_context():
                get_engine(app).close()
        for engine in engines:
            engine.dispose()
    cross: list[float] = []
    same: list[float] = []
    expected_cross = missing_cross = missing_same = 0
    states: dict[str, int] = {}
    for source in sources:
        states[source.state] = states.get(source.state, 0) + 1
        if source.completed_at is None:
            continue
        key = target_workflow_id(trigger_id, source.execution_id)
        crosses = shard_for_key(key, SHARDS) != shard_of_id(source.execution_id, SHARDS)
        expected_cross += crosses
        target = targets.get(key)
        if target is None:
            if crosses:
                missing_cross += 1
            else:
                missing_same += 1
            continue
        latency = (target.created_at - source.completed_at).total_seconds() * 1000
        (cross if crosses else same).append(latency)
    return {
        "sources": count,
        "source_states": states,
        "behind_s": starter.behind,
        "expected_cross": expected_cross,
        "missing_cross": missing_cross,
        "missing_same": missing_same,
        "cross_ms": cross,
        "same_ms": same,
    }


def run(ctx: Context) -> Result:
    count = ctx.pick(2000, 300)
    rounds = ctx.pick(2, 1)
    variants = ("unsharded", "1-own", "1", "3")
    results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for number in range(rounds):
        for variant in variants:
            results[variant].append(_drain(ctx, variant, count, f"s20-{variant}-{number}"))
    best = {v: max(results[v], key=lambda r: r["workflows_per_s"]) for v in variants}
    plain = best["unsharded"]
    result = Result()
    one_shard = f"<= {LIMIT}x the cost of unsharded"
    labels = {
        "1-own": "1 shard (the app's own database)",
        "1": "1 shard (a database of its own)",
        "3": "3 shards",
    }
    for variant, goal in (("1-own", one_shard), ("1", one_shard), ("3", "report")):
        mine = best[variant]
        ratio = mine["workflows_per_s"] / plain["workflows_per_s"]
        met = ratio >= 1 / LIMIT and not math.isnan(ratio) if variant != "3" else None
        result.rows.append(
            Row(
                ID,
                f"workflows/s, {labels[variant]}, {count:,} started at once",
                mine["workflows_per_s"],
                "/s",
                goal,
                met,
                baseline=plain["workflows_per_s"],
                baseline_label="unsharded",
                ratio=ratio,
                note=f"best of {rounds}; worker CPU {mine['worker_cpu_ms_per_workflow']:.1f} vs "
                f"{plain['worker_cpu_ms_per_workflow']:.1f} ms per workflow; start "
                f"{mine['start_ms_each']:.2f} vs {plain['start_ms_each']:.2f} ms per call",
            )
        )
    seconds = ctx.pick(20.0, 5.0)
    latency = _trigger_latency(ctx, seconds, 20.0)
    cross = latency["cross_ms"]
    p50, p95 = percentile(cross, 50), percentile(cross, 95)
    arrived = f"{len(cross)} of {latency['expected_cross']} cross-shard targets started"
    if not cross:
        note = f"{arrived}: this build does not start a cross-shard trigger target"
    else:
        note = f"{arrived}; p95 {p95:.0f} ms; same-shard p50 {percentile(latency['same_ms'], 50):.1f} ms"
    result.rows += [
        Row(
            ID,
            f"cross-shard trigger start, source commit -> target created, p50 ({seconds:.0f} s at 20/s)",
            p50 if cross else None,
            "ms",
            f"p50 < {TRIGGER_P50_MS:.0f} ms",
            (p50 < TRIGGER_P50_MS and latency["missing_cross"] == 0) if cross else False,
            note=note,
        ),
        Row(ID, "cross-shard trigger start, p95", p95 if cross else None, "ms", "report", None),
    ]
    result.details = {"count": count, "rounds": rounds, **results, "triggers": latency}
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
