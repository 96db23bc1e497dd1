"""A production-style flask-harvest app: an app factory on PostgreSQL and Redis, served by gunicorn.

Everything comes from the environment, as on a platform that runs a ``Procfile``:

``DATABASE_URL``
    The SQLAlchemy URL of the app's database, e.g. ``postgresql+psycopg://app@db.internal/app``.
    The orders and the webhook tables live there, so an order and its event commit together.
``REDIS_URL``
    Redis for the delivery queue (``HARVEST_JOBS_BACKEND`` is ``rq`` here), e.g.
    ``redis://cache.internal:6379/0``.
``HARVEST_*``
    Any other flask-harvest key, e.g. ``HARVEST_WEBHOOKS_MAX_ATTEMPTS=8``.

The processes (see README.md beside this file)::

    flask --app app:create_app harvest init-db    # release: the flask-harvest tables
    flask --app app:create_app create-tables      # release: the app's own tables
    gunicorn -c gunicorn.conf.py                  # web
    flask --app app:create_app harvest worker     # worker, as many as you need

``python run_local.py`` starts all of it on this machine and proves one delivery end to end.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import click
import sqlalchemy as sa
from flask import Blueprint, Flask, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from flask_harvest import Harvest


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)
# Migrations (or the release step) own the schema: several processes starting at once must not
# race to create tables.
harvest = Harvest(db=db, create_tables=False)
orders = Blueprint("orders", __name__)


class Order(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    reference: Mapped[str] = mapped_column(sa.String(64), unique=True)
    total_cents: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(
        sa.DateTime(timezone=True), default=lambda: datetime.now(timezone.utc)
    )


def _required(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"set {name} in the environment (see examples/production/README.md)")
    return value


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """Build the app from the environment; ``config`` overrides it (for tests)."""
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = _required("DATABASE_URL")
    # Connections idle in a worker's pool can be cut by the server or a proxy; test before use.
    app.config["SQLALCHEMY_ENGINE_OPTIONS"] = {"pool_pre_ping": True}
    app.config["HARVEST_JOBS_BACKEND"] = "rq"
    app.config["HARVEST_REDIS_URL"] = _required("REDIS_URL")
    app.config.update({k: v for k, v in os.environ.items() if k.startswith("HARVEST_")})
    app.config.update(config or {})
    db.init_app(app)
    harvest.init_app(app)
    app.register_blueprint(orders)
    app.cli.add_command(create_tables)
    return app


@orders.post("/orders")
def create_order() -> tuple[dict[str, Any], int]:
    """Save an order and its ``order.created`` event in one transaction."""
    data = request.get_json(silent=True) or {}
    reference, total = data.get("reference"), data.get("total_cents")
    if not isinstance(reference, str) or not reference or not isinstance(total, int):
        return {"error": "send {'reference': str, 'total_cents': int}"}, 400
    order = Order(reference=reference, total_cents=total)
    db.session.add(order)
    try:
        db.session.flush()  # the order's id, for the event
    except sa.exc.IntegrityError:
        db.session.rollback()  # nothing was written, so no event is sent either
        return {"error": f"order {reference} exists"}, 409
    event = {"order_id": order.id, "reference": reference, "total_cents": total}
    # Written into this transaction: the event is sent if and only if the order commits.
    event_id = harvest.dispatch_in_tx(db.session, "order.created", event)
    db.session.commit()
    return {"order_id": order.id, "event_id": event_id}, 201


@orders.get("/healthz")
def healthz() -> dict[str, bool]:
    db.session.execute(sa.text("SELECT 1"))
    return {"ok": True}


@click.command("create-tables")
def create_tables() -> None:
    """Create the app's own tables where they do not exist (the release step)."""
    db.create_all()
    click.echo("the app's tables are in place")
