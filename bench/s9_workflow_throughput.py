"""S9: workflow throughput through the documented production setup (2 ``flask harvest worker``
processes), against DBOS Transact running the same workflows through a DBOS queue with 2 worker
processes (worker concurrency 32, 50 ms polling) on the same PostgreSQL. Every variant runs both
engines in the same round; rounds alternate which engine goes first; best of each.

* **at once**: a 3-step no-op workflow, N runs started before the workers start; ours at the
  package's default settings (``HARVEST_WORKFLOW_CONCURRENCY`` unset, the default ``--concurrency``)
  and tuned (``HARVEST_WORKFLOW_CONCURRENCY`` 32, ``--concurrency 32``). Counted from the completion
  times the rows record, first to last.
* **while running**: the workers run first; a client then starts the N runs one after another (as
  a web app would), ours at the default settings, DBOS enqueueing. Counted from the first start
  call to the last completion, so the start path counts. With one client, a system whose workers
  keep up shows the client's start rate; a second row starts from 4 client threads.
* **10 steps**: steps/s of a 10-step no-op workflow started at once, ours at the default settings.
* **start**: ms per start call (ours) and per ``DBOSClient.enqueue`` (DBOS), both timed by the
  harness one call after another, before the workers start (and, second row, while they run).

Goal (issue 13): at least 2x DBOS's workflows/s.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from flask_harvest.config import Settings

from . import _dbos_app, _workers
from ._app import NOOP3, NOOP10
from ._report import Context, Result, Row, rate
from ._services import reset_all
from ._workflow_runs import (
    CONCURRENCY,
    dbos_prepare,
    dbos_starter,
    dbos_workers,
    harvest_finished,
    harvest_starter,
    harvest_workers,
)

ID = "S9"
TITLE = "workflow throughput, ours (default and tuned settings) vs DBOS"
STEPS = 3
LONG_STEPS = 10
#: The package's default, read from it (whatever it is when the benchmark runs).
DEFAULT_WORKFLOW_CONCURRENCY = Settings().workflow_concurrency

Finished = Callable[[], dict[str, tuple[float, float]]]
Workers = Callable[[], list[_workers.WorkerProcess]]


@dataclass(frozen=True)
class Setup:
    """Our settings for a variant: the app's config overrides (``None`` removes a key, so the
    default applies) and the workers' ``--concurrency``."""

    config: dict[str, Any]
    worker_concurrency: int


DEFAULT = Setup({"HARVEST_WORKFLOW_CONCURRENCY": None}, _workers.DEFAULT_CONCURRENCY)
TUNED = Setup({"HARVEST_WORKFLOW_CONCURRENCY": CONCURRENCY}, CONCURRENCY)


def _timeout(count: int) -> float:
    return count / 2 + 60


def _finish(
    count: int, finished: Finished, running: list[_workers.WorkerProcess]
) -> tuple[list[float], float]:
    """Wait for ``count`` completed runs, stop the workers; return the completion times and the
    workers' CPU seconds."""
    try:
        done = _workers.wait_for(lambda: len(finished()) >= count, timeout=_timeout(count), interval=0.25)
        cpu = sum(worker.cpu_seconds() for worker in running)
    finally:
        _workers.stop_all(running)
    ends = [end for _, end in finished().values()]
    if not done:
        raise RuntimeError(f"only {len(ends)} of {count} runs completed")
    return ends, cpu


def _at_once(
    start: Callable[[int], str], count: int, finished: Finished, workers: Workers
) -> dict[str, float]:
    """Start ``count`` runs, then the workers; throughput from the first completion to the last."""
    begun = time.perf_counter()
    for number in range(count):
        start(number)
    start_seconds = time.perf_counter() - begun
    ends, cpu = _finish(count, finished, workers())
    return {
        "workflows_per_s": rate(ends),
        "start_ms_each": start_seconds * 1000 / count,
        "worker_cpu_ms_per_workflow": cpu * 1000 / count,
        "span_s": max(ends) - min(ends),
    }


def _while_running(
    start: Callable[[int], str], count: int, finished: Finished, workers: Workers, clients: int = 1
) -> dict[str, float]:
    """Start the workers, then ``count`` runs one after another from each of ``clients`` threads
    (as the threads of a web app would); throughput from the first start call to the last
    completion."""
    running = workers()

    def client(first_number: int) -> None:
        for number in range(first_number, count, clients):
            start(number)

    try:
        first = time.time()
        begun = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            for done in [pool.submit(client, number) for number in range(clients)]:
                done.result()
        start_seconds = time.perf_counter() - begun
    except BaseException:
        _workers.stop_all(running)
        raise
    ends, cpu = _finish(count, finished, running)
    span = max(ends) - first
    return {
        "workflows_per_s": count / span if span > 0 else math.nan,
        # Each client's calls one after another: the time one start took.
        "start_ms_each": start_seconds * 1000 * clients / count,
        "worker_cpu_ms_per_workflow": cpu * 1000 / count,
        "span_s": span,
    }


#: Client threads of the while-running variant whose figure is the workers', not one client's.
CLIENTS = 4
_clients = partial(_while_running, clients=CLIENTS)


#: The variants of a round, each run by both engines: their results in ``details``.
VARIANTS = (
    "harvest",
    "harvest_tuned",
    "dbos",
    "harvest_live",
    "dbos_live",
    "harvest_clients",
    "dbos_clients",
    "harvest_10",
    "dbos_10",
)


def _best(results: list[dict[str, float]]) -> dict[str, float]:
    return max(results, key=lambda r: r["workflows_per_s"])


def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs else math.nan


def run(ctx: Context) -> Result:
    count = ctx.pick(2000, 300)
    rounds = ctx.pick(2, 1)
    dbos_engine = dbos_prepare()
    client = _dbos_app.client()
    found: dict[str, list[dict[str, float]]] = {key: [] for key in VARIANTS}

    def ours(setup: Setup, measure: Any, name: str, tag: str) -> dict[str, float]:
        reset_all(ctx.engine)
        app = ctx.app(setup.config)
        return dict(
            measure(
                harvest_starter(app, name),
                count,
                lambda: harvest_finished(ctx.engine),
                lambda: harvest_workers(
                    ctx.log_dir, tag, concurrency=setup.worker_concurrency, config=setup.config
                ),
            )
        )

    def theirs(measure: Any, name: str, tag: str) -> dict[str, float]:
        _dbos_app.reset(dbos_engine)
        return dict(
            measure(
                dbos_starter(client, name),
                count,
                lambda: _dbos_app.finished_named(dbos_engine, name),
                lambda: dbos_workers(ctx.log_dir, tag),
            )
        )

    try:
        for number in range(rounds):
            tag = f"s9-{number}"
            variants: list[tuple[str, Callable[[], dict[str, float]]]] = [
                ("harvest", lambda: ours(DEFAULT, _at_once, NOOP3, f"{tag}-default")),  # noqa: B023
                ("dbos", lambda: theirs(_at_once, _dbos_app.WORKFLOW, tag)),  # noqa: B023
                ("harvest_tuned", lambda: ours(TUNED, _at_once, NOOP3, f"{tag}-tuned")),  # noqa: B023
                ("harvest_live", lambda: ours(DEFAULT, _while_running, NOOP3, f"{tag}-live")),  # noqa: B023
                ("dbos_live", lambda: theirs(_while_running, _dbos_app.WORKFLOW, f"{tag}-live")),  # noqa: B023
                ("harvest_clients", lambda: ours(DEFAULT, _clients, NOOP3, f"{tag}-clients")),  # noqa: B023
                ("dbos_clients", lambda: theirs(_clients, _dbos_app.WORKFLOW, f"{tag}-clients")),  # noqa: B023
                ("harvest_10", lambda: ours(DEFAULT, _at_once, NOOP10, f"{tag}-10")),  # noqa: B023
                ("dbos_10", lambda: theirs(_at_once, _dbos_app.WORKFLOW10, f"{tag}-10")),  # noqa: B023
            ]
            # Odd rounds run the variants in the other order, so neither engine always goes first.
            for key, measure in variants if number % 2 == 0 else variants[::-1]:
                found[key].append(measure())
    finally:
        client.destroy()
        dbos_engine.dispose()
    return _result(found, count, rounds)


def _result(found: dict[str, list[dict[str, float]]], count: int, rounds: int) -> Result:
    default, tuned, base = _best(found["harvest"]), _best(found["harvest_tuned"]), _best(found["dbos"])
    live, base_live = _best(found["harvest_live"]), _best(found["dbos_live"])
    many, base_many = _best(found["harvest_clients"]), _best(found["dbos_clients"])
    long, base_long = _best(found["harvest_10"]), _best(found["dbos_10"])

    def cpu(ours: dict[str, float], theirs: dict[str, float]) -> str:
        return (
            f"worker CPU {ours['worker_cpu_ms_per_workflow']:.1f} vs "
            f"{theirs['worker_cpu_ms_per_workflow']:.1f} ms per workflow"
        )

    def throughput(
        figure: str, ours: dict[str, float], other: dict[str, float], note: str, steps: int = 1
    ) -> Row:
        ratio = _ratio(ours["workflows_per_s"], other["workflows_per_s"])
        return Row(
            ID,
            figure,
            ours["workflows_per_s"] * steps,
            "/s",
            ">= 2x DBOS",
            ratio >= 2 and not math.isnan(ratio),
            baseline=other["workflows_per_s"] * steps,
            baseline_label="DBOS",
            ratio=ratio,
            note=f"best of {rounds}; {note}; {cpu(ours, other)}",
        )

    # A start's cost, timed the same way for both: the harness's calls one after another.
    start_at_once = min(r["start_ms_each"] for key in ("harvest", "harvest_tuned") for r in found[key])
    enqueue_at_once = min(r["start_ms_each"] for r in found["dbos"])
    start_live = min(r["start_ms_each"] for r in found["harvest_live"])
    enqueue_live = min(r["start_ms_each"] for r in found["dbos_live"])
    defaults = (
        f"HARVEST_WORKFLOW_CONCURRENCY {DEFAULT_WORKFLOW_CONCURRENCY} (default), "
        f"--concurrency {DEFAULT.worker_concurrency}"
    )
    result = Result()
    result.rows += [
        throughput(f"workflows/s, {count:,} started at once, default settings", default, base, defaults),
        throughput(
            f"workflows/s, {count:,} started at once, tuned",
            tuned,
            base,
            f"HARVEST_WORKFLOW_CONCURRENCY {CONCURRENCY}, --concurrency {CONCURRENCY}",
        ),
        throughput(
            f"workflows/s, {count:,} started one by one while the workers run, first start to last end",
            live,
            base_live,
            f"default settings; the client's starts took {live['start_ms_each']:.1f} vs "
            f"{base_live['start_ms_each']:.1f} ms each (one client starts at most "
            f"{1000 / live['start_ms_each']:.0f} vs {1000 / base_live['start_ms_each']:.0f} /s)",
        ),
        throughput(
            f"workflows/s, {count:,} started by {CLIENTS} client threads while the workers run, "
            "first start to last end",
            many,
            base_many,
            f"default settings; a start took {many['start_ms_each']:.1f} vs "
            f"{base_many['start_ms_each']:.1f} ms in each client",
        ),
        throughput(
            f"steps/s, {LONG_STEPS}-step workflow, {count:,} started at once, default settings",
            long,
            base_long,
            f"{long['workflows_per_s']:.0f} vs {base_long['workflows_per_s']:.0f} workflows/s",
            steps=LONG_STEPS,
        ),
        Row(
            ID,
            "start, ms per call (harness, one after another, workers stopped)",
            start_at_once,
            "ms",
            "report",
            None,
            baseline=enqueue_at_once,
            baseline_label="DBOS enqueue",
            ratio=_ratio(start_at_once, enqueue_at_once),
            note="lowest per-call mean of the at-once rounds",
        ),
        Row(
            ID,
            "start, ms per call (harness, one after another, workers running)",
            start_live,
            "ms",
            "report",
            None,
            baseline=enqueue_live,
            baseline_label="DBOS enqueue",
            ratio=_ratio(start_live, enqueue_live),
            note="lowest per-call mean of the while-running rounds",
        ),
    ]
    result.details = {
        "count": count,
        "rounds": rounds,
        "default_workflow_concurrency": DEFAULT_WORKFLOW_CONCURRENCY,
        "default_worker_concurrency": DEFAULT.worker_concurrency,
        "tuned_concurrency": CONCURRENCY,
        **found,
    }
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
