"""Completion callbacks survive a SIGKILL: a worker killed between claiming a callback and recording
its outcome (the POST in flight) leaves the row ``INFLIGHT`` under a lease; once the lease expires
the sweeper queues it again, another worker sends the same bytes under the same ``delivery_id``, and
the row ends ``DELIVERED``. Nothing is lost."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import textwrap
import time
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import Harvest, get_engine
from flask_harvest.workflows.context import WorkflowContext

from ..pipeline import close_later
from .conftest import CANARY, FaultEnv, Worker, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]
TIME_LIMIT_SECONDS = 120

#: The HMAC key: it carries the harness's canary, so the leak check searches every log for it.
SECRET = CANARY.decode() + "-completion-callback"
LEASE_SECONDS = 2
CALLBACK_CONFIG: dict[str, Any] = {
    "HARVEST_COMPLETION_CALLBACK_ALLOWLIST": "127.0.0.1",
    "HARVEST_COMPLETION_CALLBACK_ALLOW_PRIVATE_TARGETS": True,
    "HARVEST_COMPLETION_CALLBACK_SECRET": SECRET,
    "HARVEST_COMPLETION_CALLBACK_LEASE_SECONDS": LEASE_SECONDS,
    "HARVEST_COMPLETION_CALLBACK_INITIAL_BACKOFF_MS": 200,
}

WORKER_APP = textwrap.dedent(
    """
    import json
    import logging
    import os

    from flask import Flask
    from flask_sqlalchemy import SQLAlchemy

    from flask_harvest import Harvest

    db = SQLAlchemy()
    workflows = Harvest(db=db, create_tables=False)


    @workflows.workflow("quick")
    def quick(ctx, data):
        return {"ok": data}


    def create_app():
        logging.basicConfig(
            level="WARNING",
            format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s",
        )
        logging.getLogger("flask_harvest").setLevel(os.environ.get("FAULTS_LOG_LEVEL", "INFO"))
        app = Flask("callbacks_worker")
        app.config.update(json.loads(os.environ["FAULTS_CONFIG"]))
        app.config["SQLALCHEMY_DATABASE_URI"] = os.environ["FAULTS_DATABASE_URL"]
        app.config["SQLALCHEMY_ENGINE_OPTIONS"] = {"pool_size": 4, "max_overflow": 4}
        db.init_app(app)
        workflows.init_app(app)
        return app
    """
)


def start_worker(faults: FaultEnv) -> Worker:
    """``flask harvest worker`` on an app with workflows and completion callbacks."""
    (faults.app_folder / "callbacks_worker_app.py").write_text(WORKER_APP)
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(faults.app_folder), os.environ.get("PYTHONPATH", "")]),
        "FAULTS_CONFIG": json.dumps(faults.settings(**CALLBACK_CONFIG)),
        "FAULTS_DATABASE_URL": faults.database_url.render_as_string(hide_password=False),
        "FAULTS_LOG_LEVEL": "INFO",
    }
    command = [
        sys.executable, "-m", "flask", "--app", "callbacks_worker_app:create_app",
        "harvest", "worker", "--concurrency", "4",
    ]  # fmt: skip
    worker = Worker(
        command, environment, faults.folder / f"cb-worker-{len(faults.workers)}.log", faults.folder
    )
    faults.workers.append(worker)
    return worker


def web_app(faults: FaultEnv) -> Flask:
    """The web process: starts runs with a callback target; runs nothing itself (RQ backend)."""
    app = Flask("callbacks_web")
    app.config.update(faults.settings(**CALLBACK_CONFIG))
    app.config["SQLALCHEMY_DATABASE_URI"] = faults.database_url.render_as_string(hide_password=False)
    db = SQLAlchemy()
    db.init_app(app)
    workflows = Harvest(db=db, create_tables=False)

    @workflows.workflow("quick")
    def quick(ctx: WorkflowContext, data: Any) -> Any:
        return {"ok": data}

    workflows.init_app(app)
    return close_later(app)


def delivery_rows(faults: FaultEnv) -> list[sa.Row[Any]]:
    with faults.inspector.connect() as conn:
        return list(
            conn.execute(
                sa.text(
                    "SELECT delivery_id, state, attempts, body, lease_expires_at"
                    " FROM harvest_completion_deliveries"
                )
            )
        )


def test_a_worker_killed_mid_callback_delivery_delivers_after_recovery(faults: FaultEnv) -> None:
    app = web_app(faults)
    faults.receiver.mode("cb", "slow", delay=30)  # holds the POST open until the worker dies
    with app.app_context():
        service = get_engine(app).workflows
        assert service is not None
        handle, _ = service.start("quick", 7, completion_callbacks=[{"url": faults.receiver.url("cb/hook")}])

    doomed = start_worker(faults)
    wait_until(
        lambda: [r for r in faults.receiver.receipts() if r.name == "cb"], 60, "the callback POST to arrive"
    )
    [row] = delivery_rows(faults)
    assert (row.state, row.attempts) == ("INFLIGHT", 1), "the kill must land between claim and record"
    doomed.kill()
    killed_at = time.monotonic()

    faults.receiver.mode("cb", "ok")
    start_worker(faults)
    wait_until(
        lambda: [r for r in delivery_rows(faults) if r.state == "DELIVERED"],
        60,
        lambda: (
            f"the callback to be delivered again ({[(r.state, r.attempts) for r in delivery_rows(faults)]})"
        ),
    )
    recovered = time.monotonic() - killed_at
    [row] = delivery_rows(faults)
    assert row.attempts == 2
    copies = [r for r in faults.receiver.receipts() if r.name == "cb"]
    assert len(copies) == 2
    digest = hashlib.sha256(row.body.encode()).hexdigest()[:32]
    assert {c.digest for c in copies} == {digest}, "the redelivery must be byte-identical"
    assert json.loads(row.body)["execution_id"] == handle.execution_id
    print(f"\ncallback kill: delivered {recovered:.1f} s after the SIGKILL (lease {LEASE_SECONDS} s)")
