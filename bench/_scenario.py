"""Steps several scenarios share: subscriptions, dispatching at a steady rate, counting outcomes."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence

import sqlalchemy as sa
from flask import Flask

from flask_harvest import WebhookSubscription, generate_secret, get_engine
from flask_harvest.webhooks.stores.sql import deliveries_table, subscriptions_table


def _cycle(topic: str | Sequence[str]) -> tuple[str, ...]:
    return (topic,) if isinstance(topic, str) else tuple(topic)


def subscribe(app: Flask, urls: Sequence[str], topic: str | Sequence[str] = "bench.event") -> list[str]:
    """Add one active subscription per URL to ``topic`` (or, given several topics, URL ``n`` to
    topic ``n`` modulo their number); return their ids."""
    ids = []
    topics = _cycle(topic)
    with app.app_context():
        store = get_engine(app).store
        for number, url in enumerate(urls):
            subscription = WebhookSubscription(
                target_url=url, event_topics=(topics[number % len(topics)],), secret=generate_secret()
            )
            store.add_subscription(subscription)
            ids.append(subscription.id)
    return ids


def payload(number: int) -> dict[str, object]:
    """An ordinary event body that carries its dispatch time (``sent_at``) for latency."""
    return {
        "sent_at": time.time(),
        "n": number,
        "order_id": f"ord_{number:08d}",
        "total": 4200,
        "currency": "EUR",
        "items": [{"sku": "SKU-1", "qty": 1}],
    }


def dispatch_many(app: Flask, count: int, topic: str = "bench.event") -> float:
    """Dispatch ``count`` events as fast as possible; return the seconds it took."""
    started = time.perf_counter()
    with app.app_context():
        manager = get_engine(app).manager
        for number in range(count):
            manager.dispatch(topic, payload(number))
    return time.perf_counter() - started


class SteadyDispatcher(threading.Thread):
    """Dispatches ``count`` events at ``rate`` per second on a thread (the 'web process'); given
    several topics, event ``n`` goes to topic ``n`` modulo their number."""

    def __init__(
        self, app: Flask, count: int, rate: float, topic: str | Sequence[str] = "bench.event"
    ) -> None:
        super().__init__(name="bench-dispatcher", daemon=True)
        self.app, self.count, self.rate, self.topics = app, count, rate, _cycle(topic)
        self.behind = 0.0  # the most the dispatcher fell behind its schedule, in seconds
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.app.app_context():
                manager = get_engine(self.app).manager
                start = time.monotonic()
                for number in range(self.count):
                    due = start + number / self.rate
                    wait = due - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    else:
                        self.behind = max(self.behind, -wait)
                    manager.dispatch(self.topics[number % len(self.topics)], payload(number))
        except BaseException as exc:  # reported by the scenario
            self.error = exc


def _counts(engine: sa.Engine, column: sa.Column[str]) -> Counter[str]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(column, sa.func.count()).group_by(column)).all()
    return Counter({value: int(n) for value, n in rows})


def delivery_states(engine: sa.Engine) -> Counter[str]:
    """How many delivery rows are in each state."""
    return _counts(engine, deliveries_table.c.state)


def subscription_statuses(engine: sa.Engine) -> Counter[str]:
    """How many subscriptions are in each status (``active``, ``disabled``, ...)."""
    return _counts(engine, subscriptions_table.c.status)
