"""The bounded counts behind the dashboard lists' totals ("1-50 of 1,000+"): each counts exactly
what its listing lists with the same filters, up to the cap; on every store kind."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from flask import Flask

from flask_harvest import DeliveryLog, DeliveryState, InvalidFieldError, OutboundWebhookHandler, get_engine
from flask_harvest.testing import CapturingReceiver
from flask_harvest.workflows.models import ExecutionState

from .dashboard_client import dashboard_app
from .test_actuator import T0
from .test_dashboard_failed_callbacks import failed_runs
from .test_dashboard_workflows import finished, start, workflow_dashboard_app
from .workflow_app import database_url_fixture

__all__ = ["database_url_fixture"]

STATES = [DeliveryState.DLQ, DeliveryState.DELIVERED, DeliveryState.PENDING]


def log_mixed(store: OutboundWebhookHandler, count: int) -> None:
    """``count`` deliveries one minute apart over three states, two subscriptions and two topics."""
    store.log_deliveries(
        [
            DeliveryLog(
                id=f"msg_{n:03d}",
                subscription_id=f"sub_{n % 2}",
                topic=f"t.{n % 3 == 0}",
                payload=json.dumps({"n": n}),
                state=STATES[n % 3],
                attempt=1,
                timestamp=T0 + timedelta(minutes=n),
                next_attempt_at=T0 if STATES[n % 3] is DeliveryState.PENDING else None,
            )
            for n in range(count)
        ]
    )


FILTERS: list[dict[str, Any]] = [
    {},
    {"state": DeliveryState.DLQ},
    {"subscription_id": "sub_1"},
    {"topic": "t.True"},
    {"since": T0 + timedelta(minutes=10), "until": T0 + timedelta(minutes=25)},
    {"state": DeliveryState.DELIVERED, "subscription_id": "sub_0", "topic": "t.False"},
    {"subscription_id": "sub_none"},
    {"topic": "bad\x00topic"},
]


@pytest.mark.parametrize("filters", FILTERS)
def test_delivery_counts_are_the_listing_up_to_the_cap(
    store: OutboundWebhookHandler, filters: dict[str, Any]
) -> None:
    log_mixed(store, 40)
    listed = len(store.list_delivery_summaries(limit=500, **filters))
    for cap in (0, 1, 3, listed, listed + 1, 1000):
        assert store.count_deliveries(cap=cap, **filters) == min(cap, listed), cap


def test_the_operations_count_checks_as_the_listing(store: OutboundWebhookHandler) -> None:
    log_mixed(store, 12)
    app = dashboard_app(store)
    with app.app_context():
        operations = get_engine().operations
        assert operations.count_deliveries(state=DeliveryState.PENDING) == 4
        assert operations.count_deliveries(cap=2) == 2
        with pytest.raises(InvalidFieldError, match="since"):
            operations.count_deliveries(since=T0, until=T0)
        with pytest.raises(InvalidFieldError, match="topic"):
            operations.count_deliveries(topic="a\ud800")


def test_execution_counts_are_the_listing_up_to_the_cap(database_url: str) -> None:
    app = workflow_dashboard_app(database_url)
    runs = [start(app, "echo", n) for n in range(3)] + [start(app, "boom", n) for n in range(2)]
    for execution_id in runs:
        finished(app, execution_id)
    with app.app_context():
        service = get_engine().workflows
        assert service is not None
        pairs: list[tuple[str | None, Any]] = [
            (None, None), ("echo", None), (None, "Failed"), ("boom", "Failed"), ("echo", "Failed"),
            ("nothing", None), (None, ExecutionState.COMPLETED),
        ]  # fmt: skip
        for name, state in pairs:
            listed = len(service.list_executions(name=name, state=state, limit=500)[0])
            for cap in (0, 1, listed, 1000):
                assert service.count_executions(name=name, state=state, cap=cap) == min(cap, listed), (
                    name,
                    state,
                )
        assert service.count_executions(cap=1000) == 5
        with pytest.raises(InvalidFieldError, match="state"):
            service.count_executions(state="Finished")


def test_failed_callback_counts_are_the_listing_up_to_the_cap(
    database_url: str, receiver: CapturingReceiver
) -> None:
    app: Flask = workflow_dashboard_app(database_url)
    failed_runs(app, receiver, 3)
    with app.app_context():
        callbacks = get_engine().callbacks
        assert callbacks is not None
        assert len(callbacks.failed_page(limit=500)[0]) == callbacks.count_failed() == 3
        assert [callbacks.count_failed(cap=cap) for cap in (0, 2, 3, 4)] == [0, 2, 3, 3]
