"""The transactional outbox in one file: an order and its webhook commit together, or not at all.

``POST /orders`` saves an ``Order`` (a Flask-SQLAlchemy model) and calls ``dispatch_in_tx`` on
``db.session`` in the same transaction; the event is sent after the commit. ``POST /orders/import``
saves several orders in one transaction: a duplicate reference fails it (IntegrityError), it is
rolled back, and none of its events is sent, not even those of the orders that were fine.

Runs on SQLite in a temporary folder and the in-process ``local`` job backend: no Redis, no setup.
It starts a capturing receiver on 127.0.0.1, drives both routes with the Flask test client, prints
what the receiver got, and exits 0 (1 if anything is off).

    python examples/outbox_app.py
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from flask import Flask, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from flask_harvest import DeliveryState, Harvest, WebhookSubscription, generate_secret
from flask_harvest.outbound.signing import verify_standard
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.manager import outbox_delivery_id

SECRET = generate_secret()


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)
harvest = Harvest(db=db)  # the SQL store on db's engine: the outbox shares its transactions


class Order(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    reference: Mapped[str] = mapped_column(sa.String(50), unique=True)
    total: Mapped[int]


def save_orders(items: list[dict[str, Any]]) -> tuple[dict[str, Any], int]:
    """Save the orders and write their events in one transaction; commit, or roll back."""
    try:
        events = []
        for item in items:
            db.session.add(Order(reference=item["reference"], total=item["total"]))
            events.append(harvest.dispatch_in_tx(db.session, "order.created", item))
        db.session.commit()  # the orders and their outbox messages, or neither
    except IntegrityError:
        db.session.rollback()  # the events written so far go with it: nothing is sent
        return {"error": "duplicate reference"}, 409
    return {"events": events}, 201


def create_app(database: Path) -> Flask:
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{database}"
    # The demo's receiver is on 127.0.0.1. The SSRF guard refuses private and loopback targets
    # unless this is set; never set it in production.
    app.config["HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS"] = True
    db.init_app(app)
    harvest.init_app(app)
    with app.app_context():
        db.create_all()

    @app.post("/orders")
    def create_order() -> tuple[dict[str, Any], int]:
        return save_orders([request.get_json()])

    @app.post("/orders/import")
    def import_orders() -> tuple[dict[str, Any], int]:
        return save_orders(request.get_json()["orders"])

    return app


def wait_delivered(app: Flask, delivery_id: str) -> bool:
    """Wait until the delivery's outcome is recorded (just after the receiver answers)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with app.app_context():
            delivery = harvest.store.get_delivery(delivery_id)
        if delivery is not None and delivery.state is DeliveryState.DELIVERED:
            return True
        time.sleep(0.05)
    return False


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access log from the receiver
    with tempfile.TemporaryDirectory() as folder, CapturingReceiver() as receiver:
        app = create_app(Path(folder) / "outbox.sqlite3")
        with app.app_context():
            engine = harvest.engine
        engine.store.add_subscription(
            WebhookSubscription(receiver.url("/hooks/orders"), ["order.*"], SECRET, id="sub_orders")
        )
        client = app.test_client()

        created = client.post("/orders", json={"reference": "ord_1001", "total": 42})
        [message_id] = created.get_json()["events"]
        print(f"POST /orders ord_1001 -> {created.status_code}, outbox message {message_id}")
        [received] = receiver.wait_for(1, timeout=30)  # relayed after the commit, then sent
        verify_standard(SECRET, received.headers, received.body)  # raises if the signature is wrong
        expected_id = outbox_delivery_id(message_id, "sub_orders")
        same_id = received.webhook_id == expected_id
        print(f"receiver got 1 delivery: {received.path} {received.body.decode()}")
        print(f"  webhook-id {received.webhook_id}")
        print(f"  equals outbox_delivery_id(message id, 'sub_orders'): {same_id}")
        delivered = wait_delivered(app, expected_id)

        failed = client.post(
            "/orders/import",
            json={"orders": [{"reference": "ord_1002", "total": 7}, {"reference": "ord_1001", "total": 9}]},
        )
        print(f"POST /orders/import [ord_1002, ord_1001] -> {failed.status_code}, rolled back")
        engine.manager.close()  # wait for any relay a commit started
        with app.app_context():
            swept = engine.sweep()  # relays committed messages whose relay never ran: there are none
            orders = db.session.scalar(sa.select(sa.func.count()).select_from(Order))
            deliveries = db.session.scalar(sa.text("SELECT count(*) FROM harvest_webhook_deliveries"))
        time.sleep(0.5)  # a stray request would have arrived by now
        print(
            f"after the failed import: {orders} order(s), {deliveries} delivery(ies), "
            f"sweep relayed {swept.relayed}, receiver has {len(receiver.requests)} request(s)"
        )
        engine.close()

        ok = (
            created.status_code == 201
            and same_id
            and delivered
            and failed.status_code == 409
            and (orders, deliveries, swept.relayed, len(receiver.requests)) == (1, 1, 0, 1)
        )
        print("outbox example OK" if ok else "outbox example FAILED")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
