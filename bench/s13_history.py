"""S13: flat costs as history grows. The sweeper's pass, ``claim_deliveries``, the DLQ page and
the stats with 1,000,000 delivered and dead-lettered rows (each with its attempt) and 10,000 due
pending rows in PostgreSQL, against the same operations with 1,000 history rows and the same
10,000 pending (the DLQ page then still has a full page to show, so both runs do the same work).

Goal: each within 1.5x (medians). Each database is seeded once by ``bench._history`` and kept for
the next run; the calls alternate between the two apps in a rotating order, so the drift of a
shared machine hits both alike. The plans PostgreSQL chose for the statements the store sent (as
generic plans, which a prepared statement gets) are in the JSON's details.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable

import sqlalchemy as sa
from flask import Flask

from flask_harvest import get_engine
from flask_harvest.webhooks.models import DeliveryState, utcnow
from flask_harvest.webhooks.stores.sql import deliveries_table

from ._history import PENDING, SMALL_HISTORY, History, alternate, history_apps
from ._plans import plans
from ._report import Context, Result, Row, median, percentile
from ._services import reset_redis

ID = "S13"
TITLE = "flat costs as history grows (1M history rows)"
GOAL = 1.5
#: Deliveries per claim, as a worker's batch.
CLAIM_BATCH = 100
#: Rows per DLQ page (the actuator's and the dashboard's default).
DLQ_PAGE = 50


# -- the operations ----------------------------------------------------------------------------


def sweep(app: Flask) -> None:
    get_engine(app).sweep()


def dlq_page(app: Flask) -> None:
    page, _ = get_engine(app).operations.dlq_page(limit=DLQ_PAGE)
    if len(page) != DLQ_PAGE:
        raise AssertionError(f"the DLQ page had {len(page)} rows, not {DLQ_PAGE}")


def stats(app: Flask) -> None:
    get_engine(app).operations.stats()


class Claims:
    """Claim a batch of due pending deliveries, then put them back as they were, on an engine of
    its own (outside the store's, so a plan capture sees only the claim)."""

    def __init__(self, seeds: dict[str, History], seed: int = 13) -> None:
        self.random = random.Random(seed)  # noqa: S311 (a sample, not a secret)
        self.engines = {seed.database_url: sa.create_engine(seed.database_url) for seed in seeds.values()}
        self.ids: dict[int, list[str]] = {}

    def load(self, app: Flask) -> None:
        with app.app_context():
            self.ids[id(app)] = get_engine(app).store.due_deliveries(now=utcnow(), limit=PENDING)

    def __call__(self, app: Flask) -> None:
        chosen = self.random.sample(self.ids[id(app)], CLAIM_BATCH)
        store = get_engine(app).store
        claims = store.claim_deliveries(chosen, now=utcnow(), lease_seconds=30, max_attempts=8)
        if len(claims) != CLAIM_BATCH:
            raise AssertionError(f"claimed {len(claims)} deliveries, not {CLAIM_BATCH}")
        table = deliveries_table
        with self.engines[app.config["SQLALCHEMY_DATABASE_URI"]].begin() as conn:
            conn.execute(
                sa.update(table)
                .where(table.c.id.in_(chosen))
                .values(state=DeliveryState.PENDING.value, lease_expires_at=None, lease_token=None)
            )

    def close(self) -> None:
        for engine in self.engines.values():
            engine.dispose()


# -- the scenario --------------------------------------------------------------------------------


def run(ctx: Context) -> Result:
    reset_redis()
    history = ctx.pick(1_000_000, 1_000_000)
    reps = ctx.pick(200, 40)
    apps, seeds = history_apps(ctx, history)
    claims = Claims(seeds)
    for app in apps.values():
        claims.load(app)
        with app.app_context():
            sweep(app)  # queues the due rows once: later passes find their jobs waiting
    operations: dict[str, Callable[[Flask], None]] = {
        "sweeper pass": sweep,
        f"claim_deliveries ({CLAIM_BATCH})": claims,
        f"DLQ page ({DLQ_PAGE} rows)": dlq_page,
        "stats (/stats)": stats,
    }
    result = Result()
    result.details["seed_seconds"] = {name: seed.seed_seconds for name, seed in seeds.items()}
    result.details["rows"] = {"big": history, "small": SMALL_HISTORY, "pending": PENDING}
    for label, operation in operations.items():
        times = alternate(apps, operation, reps)
        base, big = median(times["small"]), median(times["big"])
        ratio = big / base
        result.rows.append(
            Row(
                ID,
                f"{label}, {history:,} history rows (median)",
                big,
                "ms",
                f"<= {GOAL}x",
                ratio <= GOAL,
                baseline=base,
                baseline_label=f"{SMALL_HISTORY:,} rows",
                ratio=ratio,
                note=f"p95 {percentile(times['big'], 95):.2f} vs {percentile(times['small'], 95):.2f} ms",
            )
        )
        result.details[label] = {
            name: {"median": median(t), "p95": percentile(t, 95), "min": min(t), "reps": len(t)}
            for name, t in times.items()
        }
    result.details["plans"] = {label: plans(apps["big"], op) for label, op in operations.items()}
    claims.close()
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
