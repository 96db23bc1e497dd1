"""The transactional outbox on real PostgreSQL and SQLite, with a real receiver and real Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from flask_harvest import (
    ConfigurationError,
    DeliveryState,
    HarvestEngine,
    InMemoryOutboundWebhookHandler,
    OutboundWebhookPlugin,
    WebhookSubscription,
    generate_secret,
    get_engine,
)
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.manager import outbox_delivery_id
from flask_harvest.webhooks.stores._schema import outbox_table
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .pipeline import FAST, close_later, wait_final

SECRET = generate_secret()
FAR_FUTURE = datetime(2100, 1, 1, tzinfo=timezone.utc)


class Base(DeclarativeBase):
    pass


# One Flask-SQLAlchemy extension and model for every test app, as in an app-factory project.
db = SQLAlchemy(model_class=Base)


class Order(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    reference: Mapped[str] = mapped_column(sa.String(50), unique=True)


@dataclass
class OutboxApp:
    app: Flask
    db: SQLAlchemy
    url: str

    @property
    def state(self) -> HarvestEngine:
        return get_engine(self.app)

    @property
    def engine(self) -> sa.Engine:
        """The app's Flask-SQLAlchemy engine, which the SQL store was built on."""
        store = self.state.store
        assert isinstance(store, SqlOutboundWebhookStore)
        return store.engine

    def outbox_rows(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(outbox_table)).scalar_one())


def make_outbox_app(url: str, **config: Any) -> OutboxApp:
    app = Flask("outbox_test")
    app.config.update(FAST, SQLALCHEMY_DATABASE_URI=url, **config)
    db.init_app(app)
    OutboundWebhookPlugin.sql(db, app)
    with app.app_context():
        db.drop_all()
        db.create_all()
    close_later(app)
    return OutboxApp(app, db, url)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'app.db'}"
    request.getfixturevalue("postgres_engine")  # empties the harvest tables
    url: sa.URL = request.getfixturevalue("postgres_url")
    return url.render_as_string(hide_password=False)


def subscribe(outbox: OutboxApp, receiver: CapturingReceiver, *ids: str) -> None:
    for sub_id in ids:
        outbox.state.store.add_subscription(
            WebhookSubscription(receiver.url(f"/{sub_id}"), ["order.*"], SECRET, id=sub_id)
        )


def save_order(outbox: OutboxApp, reference: str) -> str:
    """Save an order and dispatch its event in one Flask-SQLAlchemy transaction; commit."""
    outbox.db.session.add(Order(reference=reference))
    message_id = outbox.state.manager.dispatch_in_tx(outbox.db.session, "order.created", {"ref": reference})
    outbox.db.session.commit()
    return message_id


def test_commit_delivers_once_per_subscription(database_url: str, receiver: CapturingReceiver) -> None:
    outbox = make_outbox_app(database_url)
    subscribe(outbox, receiver, "sub_a", "sub_b")
    with outbox.app.app_context():
        message_id = save_order(outbox, "ord_1")
    ids = [outbox_delivery_id(message_id, s) for s in ("sub_a", "sub_b")]
    assert wait_final(outbox.state.store, ids) == [DeliveryState.DELIVERED]
    outbox.state.manager.close()  # let the after-commit relay thread finish
    assert sorted((r.path, r.webhook_id) for r in receiver.requests) == [
        ("/sub_a", ids[0]),
        ("/sub_b", ids[1]),
    ]
    with outbox.app.app_context():
        assert outbox.state.sweep().relayed == 0  # already relayed, nothing left for the sweeper
        assert outbox.state.manager.relay_outbox([message_id]).relayed == 0
    assert len(receiver.requests) == 2


def test_rollback_sends_nothing_and_leaves_nothing(database_url: str, receiver: CapturingReceiver) -> None:
    outbox = make_outbox_app(database_url)
    subscribe(outbox, receiver, "sub_a")
    with outbox.app.app_context():
        outbox.state.manager.dispatch_in_tx(outbox.db.session, "order.created", {"ref": "x"})
        outbox.db.session.rollback()
        assert outbox.outbox_rows() == 0
        assert outbox.state.sweep().relayed == 0
    outbox.state.manager.close()
    assert receiver.requests == []
    assert outbox.state.store.due_deliveries(now=FAR_FUTURE, limit=10) == []


def test_a_failing_commit_sends_nothing(database_url: str, receiver: CapturingReceiver) -> None:
    outbox = make_outbox_app(database_url)
    subscribe(outbox, receiver, "sub_a")
    with outbox.app.app_context():
        save_order(outbox, "ord_dup")
        receiver.wait_for(1)
        with pytest.raises(sa.exc.IntegrityError):
            save_order(outbox, "ord_dup")  # the unique reference fails the whole transaction
        outbox.db.session.rollback()
        assert outbox.outbox_rows() == 1  # only the first order's message
        assert outbox.state.sweep().relayed == 0
    outbox.state.manager.close()
    assert len(receiver.requests) == 1


def test_a_connection_write_is_relayed_by_the_sweeper(database_url: str, receiver: CapturingReceiver) -> None:
    # The sweep by hand only: a timed one could relay the message first.
    outbox = make_outbox_app(database_url, HARVEST_SWEEP_INTERVAL_SECONDS=3600)
    subscribe(outbox, receiver, "sub_a")
    with outbox.app.app_context():
        with outbox.engine.begin() as conn:
            message_id = outbox.state.manager.dispatch_in_tx(conn, "order.created", {"ref": "core"})
        assert outbox.state.sweep().relayed == 1
    [delivery] = receiver.wait_for(1)
    assert delivery.webhook_id == outbox_delivery_id(message_id, "sub_a")


def test_the_in_memory_store_refuses_dispatch_in_tx() -> None:
    app = Flask("memory")
    OutboundWebhookPlugin(InMemoryOutboundWebhookHandler(), app)
    close_later(app)
    engine = sa.create_engine("sqlite://")
    with app.app_context(), Session(engine) as session, pytest.raises(ConfigurationError, match="SQL store"):
        get_engine().manager.dispatch_in_tx(session, "order.created", {})


def test_racing_relays_create_exactly_one_delivery_per_message_and_subscription(
    database_url: str, redis_url: str, redis_conn: Any
) -> None:
    outbox = make_outbox_app(database_url, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)
    for sub_id in ("sub_a", "sub_b", "sub_c"):
        outbox.state.store.add_subscription(
            WebhookSubscription("http://127.0.0.1:9/none", ["order.*"], SECRET, id=sub_id)
        )
    with outbox.engine.begin() as conn:
        message_ids = [
            outbox.state.manager.dispatch_in_tx(conn, "order.created", {"n": n}) for n in range(1000)
        ]
    manager = outbox.state.manager
    start = threading.Barrier(3)
    failures: list[BaseException] = []

    def relay_all() -> None:
        try:
            start.wait()
            while manager.relay_outbox(limit=50).relayed:
                pass
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=relay_all) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert failures == []
    # A relay that ignores claims (a second pass over the same messages) creates nothing new.
    claimed = manager.outbox.claim(now=FAR_FUTURE, lease_seconds=1, limit=10) if manager.outbox else []
    assert claimed == []
    with outbox.engine.connect() as conn:
        deliveries = conn.execute(sa.text("SELECT id, subscription_id FROM harvest_webhook_deliveries")).all()
        unrelayed = conn.execute(
            sa.text("SELECT count(*) FROM harvest_outbox WHERE relayed_at IS NULL")
        ).scalar()
    assert unrelayed == 0
    assert len(deliveries) == 3000
    expected = {outbox_delivery_id(m, s) for m in message_ids for s in ("sub_a", "sub_b", "sub_c")}
    assert {row.id for row in deliveries} == expected


def test_purge_removes_relayed_messages_and_says_how_many(
    database_url: str, receiver: CapturingReceiver
) -> None:
    outbox = make_outbox_app(database_url)
    subscribe(outbox, receiver, "sub_a")
    with outbox.engine.begin() as conn:
        for n in range(3):
            outbox.state.manager.dispatch_in_tx(conn, "order.created", {"n": n})
    runner = outbox.app.test_cli_runner()
    relayed = runner.invoke(args=["harvest", "outbox", "relay"])
    assert relayed.exit_code == 0, relayed.output
    assert "relayed 3 outbox message(s), 0 failed" in relayed.output
    declined = runner.invoke(args=["harvest", "outbox", "purge", "--older-than", "0"], input="n\n")
    assert declined.exit_code == 1 and "Aborted" in declined.output  # it asks first
    purged = runner.invoke(args=["harvest", "outbox", "purge", "--older-than", "0", "--yes"])
    assert purged.exit_code == 0, purged.output
    assert "removed 3 relayed outbox message(s)" in purged.output
    assert outbox.outbox_rows() == 0


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import sqlalchemy as sa
    from flask import Flask
    from flask_sqlalchemy import SQLAlchemy
    from flask_harvest import OutboundWebhookPlugin

    db = SQLAlchemy()
    app = Flask("child")
    app.config["SQLALCHEMY_DATABASE_URI"] = os.environ["TEST_DATABASE_URL"]
    app.config["HARVEST_JOBS_BACKEND"] = "rq"
    app.config["HARVEST_REDIS_URL"] = os.environ["TEST_REDIS_URL"]
    db.init_app(app)
    OutboundWebhookPlugin.sql(db, app)

    with app.app_context():
        session = db.session()
        # Runs before flask-harvest's own after_commit hook: the process dies between the
        # commit and the relay, the window the outbox exists for.
        sa.event.listen(session, "after_commit", lambda s: os.kill(os.getpid(), signal.SIGKILL))
        session.execute(sa.text("INSERT INTO orders (reference) VALUES ('ord_killed')"))
        app.extensions["harvest"].manager.dispatch_in_tx(session, "order.created", {"ref": "ord_killed"})
        session.commit()
    sys.exit(3)  # not reached
    """
)


def test_a_process_killed_between_commit_and_relay_loses_nothing(
    database_url: str, redis_url: str, redis_conn: Any, receiver: CapturingReceiver, tmp_path: Path
) -> None:
    outbox = make_outbox_app(database_url, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)
    subscribe(outbox, receiver, "sub_a", "sub_b")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "TEST_DATABASE_URL": database_url, "TEST_REDIS_URL": redis_url}
    child = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    assert outbox.outbox_rows() == 1  # committed, never relayed
    with outbox.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM orders")).scalar() == 1
        [message_id] = conn.execute(
            sa.text("SELECT id FROM harvest_outbox WHERE relayed_at IS NULL")
        ).scalars()
    ids = [outbox_delivery_id(message_id, s) for s in ("sub_a", "sub_b")]
    # A worker starts: its start-up sweep relays the message, and it delivers.
    (tmp_path / "worker_app.py").write_text(WORKER_APP)
    worker = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "worker_app:create_app", "harvest", "worker", "--burst"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        timeout=60,
    )
    assert worker.returncode == 0, worker.stdout.decode() + worker.stderr.decode()
    assert wait_final(outbox.state.store, ids, timeout=5) == [DeliveryState.DELIVERED]
    assert sorted(r.webhook_id or "" for r in receiver.requests) == sorted(ids)


WORKER_APP = textwrap.dedent(
    """
    import os
    from flask import Flask
    from flask_sqlalchemy import SQLAlchemy
    from flask_harvest import OutboundWebhookPlugin

    def create_app():
        db = SQLAlchemy()
        app = Flask("worker_app")
        app.config.update(
            SQLALCHEMY_DATABASE_URI=os.environ["TEST_DATABASE_URL"],
            HARVEST_JOBS_BACKEND="rq",
            HARVEST_REDIS_URL=os.environ["TEST_REDIS_URL"],
            HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS=True,  # the receiver is on 127.0.0.1
        )
        db.init_app(app)
        OutboundWebhookPlugin.sql(db, app)
        return app
    """
)


def test_a_failed_savepoint_does_not_cancel_the_relay_of_earlier_messages(
    database_url: str, receiver: CapturingReceiver
) -> None:
    outbox = make_outbox_app(database_url)
    subscribe(outbox, receiver, "sub_a")
    with outbox.app.app_context():
        save_order(outbox, "ord_taken")
        receiver.wait_for(1)
        message_id = outbox.state.manager.dispatch_in_tx(outbox.db.session, "order.created", {"ref": "kept"})
        with pytest.raises(sa.exc.IntegrityError), outbox.db.session.begin_nested():
            outbox.db.session.add(Order(reference="ord_taken"))  # fails, and only its savepoint rolls back
        outbox.db.session.commit()
    # Relayed by the after-commit hook, not left waiting for a sweeper.
    delivery_id = outbox_delivery_id(message_id, "sub_a")
    assert receiver.wait_for(2)[1].webhook_id == delivery_id


def test_an_outbox_failure_does_not_stop_the_delivery_sweep(database_url: str) -> None:
    outbox = make_outbox_app(database_url)
    # The relay's claim fails (a column it writes is gone). Not the whole table: the deliveries'
    # head-of-line check reads the unrelayed keyed messages, whose columns stay.
    with outbox.engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {outbox_table.name} DROP COLUMN claim_token")
    try:
        with outbox.app.app_context():
            report = outbox.state.sweep()
        assert (report.relayed, report.released, report.requeued) == (0, 0, 0)
    finally:
        with outbox.engine.begin() as conn:
            conn.exec_driver_sql(f"ALTER TABLE {outbox_table.name} ADD COLUMN claim_token VARCHAR(32)")
