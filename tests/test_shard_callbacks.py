"""Completion callbacks and the store's metrics on three PostgreSQL shards: each delivery row lives
on its run's shard, is delivered to a real receiver on 127.0.0.1, is redriven where it lives, and
the scrape's gauges add up every shard."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from flask import Flask

from flask_harvest import get_engine, workflow_service
from flask_harvest.callbacks import CompletionCallbacks
from flask_harvest.callbacks._schema import deliveries_table
from flask_harvest.callbacks.sharded import ShardedCallbackStore
from flask_harvest.outbound.attempt import DeliveryState
from flask_harvest.shards import shard_for_key
from flask_harvest.testing import CapturingReceiver
from flask_harvest.workflows import ExecutionState

from .metrics_support import parse, value
from .shard_support import pg_shards
from .workflow_app import AUTH, make_workflow_app, wait_for

__all__ = ["pg_shards"]

SECRET = "cb-SECRET-CANARY-shards-41c2"
S = ExecutionState


def _app(urls: list[str], **config: Any) -> Flask:
    return make_workflow_app(
        urls[0],
        with_triggers=False,
        HARVEST_WORKFLOW_SHARDS=urls,
        HARVEST_COMPLETION_CALLBACK_ALLOWLIST="127.0.0.1",
        HARVEST_COMPLETION_CALLBACK_ALLOW_PRIVATE_TARGETS=True,
        HARVEST_COMPLETION_CALLBACK_SECRET=SECRET,
        **config,
    )


def _callbacks(app: Flask) -> CompletionCallbacks:
    callbacks = get_engine(app).callbacks
    assert callbacks is not None
    return callbacks


def _delivery_rows(url: str) -> dict[str, tuple[str, str]]:
    """delivery_id -> (execution_id, state) of the rows on one shard's database."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(
                    deliveries_table.c.delivery_id, deliveries_table.c.execution_id, deliveries_table.c.state
                )
            ).all()
    finally:
        engine.dispose()
    return {r.delivery_id: (r.execution_id, r.state) for r in rows}


def _wait(predicate: Callable[[], Any], what: str) -> Any:
    end = time.monotonic() + 30
    while True:
        found = predicate()
        if found:
            return found
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def _keys_on_every_shard(per_shard: int, prefix: str) -> list[str]:
    """Workflow ids, ``per_shard`` of them routing to each of three shards."""
    keys: list[str] = []
    for shard in range(3):
        keys += [k for k in (f"{prefix}-{i}" for i in range(500)) if shard_for_key(k, 3) == shard][:per_shard]
    return keys


def test_deliveries_stay_on_their_runs_shard_and_are_delivered_and_redriven(
    pg_shards: list[str], receiver: CapturingReceiver
) -> None:
    """Rule: no cross-shard delivery fan-out: a delivery row lives on the same shard as its owning
    execution, and is claimed, delivered and redriven there."""
    app = _app(pg_shards)
    callbacks = _callbacks(app)
    assert isinstance(callbacks.store, ShardedCallbackStore)
    hook, failing = receiver.url("/hook"), receiver.url("/refuses")
    # Every answer of /refuses is a 403 until the test lets it through: a permanent failure.
    receiver.respond("/refuses", 403, times=3)
    keys = _keys_on_every_shard(2, "cb")
    with app.app_context():
        service = workflow_service()
        started = [
            service.start(
                "echo",
                i,
                workflow_id=key,
                completion_callbacks=[{"url": hook}, {"url": failing}] if i % 2 == 0 else [{"url": hook}],
            )[0].execution_id
            for i, key in enumerate(keys)
        ]
    for execution_id in started:
        wait_for(app, execution_id, lambda state, steps: state is S.COMPLETED)
    expected = len(started) + (len(started) + 1) // 2

    def settled() -> dict[str, tuple[str, str]] | None:
        rows = {k: v for url in pg_shards for k, v in _delivery_rows(url).items()}
        done = len(rows) == expected and all(state in ("DELIVERED", "FAILED") for _, state in rows.values())
        return rows if done else None

    _wait(settled, "every delivery to be delivered or failed")
    # Each row is on its run's shard, and its id names that shard.
    for shard, url in enumerate(pg_shards):
        for delivery_id, (execution_id, _) in _delivery_rows(url).items():
            assert execution_id.startswith(f"s{shard}-") and delivery_id.startswith(f"s{shard}-")
    assert {s for url in pg_shards for _, s in _delivery_rows(url).values()} == {"DELIVERED", "FAILED"}
    assert all(_delivery_rows(url) for url in pg_shards)  # every shard holds deliveries
    # Reads by id find each run's deliveries on its shard.
    for i, execution_id in enumerate(started):
        states = [d.wire_state for d in callbacks.deliveries(execution_id)]
        assert states == (["DELIVERED", "FAILED"] if i % 2 == 0 else ["DELIVERED"])

    # The failed-callbacks list merges every shard's, latest first, page by page.
    failed_ids: list[str] = []
    cursor = None
    while True:
        page, cursor = callbacks.failed_page(limit=1, cursor=cursor)
        failed_ids += [d.delivery_id for d in page]
        if cursor is None:
            break
    assert len(failed_ids) == len(set(failed_ids)) == (len(started) + 1) // 2
    assert {i[:3] for i in failed_ids} == {"s0-", "s1-", "s2-"}  # one failing run on each shard

    # One redrive over the admin API (routed by the delivery id), then every other one in bulk.
    first = next(i for i in failed_ids if not i.startswith("s0-"))
    owner = callbacks.store.get(first)
    assert owner is not None
    base = f"/api/harvest/workflows/{owner.execution_id}/completion-deliveries"
    response = app.test_client().post(f"{base}/{first}/redrive", json={}, headers=AUTH)
    assert (response.status_code, response.get_json()) == (200, {"outcome": "redriven"})
    redriven = callbacks.redrive_failed(0)
    assert sorted(d.delivery_id for d in redriven) == sorted(set(failed_ids) - {first})

    def all_delivered() -> bool:
        rows = [s for url in pg_shards for _, s in _delivery_rows(url).values()]
        return len(rows) == expected and set(rows) == {"DELIVERED"}

    _wait(all_delivered, "every redriven delivery to be delivered")
    assert callbacks.store.count_states(cap=1000)[DeliveryState.DELIVERED] == expected


def test_the_scrape_sums_every_shard(pg_shards: list[str], receiver: CapturingReceiver) -> None:
    app = _app(pg_shards, HARVEST_METRICS=True)
    keys = _keys_on_every_shard(3, "m")
    with app.app_context():
        service = workflow_service()
        ids = [
            service.start(
                "echo" if i % 3 else "boom",
                i,
                workflow_id=key,
                completion_callbacks=[{"url": receiver.url()}],
            )[0].execution_id
            for i, key in enumerate(keys)
        ]
    for execution_id in ids:
        wait_for(app, execution_id, lambda state, steps: state in (S.COMPLETED, S.FAILED))
    failed = sum(1 for i in range(len(keys)) if i % 3 == 0)

    def scrape() -> dict[Any, float] | None:
        response = app.test_client().get("/actuator/webhooks/metrics", headers=AUTH)
        assert response.status_code == 200, response.get_data(as_text=True)
        samples = parse(response.get_data(as_text=True))
        delivered = value(
            samples, "harvest_completion_callback_deliveries", state=DeliveryState.DELIVERED.value
        )
        return samples if delivered == len(keys) else None

    samples = _wait(scrape, "every callback to be counted as delivered")
    assert value(samples, "harvest_metrics_store_up") == 1.0
    assert (
        value(samples, "harvest_workflow_executions", workflow="echo", state="completed")
        == len(keys) - failed
    )
    assert value(samples, "harvest_workflow_executions", workflow="boom", state="failed") == failed
    assert value(samples, "harvest_completion_callback_deliveries", state=DeliveryState.PENDING.value) == 0

    # Bounded as before: each series stops at the count limit, summed over the shards.
    capped = _app(pg_shards, HARVEST_METRICS=True, HARVEST_METRICS_COUNT_LIMIT=2)
    response = capped.test_client().get("/actuator/webhooks/metrics", headers=AUTH)
    samples = parse(response.get_data(as_text=True))
    assert value(samples, "harvest_workflow_executions", workflow="echo", state="completed") == 2
    assert value(samples, "harvest_completion_callback_deliveries", state=DeliveryState.DELIVERED.value) == 2
