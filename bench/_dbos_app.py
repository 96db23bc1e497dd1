"""S8 and S9's baseline: DBOS Transact running the same 3-step no-op workflow through a DBOS queue.

``python -m bench._dbos_app serve`` is one worker process (a DBOS executor of its own that
dequeues from the queue until SIGTERM); ``python -m bench._dbos_app migrate`` creates DBOS's system
database tables and registers the queue, then exits. The harness enqueues with ``DBOSClient``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

import sqlalchemy as sa

from ._services import DBOS_DATABASE_URL

QUEUE = "bench"
WORKFLOW = "bench_noop3"
#: S9's ten-step workflow.
WORKFLOW10 = "bench_noop10"
FANOUT_PARENT = "bench_fanout_parent"
FANOUT_CHILD = "bench_fanout_child"
#: Workflows one process runs at once (the same as ``flask harvest worker --concurrency``).
WORKER_CONCURRENCY = 32
#: The issue's reference figures were taken with a 50 ms queue polling interval.
POLLING_INTERVAL = 0.05


def _launch(executor_id: str) -> Any:
    from dbos import DBOS

    DBOS(
        config={
            "name": "harvest-bench",
            "system_database_url": DBOS_DATABASE_URL,
            "executor_id": executor_id,
            # One fixed version: DBOS hands a client's enqueue to the latest version it has seen,
            # and a version named after the code's hash would strand runs whenever two checkouts
            # (an A/B comparison) share the system database.
            "application_version": "harvest-bench",
            "log_level": "WARNING",
        }
    )

    @DBOS.step(name="noop")
    def noop_step(number: int) -> int:
        return number

    @DBOS.workflow(name=WORKFLOW)
    def noop3(value: Any) -> Any:
        for number in range(3):
            noop_step(number)
        return value

    @DBOS.workflow(name=WORKFLOW10)
    def noop10(value: Any) -> Any:
        for number in range(10):
            noop_step(number)
        return value

    # S17's fan-out: the parent enqueues its children on the same queue (so both processes run
    # them, as our children are run by both workers) and waits for each.
    queues: list[Any] = []

    @DBOS.workflow(name=FANOUT_CHILD)
    def fanout_child(number: int) -> int:
        return int(noop_step(number))

    @DBOS.workflow(name=FANOUT_PARENT)
    def fanout_parent(value: Any) -> Any:
        handles = [queues[0].enqueue(fanout_child, number) for number in range(value["children"])]
        return sum(handle.get_result() for handle in handles)

    DBOS.launch()
    queues.append(
        DBOS.register_queue(
            QUEUE, worker_concurrency=WORKER_CONCURRENCY, polling_interval_sec=POLLING_INTERVAL
        )
    )
    return DBOS


def client() -> Any:
    """A DBOS client on the system database (it exists once ``migrate`` ran)."""
    from dbos import DBOSClient

    return DBOSClient(system_database_url=DBOS_DATABASE_URL)


def enqueue_named(dbos_client: Any, name: str, value: Any) -> str:
    """Enqueue one run of the workflow ``name``; return its workflow id."""
    handle = dbos_client.enqueue({"workflow_name": name, "queue_name": QUEUE}, value)
    return str(handle.get_workflow_id())


def finished_named(engine: sa.Engine, name: str) -> dict[str, tuple[float, float]]:
    """:func:`finished_times` of the runs of the workflow ``name``."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT workflow_uuid, created_at, updated_at FROM dbos.workflow_status"
                " WHERE status = 'SUCCESS' AND name = :name"
            ),
            {"name": name},
        ).all()
    return {row[0]: (row[1] / 1000, row[2] / 1000) for row in rows}


#: DBOS's tables of runs and what they recorded. DBOS 3 keeps step outputs, inputs and outputs in
#: tables without a foreign key to ``workflow_status``: a cascade from it left them growing from
#: round to round (264,400 step rows after a day of runs), slowing DBOS's later rounds.
_DBOS_RUN_TABLES = (
    "workflow_status",
    "operation_outputs",
    "workflow_input",
    "workflow_output",
    "notifications",
    "workflow_events",
    "workflow_events_history",
    "streams",
    "application_versions",
)


def reset(engine: sa.Engine) -> None:
    """Forget every workflow and everything it recorded, as on a fresh database."""
    with engine.begin() as conn:
        present = set(
            conn.execute(
                sa.text("SELECT table_name FROM information_schema.tables WHERE table_schema = 'dbos'")
            ).scalars()
        )
        tables = [f"dbos.{name}" for name in _DBOS_RUN_TABLES if name in present]
        conn.execute(sa.text(f"TRUNCATE {', '.join(tables)} CASCADE"))


def finished_times(engine: sa.Engine) -> dict[str, tuple[float, float]]:
    """``workflow id -> (created, completed)`` in epoch seconds, for the runs that succeeded."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT workflow_uuid, created_at, updated_at FROM dbos.workflow_status"
                " WHERE status = 'SUCCESS'"
            )
        ).all()
    return {row[0]: (row[1] / 1000, row[2] / 1000) for row in rows}


def main(mode: str) -> None:
    dbos = _launch(f"bench-{os.getpid()}")
    if mode == "serve":
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        print("dbos worker ready", flush=True)
        stop.wait()
    dbos.destroy()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "serve")
