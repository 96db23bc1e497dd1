"""Scenario 4: processes die between the commit and the relay of ``dispatch_in_tx``, under load.

Writer processes save an order and its event in one transaction (``dispatch_in_tx`` on
Flask-SQLAlchemy's ``db.session``), ten to a commit, while two workers deliver. Each writer is
killed with ``SIGKILL``: at a random moment, or inside its ``after_commit`` hook, before
flask-harvest's own hook hands the committed messages to the relay. Writers are started one after
the other until 5,000 messages are committed. Every committed message is relayed (by the writer
or, after its death, by a worker's sweeper) and delivered under its deterministic id; every
order has its event and no event lacks its order.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from flask_harvest.webhooks.manager import outbox_delivery_id

from ..worker_process import stop_group
from .conftest import FaultEnv, check_invariants, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]
TIME_LIMIT_SECONDS = 240

MESSAGES = 5000
PER_COMMIT = 10

WRITER = textwrap.dedent(
    """
    import json, os, signal, sys

    import sqlalchemy as sa
    from flask import Flask
    from flask_sqlalchemy import SQLAlchemy

    from flask_harvest import OutboundWebhookPlugin

    first, count, per_commit, die_in_commit = map(int, sys.argv[1:5])
    db = SQLAlchemy()
    app = Flask("faults_writer")
    app.config.update(json.loads(os.environ["FAULTS_CONFIG"]))
    app.config["SQLALCHEMY_DATABASE_URI"] = os.environ["FAULTS_DATABASE_URL"]
    db.init_app(app)
    OutboundWebhookPlugin.sql(db, app, create_tables=False)

    with app.app_context():
        manager = app.extensions["harvest"].manager
        session = db.session()
        commits = [0]

        def die_here(_session):
            # Registered before flask-harvest's hook, so it runs first: the process dies after
            # the commit and before the relay hears of it.
            commits[0] += 1
            if commits[0] == die_in_commit:
                os.kill(os.getpid(), signal.SIGKILL)

        sa.event.listen(session, "after_commit", die_here)
        for start in range(first, first + count, per_commit):
            ids = []
            for serial in range(start, start + per_commit):
                session.execute(sa.text("INSERT INTO fault_orders (serial) VALUES (:s)"), {"s": serial})
                ids.append(manager.dispatch_in_tx(session, "fault.outbox", {"serial": serial}))
            session.commit()
            print(" ".join(ids), flush=True)
    """
)


def outbox_ids(faults: FaultEnv, *, unrelayed: bool = False) -> list[str]:
    query = "SELECT id FROM harvest_outbox WHERE relayed_at IS NULL OR NOT :unrelayed"
    with faults.inspector.connect() as conn:
        return list(conn.execute(sa.text(query), {"unrelayed": unrelayed}).scalars())


def count(faults: FaultEnv, table: str) -> int:
    with faults.inspector.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())  # noqa: S608


def run_writer(faults: FaultEnv, script: Path, first: int, die_in_commit: int, kill_after: int) -> list[str]:
    """Run one writer; kill it after ``kill_after`` commits (unless it kills itself first).

    Return the message ids of the commits it reported.
    """
    environment = {
        **os.environ,
        "FAULTS_CONFIG": json.dumps(faults.settings()),
        "FAULTS_DATABASE_URL": faults.database_url.render_as_string(hide_password=False),
    }
    command = [sys.executable, str(script), str(first), "1000", str(PER_COMMIT), str(die_in_commit)]
    process = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, start_new_session=True)
    assert process.stdout is not None
    acknowledged: list[str] = []
    try:
        for line in process.stdout:
            acknowledged += line.decode().split()
            if len(acknowledged) >= kill_after * PER_COMMIT:
                break
    finally:
        status = stop_group(process, signal.SIGKILL, timeout=10)
        process.stdout.close()
    assert status == -signal.SIGKILL, f"the writer ended on its own ({status})"
    return acknowledged


def test_no_event_is_lost_between_commit_and_relay_under_load(faults: FaultEnv, tmp_path: Path) -> None:
    with faults.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS fault_orders")
        conn.exec_driver_sql("CREATE TABLE fault_orders (serial integer PRIMARY KEY)")
    faults.subscribe("sub_outbox", faults.receiver.url("outbox"), ["fault.outbox"])
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    workers = [faults.start_worker(concurrency=16) for _ in range(2)]

    acknowledged: list[str] = []
    orphans_at_kill: list[int] = []
    writers = 0
    while count(faults, "harvest_outbox") < MESSAGES:
        # Every other writer kills itself inside an after_commit hook; the others are killed from
        # outside at a random commit.
        die_in_commit = random.randint(5, 60) if writers % 2 == 0 else -1
        kill_after = random.randint(20, 80)
        acknowledged += run_writer(faults, script, writers * 1000, die_in_commit, kill_after)
        writers += 1
        orphans_at_kill.append(len(outbox_ids(faults, unrelayed=True)))
    last_kill = time.monotonic()

    committed = outbox_ids(faults)
    assert set(acknowledged) <= set(committed), "a commit that returned lost its message"
    assert count(faults, "fault_orders") == len(committed), "orders and their events were not atomic"
    wait_until(lambda: not outbox_ids(faults, unrelayed=True), 60, "every message to be relayed")
    expected = [outbox_delivery_id(m, "sub_outbox") for m in committed]
    done_at = faults.wait_final(expected, timeout=120)
    summary = check_invariants(faults, expected)
    assert summary.delivered == len(committed)
    assert len(faults.rows()) == len(committed), "a message was relayed into more than one delivery"
    assert all(w.alive() for w in workers)
    print(
        f"\nscenario 4: {writers} writers killed, {len(committed)} messages committed "
        f"({len(acknowledged)} acknowledged before the kills); up to {max(orphans_at_kill)} committed "
        f"but unrelayed at a kill; all delivered {done_at - last_kill:.1f} s after the last kill; "
        f"{summary.duplicates} duplicate(s)"
    )
