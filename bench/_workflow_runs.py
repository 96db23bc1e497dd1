"""Steps S8 and S9 share: starting the 3-step workflow (ours and DBOS's), their worker processes,
and when each run started and ended."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from flask import Flask

from flask_harvest import workflow_service
from flask_harvest.workflows._schema import executions_table

from . import _dbos_app, _workers
from ._app import NOOP3
from ._receivers import ROOT
from ._services import DBOS_DATABASE_URL, ensure_database

PROCESSES = 2
CONCURRENCY = 32


def harvest_starter(app: Flask) -> Callable[[int], str]:
    """``start(n)``: start one run of the workflow through the app's workflow service."""

    def start(number: int) -> str:
        with app.app_context():
            handle, _ = workflow_service(app).start(NOOP3, {"n": number})
        return handle.execution_id

    return start


def dbos_starter(client: object) -> Callable[[int], str]:
    """``start(n)``: enqueue one run of DBOS's workflow on its queue."""
    return lambda number: _dbos_app.enqueue(client, {"n": number})


def harvest_finished(engine: sa.Engine) -> dict[str, tuple[float, float]]:
    """``execution id -> (created, completed)`` in epoch seconds, for the completed runs."""
    table = executions_table
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(table.c.execution_id, table.c.created_at, table.c.completed_at).where(
                table.c.state == "Completed"
            )
        ).all()
    return {row[0]: (row[1].timestamp(), row[2].timestamp()) for row in rows}


def harvest_workers(
    log_dir: Path, tag: str, config: dict[str, object] | None = None
) -> list[_workers.WorkerProcess]:
    """2 ``flask harvest worker`` processes at ``--concurrency 32``, started and registered (S8 to
    S10 keep the setup they were first measured at); ``config`` overrides the app's settings."""
    workers = [
        _workers.harvest_worker(log_dir, CONCURRENCY, tag=f"{tag}-{n}", config=config)
        for n in range(PROCESSES)
    ]
    try:
        _workers.wait_registered(PROCESSES, workers=workers)
    except BaseException:
        _workers.stop_all(workers)
        raise
    return workers


def dbos_prepare() -> sa.Engine:
    """Create DBOS's system database and its tables (a DBOS launch that exits); return an engine."""
    ensure_database(DBOS_DATABASE_URL)
    command = [sys.executable, "-m", "bench._dbos_app", "migrate"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(  # noqa: S603 (our own command line, no shell)
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"DBOS could not create its tables:\n{done.stdout}{done.stderr}")
    engine = sa.create_engine(DBOS_DATABASE_URL)
    _dbos_app.reset(engine)
    return engine


def dbos_workers(log_dir: Path, tag: str) -> list[_workers.WorkerProcess]:
    """As many DBOS worker processes as ours, each a DBOS executor polling the queue."""
    command = [sys.executable, "-m", "bench._dbos_app", "serve"]
    workers = [
        _workers.WorkerProcess(command, log_dir / f"dbos-{tag}-{n}-{time.monotonic_ns()}.log")
        for n in range(PROCESSES)
    ]

    def ready() -> bool:
        for worker in workers:
            if not worker.alive():
                raise RuntimeError(f"a DBOS worker exited early:\n{worker.log_tail()}")
        return all("dbos worker ready" in worker.log_tail(200) for worker in workers)

    if not _workers.wait_for(ready, timeout=60):
        _workers.stop_all(workers)
        raise RuntimeError("the DBOS workers did not start within 60 s")
    return workers


class SteadyStarter(threading.Thread):
    """Starts ``count`` runs at ``rate`` per second on a thread (the 'web process'); keeps each
    run's send time (``time.time()`` just before the start call)."""

    def __init__(self, start: Callable[[int], str], count: int, rate: float) -> None:
        super().__init__(name="bench-starter", daemon=True)
        self.start_run, self.count, self.rate = start, count, rate
        self.sent: dict[str, float] = {}
        self.behind = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            begun = time.monotonic()
            for number in range(self.count):
                wait = begun + number / self.rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                else:
                    self.behind = max(self.behind, -wait)
                sent = time.time()
                self.sent[self.start_run(number)] = sent
        except BaseException as exc:  # reported by the scenario
            self.error = exc
