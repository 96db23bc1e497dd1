"""Child runs in one file: a batch fans out to one child run per order, waits for them durably,
catches a child's failure, and shows what a parent-close policy does to children left open.

Runs on the embedded default (SQLite and the in-process ``local`` job backend): no Redis, no
setup. In production the same code runs on PostgreSQL with ``HARVEST_JOBS_BACKEND = "rq"`` and
``flask harvest worker`` processes (see docs/children.rst).

    python examples/children_app.py
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import ExecutionState, Harvest, ParentClosePolicy
from flask_harvest.workflows import ChildFailedError, WorkflowContext

db = SQLAlchemy()
harvest = Harvest(db=db)

# A stand-in for a carrier's API: what the child's step does to the outside world.
LABELS: dict[str, str] = {}


def print_label(order_id: str, address: str) -> str:
    if not address:
        raise ValueError(f"order {order_id} has no address")
    # Keyed by order: a step that runs again (its worker died before the checkpoint) prints nothing new.
    LABELS.setdefault(order_id, f"label-{order_id}")
    return LABELS[order_id]


@harvest.workflow("ship_order")
def ship_order(ctx: WorkflowContext, order: Any) -> Any:
    return ctx.step("print_label", print_label, order["id"], order["address"])


@harvest.workflow("fulfil_batch")
def fulfil_batch(ctx: WorkflowContext, batch: Any) -> Any:
    # One child run per order, all started before the first wait: they run side by side. Each
    # start is checkpointed with the child's row, so a replay of this function starts none again.
    handles = [ctx.start_child("ship_order", order) for order in batch["orders"]]
    shipped, failed = {}, {}
    for order, handle in zip(batch["orders"], handles, strict=True):
        try:
            # A durable wait: while the child runs, this run sleeps without holding a worker.
            shipped[order["id"]] = handle.result()
        except ChildFailedError as exc:
            failed[order["id"]] = exc.error
    return {"shipped": shipped, "failed": failed}


@harvest.workflow("watch_stock")
def watch_stock(ctx: WorkflowContext, item: Any) -> Any:
    ctx.sleep(timedelta(hours=1))  # a long-running child: still open when its parent ends
    return item


@harvest.workflow("restock")
def restock(ctx: WorkflowContext, items: Any) -> Any:
    # Two children that outlive this run unless their policy says otherwise.
    ctx.start_child("watch_stock", items[0], parent_close_policy=ParentClosePolicy.TERMINATE)
    ctx.start_child("watch_stock", items[1], parent_close_policy=ParentClosePolicy.ABANDON)
    return "ordered"


def create_app(database: Path) -> Flask:
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{database}"
    db.init_app(app)
    harvest.init_app(app)
    return app


def wait_for(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise TimeoutError("the runs did not get there")


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    with tempfile.TemporaryDirectory() as folder:
        app = create_app(Path(folder) / "children.sqlite3")
        with app.app_context():
            orders = [
                {"id": "o-1", "address": "1 Main St"},
                {"id": "o-2", "address": ""},  # its child fails
                {"id": "o-3", "address": "3 Elm St"},
            ]
            batch = harvest.start("fulfil_batch", {"orders": orders}, workflow_id="batch-1")
            result = batch.result(timeout=30)
            print(f"batch-1 ended {batch.status().value}: {result}")
            children, _ = harvest.workflows.children(batch.execution_id)
            for child in sorted(children, key=lambda c: c.workflow_id):
                print(f"  child {child.workflow_id.removeprefix(batch.execution_id)}: {child.state.value}")

            parent = harvest.start("restock", ["bolts", "nuts"], workflow_id="restock-1")
            parent.result(timeout=30)

            def policies_applied() -> bool:
                kids, _ = harvest.workflows.children(parent.execution_id)
                return len(kids) == 2 and all(k.state is not ExecutionState.RUNNING for k in kids)

            wait_for(policies_applied)
            kids, _ = harvest.workflows.children(parent.execution_id)
            states = {k.parent_close_policy: k.state.value for k in kids}
            print(f"restock-1 ended {parent.status().value}; its children: {states}")

            ok = (
                result
                == {
                    "shipped": {"o-1": "label-o-1", "o-3": "label-o-3"},
                    "failed": {
                        "o-2": "StepFailedError: step 'print_label' failed: "
                        "ValueError: order o-2 has no address"
                    },
                }
                and len(children) == 3
                and states == {"Terminate": "Terminated", "Abandon": "Pending"}
            )
            print("child runs example OK" if ok else "child runs example FAILED")
            return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
