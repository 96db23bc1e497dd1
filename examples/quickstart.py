"""flask-harvest in one file: signed webhooks, retries and the dead-letter queue.

Runs on the embedded default (SQLite and the in-process ``local`` job backend): no Redis, no
setup. It starts a receiver on 127.0.0.1, registers two subscriptions (one healthy, one always
failing), dispatches events, prints each delivery the receiver got with its verified signatures,
shows the failing one landing in the DLQ, and exits 0.

    python examples/quickstart.py
"""

from __future__ import annotations

import logging
import sys
import tempfile
import threading
import time
from pathlib import Path

from flask import Flask, request
from flask_sqlalchemy import SQLAlchemy
from werkzeug.serving import make_server

from flask_harvest import DeliveryState, Harvest, WebhookSubscription, generate_secret
from flask_harvest.outbound.signing import verify_standard, verify_stripe

SECRET = generate_secret()

# The app factory pattern: the extensions are created once, then registered on the app.
db = SQLAlchemy()
harvest = Harvest(db=db)


def start_receiver() -> tuple[str, list[str]]:
    """Run a receiver on a free port of 127.0.0.1; return its base URL and the lines it logs."""
    receiver = Flask("receiver")
    received: list[str] = []

    @receiver.post("/orders")
    def orders() -> tuple[str, int]:
        body = request.get_data()
        verify_standard(SECRET, request.headers, body)  # raises if the signature is wrong
        verify_stripe(SECRET, request.headers["Autumn-Signature"], body)
        received.append(
            f"  received {request.headers['webhook-id']}  {body.decode()}  (both signatures valid)"
        )
        return "", 204

    @receiver.post("/broken")
    def broken() -> tuple[str, int]:
        return "maintenance", 503

    server = make_server("127.0.0.1", 0, receiver, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}", received


def create_app(database: Path) -> Flask:
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{database}"
    app.config["HARVEST_WEBHOOKS_MAX_ATTEMPTS"] = 3
    app.config["HARVEST_WEBHOOKS_INITIAL_BACKOFF_MS"] = 100  # quick retries for the demo
    # The demo's receiver is on 127.0.0.1. The SSRF guard refuses private and loopback targets
    # unless this is set; never set it in production.
    app.config["HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS"] = True
    db.init_app(app)
    harvest.init_app(app)  # the harvest tables in the app's database, and the engine
    return app


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access log from the receiver
    base_url, received = start_receiver()
    with tempfile.TemporaryDirectory() as folder:
        app = create_app(Path(folder) / "quickstart.sqlite3")
        with app.app_context():
            store = harvest.store
            store.add_subscription(
                WebhookSubscription(f"{base_url}/orders", ["order.*"], SECRET, id="sub_orders")
            )
            store.add_subscription(
                WebhookSubscription(f"{base_url}/broken", ["order.created"], SECRET, id="sub_broken")
            )
            ids = []
            for number in (1, 2, 3):
                ids += harvest.dispatch("order.created", {"order_id": f"ord_{number}", "total": 42})
            ids += harvest.dispatch("order.fulfilled", {"order_id": "ord_1"})
            print(f"dispatched {len(ids)} deliveries")

            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                states = [delivery.state for delivery in store.get_deliveries(ids)]
                if all(s in (DeliveryState.DELIVERED, DeliveryState.DLQ) for s in states):
                    break
                time.sleep(0.1)
            print("\n".join(sorted(received)))
            dlq = store.list_dlq()
            print(f"dead-letter queue: {len(dlq)} deliveries")
            for entry in dlq:
                print(
                    f"  {entry.id} -> {entry.subscription_id}: {entry.last_error}"
                    f" after {entry.attempt} attempts"
                )
            delivered = sum(d.state is DeliveryState.DELIVERED for d in store.get_deliveries(ids))
            ok = delivered == 4 and len(received) == 4 and len(dlq) == 3
            print("quickstart OK" if ok else f"quickstart FAILED: {delivered} delivered, {len(dlq)} in DLQ")
            return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
