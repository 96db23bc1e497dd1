"""Helpers shared by the delivery tests: an app around a store, and waiting for outcomes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from flask import Flask

from flask_harvest import DeliveryState, OutboundWebhookHandler, OutboundWebhookPlugin, get_engine
from flask_harvest.jobs.rq import RqBackend
from flask_harvest.webhooks.models import FINAL_STATES

#: Quick retries so tests don't wait on the production schedule.
FAST = {
    "HARVEST_WEBHOOKS_INITIAL_BACKOFF_MS": 20,
    "HARVEST_WEBHOOKS_MAX_BACKOFF_MS": 2000,
    "HARVEST_WEBHOOKS_TIMEOUT_SECONDS": 5,
    "HARVEST_WEBHOOKS_DEADLINE_SECONDS": 10,
    "HARVEST_SWEEP_INTERVAL_SECONDS": 0.5,
    # The receivers are on 127.0.0.1, which the SSRF policy refuses by default.
    "HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS": True,
    # Tenants' endpoints are held to their own policy, which the key above does not open.
    "HARVEST_WEBHOOKS_TENANT_ALLOW_CIDRS": "127.0.0.1/32",
}


#: Apps made during the current test; ``close_apps`` stops their backends afterwards, so no
#: sweeper thread of an earlier test touches the next test's rows.
_apps: list[Flask] = []


def make_app(store: OutboundWebhookHandler, *, delegate: Any = None, **config: Any) -> Flask:
    """Return a Flask app with the extension on ``store`` and fast retry settings."""
    app = Flask("harvest_test")
    app.config.update(FAST)
    app.config.update(config)
    OutboundWebhookPlugin(store, app, delegate=delegate)
    return close_later(app)


def rq_app(store: OutboundWebhookHandler, redis_url: str, **config: Any) -> Flask:
    """:func:`make_app` on the ``rq`` backend at ``redis_url``."""
    return make_app(store, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url, **config)


def rq_backend(app: Flask) -> RqBackend:
    """The ``rq`` backend of an app :func:`rq_app` made."""
    backend = get_engine(app).backend
    assert isinstance(backend, RqBackend)
    return backend


def close_later(app: Flask) -> Flask:
    """Have ``close_apps`` stop ``app``'s job backend after the test; return ``app``."""
    _apps.append(app)
    return app


def close_apps() -> None:
    """Stop the job backends of every app :func:`make_app` made."""
    while _apps:
        app = _apps.pop()
        get_engine(app).close()
        flask_sqlalchemy = app.extensions.get("sqlalchemy")
        if flask_sqlalchemy is not None:  # its engines belong to the app: close their connections
            with app.app_context():
                for engine in flask_sqlalchemy.engines.values():
                    engine.dispose()


def wait_final(
    store: OutboundWebhookHandler, delivery_ids: Sequence[str], timeout: float = 20.0
) -> list[DeliveryState]:
    """Wait until every delivery is delivered, dead-lettered or skipped; return the distinct states."""
    end = time.monotonic() + timeout
    while True:
        states = [d.state for d in store.get_deliveries(list(delivery_ids))]
        if len(states) == len(delivery_ids) and all(s in FINAL_STATES for s in states):
            return sorted(set(states), key=lambda s: s.value)
        if time.monotonic() > end:
            raise TimeoutError(f"deliveries not final after {timeout} s: {states}")
        time.sleep(0.02)


@contextmanager
def before_first_update(engine: sa.Engine, action: Callable[[], object]) -> Iterator[None]:
    """Run ``action`` once, just before this thread's first ``UPDATE`` on ``engine``: another
    caller's change that lands between what a call read and what it writes."""
    me = threading.current_thread()
    done = False

    def hook(conn: sa.Connection, cursor: Any, statement: str, *_args: Any) -> None:
        nonlocal done
        if not done and threading.current_thread() is me and statement.lstrip().upper().startswith("UPDATE"):
            done = True
            action()

    sa.event.listen(engine, "before_cursor_execute", hook)
    try:
        yield
    finally:
        sa.event.remove(engine, "before_cursor_execute", hook)
