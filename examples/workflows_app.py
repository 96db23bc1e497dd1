"""Durable workflows in one file: a refund with checkpointed steps, a durable sleep, a result, a cancel.

Runs on the embedded default (SQLite and the in-process ``local`` job backend): no Redis, no
setup. In production the same code runs on PostgreSQL with ``HARVEST_JOBS_BACKEND = "rq"`` and
``flask harvest worker`` processes (see docs/workflows.rst).

    python examples/workflows_app.py
"""

from __future__ import annotations

import itertools
import logging
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import ExecutionState, Harvest
from flask_harvest.workflows import WorkflowContext

db = SQLAlchemy()
# Registration lives in the app module, so the web process and every worker know the workflows.
harvest = Harvest(db=db)

# Stand-ins for a payment provider and a mailer: what the steps do to the outside world.
REFUNDS: dict[str, dict[str, Any]] = {}
MAILS: list[str] = []
_refund_numbers = itertools.count(1)


def check_order(order_id: str, amount: int) -> dict[str, Any]:
    if amount <= 0:
        raise ValueError(f"nothing to refund on {order_id}")
    return {"order_id": order_id, "amount": amount}


def issue_refund(order_id: str, amount: int, idempotency_key: str) -> dict[str, Any]:
    # A step runs at least once (again if its worker dies before the checkpoint): real providers
    # take an idempotency key, as this stand-in does, so that a second call refunds nothing more.
    if idempotency_key not in REFUNDS:
        REFUNDS[idempotency_key] = {"refund_id": f"re_{next(_refund_numbers)}", "amount": amount}
    return REFUNDS[idempotency_key]


def notify_customer(order_id: str, refund_id: str) -> str:
    MAILS.append(f"{order_id}: your refund {refund_id} is on its way")
    return "sent"


@harvest.workflow("process_refund", timeout=timedelta(minutes=5))
def process_refund(ctx: WorkflowContext, refund: Any) -> Any:
    order = ctx.step("check_order", check_order, refund["order_id"], refund["amount"])
    issued = ctx.step(
        "issue_refund", issue_refund, order["order_id"], order["amount"], f"{ctx.execution_id}:refund"
    )
    # A durable sleep: the worker is given back, and the run resumes at the wake time (on any
    # worker, even after a restart). A cancel while it sleeps ends the run at once.
    ctx.sleep(timedelta(seconds=refund["cooling_off_seconds"]))
    ctx.step("notify_customer", notify_customer, order["order_id"], issued["refund_id"])
    return {"refund_id": issued["refund_id"], "amount": issued["amount"]}


def create_app(database: Path) -> Flask:
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{database}"
    db.init_app(app)
    harvest.init_app(app)  # the tables, and the flask-harvest engine on the same database
    return app


def wait_until_asleep(execution_id: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = [step.name for step in harvest.workflows.steps(execution_id)]
        if harvest.get(execution_id).state is ExecutionState.PENDING and "harvest:sleep" in steps:
            return
        time.sleep(0.05)
    raise TimeoutError(f"{execution_id} did not go to sleep")


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    with tempfile.TemporaryDirectory() as folder:
        app = create_app(Path(folder) / "workflows.sqlite3")
        with app.app_context():
            refund = {"order_id": "ord_1", "amount": 4200, "cooling_off_seconds": 1}
            handle = harvest.start("process_refund", refund, workflow_id="refund-ord_1")
            print(f"started process_refund as {handle.workflow_id}: execution {handle.execution_id}")
            again = harvest.start("process_refund", refund, workflow_id="refund-ord_1")
            print(f"starting refund-ord_1 again while it runs returns the same execution: "
                  f"{again.execution_id == handle.execution_id}")  # fmt: skip

            result = handle.result(timeout=30)
            execution = handle.execution()
            print(f"refund-ord_1 ended {execution.state.value}: {result}")
            steps = harvest.workflows.steps(handle.execution_id)
            print("checkpointed steps: " + ", ".join(step.name for step in steps))
            print(f"refunds issued: {len(REFUNDS)}, mails sent: {len(MAILS)}")

            long_wait = {"order_id": "ord_2", "amount": 990, "cooling_off_seconds": 3600}
            second = harvest.start("process_refund", long_wait, workflow_id="refund-ord_2")
            wait_until_asleep(second.execution_id)
            print(f"refund-ord_2 is asleep ({second.status().value}) until its cooling-off period ends")
            cancelled = second.cancel("the customer kept the goods")
            print(f"refund-ord_2 ended {cancelled.state.value}: {cancelled.error}")
            print(f"refunds issued: {len(REFUNDS)}, mails sent: {len(MAILS)}")

            ok = (
                result == {"refund_id": "re_1", "amount": 4200}
                and [s.name for s in steps]
                == ["check_order", "issue_refund", "harvest:sleep", "notify_customer"]
                and cancelled.state is ExecutionState.CANCELLED
                and len(REFUNDS) == 2
                and MAILS == ["ord_1: your refund re_1 is on its way"]
            )
            print("workflows example OK" if ok else "workflows example FAILED")
            return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
