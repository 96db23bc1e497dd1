"""Completion triggers: a daily report runs the moment the ETL ingest completes.

``etl_ingest`` returns ``{"summary": {...}, "files": [...]}``; a trigger starts ``daily_report``
with the ``summary`` as its input, in the same transaction that records the ingest as Completed.
Neither workflow knows about the other: the dependency is one declarative registration. A second
trigger, guarded by a condition, starts ``page_on_call`` only for an ingest of more than 10,000
rows; a third routes a failed ingest to ``ingest_postmortem`` with the outcome envelope.

Runs on SQLite and the in-process ``local`` job backend: no Redis, no setup.

    python examples/completion_triggers.py
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

from flask_harvest import CompletionTrigger, Harvest
from flask_harvest.triggers import Outcome, Projection
from flask_harvest.triggers.conditions import GreaterThan
from flask_harvest.triggers.firing import target_workflow_id
from flask_harvest.workflows import Execution, WorkflowContext

DAILY_REPORT = CompletionTrigger("etl_ingest", "daily_report", input_mapping=Projection("summary"))
BIG_INGEST = CompletionTrigger(
    "etl_ingest",
    "page_on_call",
    input_mapping=Projection("summary.rows"),
    condition=GreaterThan("summary.rows", 10_000),
)
POSTMORTEM = CompletionTrigger(
    "etl_ingest", "ingest_postmortem", terminal_states=["Failed"], input_mapping=Outcome()
)


def create_app(database: Path) -> tuple[Flask, Harvest]:
    app = Flask("completion_triggers")
    app.config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{database}"
    app.config["HARVEST_SWEEP_INTERVAL_SECONDS"] = 0.5
    db = SQLAlchemy(app)
    # One extension: webhooks, workflows, completion callbacks and triggers on the app's database.
    # Workflows and triggers may be declared before or after it is registered on the app.
    harvest = Harvest(app, db)
    harvest.completion_triggers([DAILY_REPORT, BIG_INGEST, POSTMORTEM])

    @harvest.workflow("etl_ingest")
    def etl_ingest(ctx: WorkflowContext, job: dict[str, Any]) -> dict[str, Any]:
        files = ctx.step("list files", lambda: [f"{job['date']}/part-{i}.csv" for i in range(3)])
        if job.get("corrupt"):
            raise ValueError(f"{files[0]} is corrupt")
        rows = ctx.step("load", lambda: job["rows_per_file"] * len(files))
        return {"summary": {"rows": rows, "date": job["date"]}, "files": files}

    @harvest.workflow("daily_report")
    def daily_report(ctx: WorkflowContext, summary: dict[str, Any]) -> str:
        return f"report for {summary['date']}: {summary['rows']} rows"

    @harvest.workflow("page_on_call")
    def page_on_call(ctx: WorkflowContext, rows: int) -> str:
        return f"paged: {rows} rows is a big day"

    @harvest.workflow("ingest_postmortem")
    def ingest_postmortem(ctx: WorkflowContext, outcome: dict[str, Any]) -> str:
        source = outcome["source_workflow_name"]
        return f"postmortem of {source}: {outcome['terminal_state']}, {outcome['error']}"

    return app, harvest


def target_of(
    harvest: Harvest, trigger: CompletionTrigger, source: Execution, timeout: float = 20.0
) -> Execution | None:
    """Wait for the run ``trigger`` started for ``source`` to end; ``None`` if it started none."""
    store = harvest.workflows.store
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        target = store.get_by_workflow_id(target_workflow_id(trigger.id, source.execution_id))
        if target is not None and target.terminal:
            return target
        time.sleep(0.05)
    return None


def main() -> int:
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        app, harvest = create_app(Path(tmp) / "etl.db")
        try:
            with app.app_context():
                for job in (
                    {"date": "2026-06-24", "rows_per_file": 4000},
                    {"date": "2026-06-25", "rows_per_file": 1000},
                    {"date": "2026-06-26", "rows_per_file": 1000, "corrupt": True},
                ):
                    handle = harvest.start("etl_ingest", job)
                    source = harvest.workflows.wait(handle.execution_id, 20.0)
                    print(f"etl_ingest {job['date']}: {source.state.value}")
                    for trigger in (DAILY_REPORT, BIG_INGEST, POSTMORTEM):
                        wait = 5.0 if trigger is DAILY_REPORT else 1.0
                        target = target_of(harvest, trigger, source, timeout=wait)
                        if target is not None:
                            depth = target.trigger_depth
                            print(f"  -> {target.workflow_name} (trigger depth {depth}): {target.output}")
                ledger = harvest.triggers.fires(trigger_id=BIG_INGEST.id)
                outcomes = sorted(fire.outcome or "fired" for fire in ledger)
                print(f"page_on_call fires ledger: {', '.join(outcomes)}")
        finally:
            harvest.close(app)
    print("completion triggers example OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
