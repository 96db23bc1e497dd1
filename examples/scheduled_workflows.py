"""A scheduled workflow: a cron schedule starts one run per tick; pause and resume it.

Runs on the embedded default (SQLite and the in-process ``local`` job backend, whose sweeper starts
the ticks' runs): no Redis, no setup. In production every ``flask harvest worker`` sweeps, and each
tick still starts exactly one run (see docs/schedules.rst).

    python examples/scheduled_workflows.py
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import ExecutionState, Harvest
from flask_harvest.workflows import WorkflowContext

db = SQLAlchemy()
harvest = Harvest(db=db)

SNAPSHOTS: list[str] = []


def take_snapshot(scheduled_at: str) -> str:
    SNAPSHOTS.append(scheduled_at)
    return f"snapshot of {scheduled_at}"


# Six fields, seconds first: every two seconds (five fields, "*/5 * * * *", is every five minutes).
# Each run gets the time of its tick as input.
@harvest.workflow("snapshot", schedule="*/2 * * * * *")
def snapshot(ctx: WorkflowContext, tick: Any) -> Any:
    return ctx.step("take_snapshot", take_snapshot, tick["scheduled_at"])


def create_app(database: Path) -> Flask:
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{database}"
    # A tick starts within one sweep interval of its time: sweep twice a second for this schedule.
    app.config["HARVEST_SWEEP_INTERVAL_SECONDS"] = 0.5
    db.init_app(app)
    harvest.init_app(app)  # the tables, the schedule's row, and the sweeper that starts its ticks
    return app


def completed_runs() -> list[Any]:
    page, _ = harvest.list_executions(name="snapshot", state=ExecutionState.COMPLETED, limit=500)
    return sorted(page, key=lambda e: e.input["scheduled_at"])


def wait_for_runs(count: int, timeout: float = 60.0) -> list[Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = completed_runs()
        if len(runs) >= count:
            return runs
        time.sleep(0.1)
    raise TimeoutError(f"fewer than {count} scheduled runs completed")


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    with tempfile.TemporaryDirectory() as folder:
        app = create_app(Path(folder) / "schedules.sqlite3")
        with app.app_context():
            schedules = harvest.engine.schedules
            assert schedules is not None
            runs = wait_for_runs(3)
            for run in runs[:3]:
                print(f"{run.workflow_id}: {run.output}")

            paused = schedules.pause("snapshot")
            print(f"paused: {paused.paused}")
            before = len(harvest.list_executions(name="snapshot", limit=500)[0])
            time.sleep(4.5)  # two ticks fall while it is paused
            after = len(harvest.list_executions(name="snapshot", limit=500)[0])
            print(f"runs started while paused: {after - before}")

            resumed = schedules.resume("snapshot")
            print(
                f"resumed; next tick at {resumed.next_tick_at.isoformat() if resumed.next_tick_at else '-'}"
            )
            later = wait_for_runs(after + 1)
            newest = later[-1]
            print(f"after resuming: {newest.workflow_id} ran (the ticks missed while paused did not)")

            ids = [run.workflow_id for run in later]
            ok = (
                after == before
                and len(ids) == len(set(ids))
                and all(run.workflow_id == f"snapshot@{run.input['scheduled_at']}" for run in later)
                and newest.input["scheduled_at"] > resumed.last_tick_at.isoformat()
                and len(SNAPSHOTS) >= len(later)
            )
            print("scheduled workflows example OK" if ok else "scheduled workflows example FAILED")
            return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
