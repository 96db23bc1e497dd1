"""The consumer portal in one file: your customers manage their own webhook endpoints.

An app with a stand-in sign-in (each user belongs to one customer, a tenant), two event types in
its catalog, the portal blueprint, and a route ``/account/webhooks`` that sends a signed-in user
to the portal with a signed link. Run as a script, it plays the customer through Flask's test
client: it follows the link, adds an endpoint on a receiver it runs on 127.0.0.1, copies the
signing secret the portal shows once, sends a test event from the portal, dispatches an event for
that customer, and checks that the receiver verified both and that another customer's portal does
not see the endpoint. Runs on the embedded default (SQLite, the in-process ``local`` job backend):
no Redis, no setup.

    python examples/portal_app.py

To click through it yourself: ``flask --app examples/portal_app.py run``, then open
http://127.0.0.1:5000/login/alice and http://127.0.0.1:5000/account/webhooks.
"""

from __future__ import annotations

import logging
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from flask import Flask, abort, redirect, request, session, url_for
from flask.testing import FlaskClient
from flask_sqlalchemy import SQLAlchemy
from werkzeug.serving import make_server
from werkzeug.wrappers import Response

from flask_harvest import Harvest
from flask_harvest.outbound.signing import verify_standard
from flask_harvest.portal import portal

db = SQLAlchemy()
harvest = Harvest(db=db)

# What the customers can subscribe to, with what each type means and an example payload: the
# portal lists them, and a test event sends the example.
harvest.event_type(
    "order.created",
    description="An order was placed. Sent once per order.",
    schema={
        "type": "object",
        "required": ["order_id", "total"],
        "properties": {"order_id": {"type": "string"}, "total": {"type": "number", "minimum": 0}},
    },
    example={"order_id": "ord_example", "total": 12.5},
)
harvest.event_type(
    "order.refunded",
    description="An order was refunded, in full or in part.",
    schema={
        "type": "object",
        "required": ["order_id", "amount"],
        "properties": {"order_id": {"type": "string"}, "amount": {"type": "number", "minimum": 0}},
    },
    example={"order_id": "ord_example", "amount": 12.5},
)


@dataclass(frozen=True)
class User:
    name: str
    tenant: str  # the customer account the user belongs to: the portal shows its endpoints only


# A stand-in for your user table: each user belongs to one customer.
USERS = {"alice": User("alice", tenant="acme"), "bob": User("bob", tenant="globex")}


def current_user() -> User | None:
    """The signed-in user (your app has Flask-Login or its own; this one trusts the session)."""
    return USERS.get(session.get("user", ""))


def create_app(database: Path | None = None) -> Flask:
    database = database or Path(tempfile.gettempdir()) / "harvest_portal_example.sqlite3"
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{database}"
    # Signs your sessions, and the portal's links and cookie unless HARVEST_PORTAL_SECRET_KEY is
    # set: a long random value from your secrets in production.
    app.secret_key = "dev only: a long random value in production"
    app.config["HARVEST_PORTAL_NAME"] = "Acme Shop webhooks"
    app.config["HARVEST_PORTAL_ACCENT_COLOR"] = "#0b7285"
    # The demo's receiver is on 127.0.0.1, which the SSRF policy refuses to customers' endpoints
    # unless this lets them reach it; never in production (a customer would reach your machine).
    app.config["HARVEST_WEBHOOKS_TENANT_ALLOW_CIDRS"] = "127.0.0.1/32"
    db.init_app(app)
    harvest.init_app(app)
    app.register_blueprint(portal, url_prefix="/portal")

    @app.get("/login/<name>")
    def login(name: str) -> Response:
        # A stand-in sign-in: your app checks a password, SSO or a magic link here.
        if name not in USERS:
            abort(404)
        session["user"] = name
        return redirect(url_for("account_webhooks"))

    @app.get("/account/webhooks")
    def account_webhooks() -> Response:
        # Your app decides who the user is and which customer they act for; the link carries that
        # customer only, signed, and expires in HARVEST_PORTAL_LINK_SECONDS.
        user = current_user()
        if user is None:
            return redirect(url_for("login", name="alice"))
        return redirect(harvest.portal_url(user.tenant))

    return app


# -- the demo: a customer's receiver, and the customer's clicks -------------------------------------

#: The signing secret the portal showed the customer, which their receiver verifies with.
SECRETS: dict[str, str] = {}
RECEIVED: list[str] = []


def start_receiver() -> str:
    """Run the customer's receiver on a free port of 127.0.0.1; return its URL."""
    receiver = Flask("receiver")

    @receiver.post("/hooks")
    def hooks() -> tuple[str, int]:
        body = request.get_data()
        verify_standard(SECRETS["acme"], request.headers, body)  # raises if the signature is wrong
        RECEIVED.append(f"{request.headers['webhook-id']} {body.decode()}")
        return "", 204

    server = make_server("127.0.0.1", 0, receiver, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}/hooks"


def find(pattern: str, html: str) -> str:
    """The first group of ``pattern`` in a page (what a browser user would read or a form carry)."""
    found = re.search(pattern, html)
    if found is None:
        raise AssertionError(f"{pattern!r} is not on the page")
    return found.group(1)


def csrf_of(page: str) -> str:
    """The CSRF token every portal form carries as a hidden field."""
    return find(r'name="csrf_token" value="([^"]+)"', page)


def open_portal(client: FlaskClient, user: str) -> str:
    """Sign in as ``user``, follow ``/account/webhooks`` to the portal; return the link it gave."""
    client.get(f"/login/{user}")
    link = client.get("/account/webhooks").headers["Location"]
    opened = client.get(link)
    assert opened.status_code == 303, opened.status_code  # the session cookie, then the index
    return link


def delivered_count(client: FlaskClient) -> int:
    """How many deliveries the customer's *Deliveries* page lists as delivered."""
    listing = client.get("/portal/deliveries?state=delivered").get_data(as_text=True)
    return listing.count('<span class="state state-delivered">')


def wait_for(condition: Callable[[], bool], seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    receiver_url = start_receiver()
    with tempfile.TemporaryDirectory() as folder:
        app = create_app(Path(folder) / "portal.sqlite3")
        alice = app.test_client()
        link = open_portal(alice, "alice")
        parts = urlsplit(link)
        print(f"alice's portal link: {parts.scheme}://{parts.netloc}{parts.path}?token=<signed, 10 minutes>")
        cookie = alice.get_cookie("harvest_portal", path="/portal/")
        assert cookie is not None
        print(f"session cookie: {cookie.key}, path {cookie.path}, HttpOnly {cookie.http_only}")

        # The customer adds an endpoint: a refused URL comes back with the reason in their terms.
        form = alice.get("/portal/endpoints/new").get_data(as_text=True)
        fields = {"csrf_token": csrf_of(form), "event_types": ["order.created", "order.refunded"]}
        refused = alice.post(
            "/portal/endpoints/new", data={**fields, "target_url": "http://169.254.169.254/latest"}
        )
        reason = find(r'id="form-error"[^>]*>([^<]+)<', refused.get_data(as_text=True))
        print(f"refused URL ({refused.status_code}): {reason}")
        added = alice.post("/portal/endpoints/new", data={**fields, "target_url": receiver_url})
        page = added.get_data(as_text=True)
        SECRETS["acme"] = find(r'id="new-secret">([^<]+)<', page)
        endpoint_id = find(r'/portal/endpoints/([A-Za-z0-9_]+)"', page)
        print(f"endpoint {endpoint_id} added for {receiver_url}; secret shown once: {SECRETS['acme'][:6]}...")

        # A test event from the portal, then a real event your app dispatches for that customer.
        tested = alice.post(
            f"/portal/endpoints/{endpoint_id}/test",
            data={"csrf_token": csrf_of(form), "event_type": "order.created"},
        )
        print(f"test event from the portal: {tested.status_code}")
        with app.app_context():
            harvest.dispatch("order.created", {"order_id": "ord_1", "total": 42}, tenant="acme")
        # The customer sees both deliveries in the portal once the worker has recorded them.
        delivered = wait_for(lambda: delivered_count(alice) == 2)
        for line in sorted(RECEIVED):
            print(f"  receiver verified {line}")
        print(f"alice's deliveries page lists {delivered_count(alice)} delivered")

        # Another customer's user: their portal shows their own endpoints only.
        bob = app.test_client()
        open_portal(bob, "bob")
        other = bob.get(f"/portal/endpoints/{endpoint_id}")
        print(f"bob opening acme's endpoint: {other.status_code}")

        ok = delivered and len(RECEIVED) == 2 and other.status_code == 404
        print("portal OK" if ok else "portal FAILED")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
