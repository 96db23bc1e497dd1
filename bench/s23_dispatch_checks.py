"""S23: what the checks at dispatch cost: ``dispatch()`` of an event whose type is in the catalog
(a realistic JSON Schema, ``HARVEST_EVENT_VALIDATION = "refuse"``) to K subscriptions that each
filter payloads, beside the same dispatch of the same payload to K subscriptions without a filter
and no catalog; both in the same run, alternating (SQL store on PostgreSQL, ``rq`` backend).

Goal: the checked dispatch takes at most 1.2x the plain one (medians) at every K.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import sqlalchemy as sa

from flask_harvest import WebhookSubscription, generate_secret, get_engine
from flask_harvest.conditions import parse_condition
from flask_harvest.webhooks.catalog import EventCatalog
from flask_harvest.webhooks.manager import OutboundWebhookManager
from flask_harvest.webhooks.stores.sql import subscriptions_table

from ._report import Context, Result, Row, median, percentile
from ._services import reset_all

ID = "S23"
TITLE = "dispatch() with schema validation and payload filters vs without"
KS = (1, 10)
GOAL = 1.2
CHECKED, PLAIN = "bench.order.created", "bench.order.plain"

#: An order event as an app would describe it: nested objects, an array of line items, formats,
#: enums, bounds and required members.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["order_id", "customer", "currency", "total", "items", "created_at"],
    "additionalProperties": False,
    "properties": {
        "order_id": {"type": "string", "pattern": "^ord_[0-9a-z]+$", "maxLength": 40},
        "customer": {
            "type": "object",
            "required": ["id", "email", "region"],
            "properties": {
                "id": {"type": "string", "minLength": 1},
                "email": {"type": "string", "format": "email"},
                "region": {"type": "string", "enum": ["EU", "US", "APAC"]},
                "vip": {"type": "boolean"},
            },
        },
        "currency": {"type": "string", "enum": ["EUR", "USD", "GBP", "JPY"]},
        "total": {"type": "integer", "minimum": 0},
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 100,
            "items": {
                "type": "object",
                "required": ["sku", "qty", "price"],
                "properties": {
                    "sku": {"type": "string", "minLength": 1},
                    "qty": {"type": "integer", "minimum": 1},
                    "price": {"type": "integer", "minimum": 0},
                },
            },
        },
        "created_at": {"type": "string", "format": "date-time"},
        "note": {"type": ["string", "null"], "maxLength": 500},
    },
}
PAYLOAD: dict[str, Any] = {
    "order_id": "ord_4f2a9c",
    "customer": {"id": "cus_81", "email": "ada@example.com", "region": "EU", "vip": False},
    "currency": "EUR",
    "total": 12800,
    "items": [
        {"sku": "A-100", "qty": 2, "price": 3400},
        {"sku": "B-220", "qty": 1, "price": 6000},
    ],
    "created_at": "2026-12-05T10:00:00Z",
    "note": None,
}
#: What a subscriber would filter on: EU orders above a threshold, in one of two currencies (it
#: holds for PAYLOAD, so both dispatches write K deliveries).
FILTER: dict[str, Any] = {
    "type": "All",
    "data": [
        {"type": "Eq", "data": {"path": "customer.region", "value": "EU"}},
        {"type": "GreaterThan", "data": {"path": "total", "value": 1000}},
        {"type": "In", "data": {"path": "currency", "values": ["EUR", "GBP"]}},
    ],
}


def _measure(ctx: Context, reps: int, k: int) -> tuple[list[float], list[float]]:
    """Time the checked and the plain dispatch, alternating; return both lists of milliseconds."""
    app = ctx.app()
    with ctx.engine.begin() as conn:
        conn.execute(sa.delete(subscriptions_table))
    condition = parse_condition(FILTER)
    with app.app_context():
        state = get_engine(app)
        store, plain = state.store, state.manager
        assert not len(plain.catalog), "the plain dispatch must have no catalog"
        assert state.settings.event_validation == "refuse"
        catalog = EventCatalog()
        catalog.register(CHECKED, description="An order was placed.", schema=SCHEMA, example=PAYLOAD)
        # The same store, backend and settings as the app's own manager: only the catalog differs.
        checked = OutboundWebhookManager(store, state.backend, state.settings, catalog=catalog)
        for n in range(k):
            for topic, payload_filter in ((CHECKED, condition), (PLAIN, None)):
                store.add_subscription(
                    WebhookSubscription(
                        target_url=f"http://127.0.0.1:9/{topic}/{n}",
                        event_topics=(topic,),
                        secret=generate_secret(),
                        payload_filter=payload_filter,
                    )
                )
        ours: list[float] = []
        theirs: list[float] = []
        for rep in range(reps + 5):
            # Alternate which goes first, so drift on a shared machine hits both alike.
            order = (0, 1) if rep % 2 == 0 else (1, 0)
            for which in order:
                started = time.perf_counter()
                ids = checked.dispatch(CHECKED, PAYLOAD) if which == 0 else plain.dispatch(PLAIN, PAYLOAD)
                elapsed = time.perf_counter() - started
                assert len(ids) == k, ids  # the filter held: both wrote K deliveries
                if rep >= 5:  # the first few warm caches and connections
                    (ours if which == 0 else theirs).append(elapsed * 1000)
    return ours, theirs


def run(ctx: Context) -> Result:
    reset_all(ctx.engine)
    reps = {1: ctx.pick(400, 60), 10: ctx.pick(300, 40)}
    result = Result()
    for k in KS:
        ours, theirs = _measure(ctx, reps[k], k)
        ratio = median(ours) / median(theirs)
        # The calls are paired (alternated one after the other), so the median of the pairs'
        # differences is the added cost with less of the machine's drift in it than the medians.
        added = median([a - b for a, b in zip(ours, theirs, strict=True)])
        result.rows.append(
            Row(
                ID,
                f"dispatch with schema check and filters, K={k} (median)",
                median(ours),
                "ms",
                f"<= {GOAL:g}x without",
                ratio <= GOAL,
                baseline=median(theirs),
                baseline_label="the same dispatch without catalog or filter",
                ratio=ratio,
                note=(
                    f"added {added:.2f} ms (median of paired differences); "
                    f"p95 {percentile(ours, 95):.2f} ms vs {percentile(theirs, 95):.2f} ms"
                ),
            )
        )
        result.details[f"k{k}"] = {
            "reps": len(ours),
            "added_ms_median_of_pairs": added,
            "checked_ms": {"median": median(ours), "p95": percentile(ours, 95), "min": min(ours)},
            "plain_ms": {"median": median(theirs), "p95": percentile(theirs, 95), "min": min(theirs)},
        }
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
