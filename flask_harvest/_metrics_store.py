"""The metrics read from the store (and from RQ's worker registry) when a scrape asks.

What these gauges show is right whatever process did the work: a delivery a worker made, a run a
worker ended, a trigger another host fired are rows in the database, and the web app's scrape
counts the rows. Every read is bounded: counts stop at ``HARVEST_METRICS_COUNT_LIMIT`` rows of
each series, each a walk of an index that leads with the counted columns, so a scrape costs the
same at a million rows (``bench`` measures it). Only :mod:`flask_harvest.metrics` imports this module.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

from flask import Flask
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ._app import get_engine
from ._time import utcnow
from .engine import HarvestEngine
from .errors import HarvestError
from .outbound.attempt import DeliveryState
from .workflows.models import ExecutionState

log = logging.getLogger(__name__)

__all__ = ["FIRE_OUTCOMES", "WORKER_LIMIT", "StoreCollector", "label"]

#: At most this many worker entries of a queue are read from RQ's registry.
WORKER_LIMIT = 1_000
#: The ledger's ``outcome`` column (``None``: fired) to the ``outcome`` label, which uses the
#: words of ``harvest_completion_trigger_fires_total``.
FIRE_OUTCOMES: dict[str | None, str] = {
    None: "started",
    "condition_unmet": "skipped",
    "chain_depth_exceeded": "chain_depth_exceeded",
    "validation_failed": "validation_failed",
    "payload_too_large": "payload_too_large",
}

_WORD = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def label(value: str) -> str:
    """A state's value as a label value: lower snake case (``TimedOut`` → ``timed_out``)."""
    return _WORD.sub("_", value).lower()


class StoreCollector(Collector):
    """The gauges of one app's store and workers, read when a scrape asks."""

    def __init__(self, app: Flask) -> None:
        self._app = app

    def describe(self) -> list[Metric]:
        return []  # registering must not query the store

    def collect(self) -> Iterator[Metric]:
        engine = get_engine(self._app)
        up = True
        for read in (_deliveries, _subscriptions, _callbacks, _executions, _fires):
            try:
                yield from read(engine)
            except HarvestError as exc:
                # A scrape must still answer (and say the store failed) when the database is down;
                # the families it could not read are left out rather than shown as zeros.
                log.warning("harvest: a metrics read of the store failed: %s", exc)
                up = False
        yield GaugeMetricFamily(
            "harvest_metrics_store_up",
            "1 if the last scrape read every gauge from the store, 0 if a read failed.",
            value=1.0 if up else 0.0,
        )
        yield from _workers(engine)


def _deliveries(engine: HarvestEngine) -> Iterator[Metric]:
    limit = engine.settings.metrics_count_limit
    counts = engine.store.count_states(cap=limit)
    family = GaugeMetricFamily(
        "harvest_webhook_deliveries",
        f"Webhook deliveries in the store by state (each counted up to {limit}).",
        labels=["state"],
    )
    for state in DeliveryState:
        family.add_metric([state.value], counts.get(state, 0))
    yield family
    # The DLQ size is the dlq state's count above: queue_gauges is asked for the due time only
    # (its own DLQ count then stops at one row instead of walking the DLQ a second time).
    now = utcnow()
    _, due_at = engine.store.queue_gauges(now=now, dlq_limit=1)
    lag = max(0.0, (now - due_at).total_seconds()) if due_at is not None else 0.0
    yield GaugeMetricFamily(
        "harvest_webhook_dlq_size",
        f"Dead-lettered webhook deliveries in the store (counted up to {limit}).",
        value=counts.get(DeliveryState.DLQ, 0),
    )
    yield GaugeMetricFamily(
        "harvest_webhook_queue_lag_seconds",
        "How long the longest-waiting due webhook delivery has been due (0 when none waits).",
        value=lag,
    )


def _subscriptions(engine: HarvestEngine) -> Iterator[Metric]:
    counts = engine.store.count_subscription_states(cap=engine.settings.metrics_count_limit)
    family = GaugeMetricFamily(
        "harvest_webhook_subscriptions",
        "Webhook subscriptions by status: active, disabled (by hand or a 410 answer), failed "
        "(turned off after too many consecutive failures).",
        labels=["status"],
    )
    for status, count in counts.items():
        family.add_metric([status.value], count)
    yield family


def _callbacks(engine: HarvestEngine) -> Iterator[Metric]:
    if engine.callbacks is None:
        return
    limit = engine.settings.metrics_count_limit
    counts = engine.callbacks.store.count_states(cap=limit)
    family = GaugeMetricFamily(
        "harvest_completion_callback_deliveries",
        f"Completion-callback deliveries in the store by state (each counted up to {limit}).",
        labels=["state"],
    )
    for state, count in counts.items():
        family.add_metric([state.value], count)
    yield family


def _executions(engine: HarvestEngine) -> Iterator[Metric]:
    service = engine.workflows
    if service is None:
        return
    # Registered names only: the series stay bounded whatever names the table holds.
    limit = engine.settings.metrics_count_limit
    counts = service.store.count_by_workflow(service.registry.names(), cap=limit)
    family = GaugeMetricFamily(
        "harvest_workflow_executions",
        f"Workflow executions in the store by workflow and state (each counted up to {limit}).",
        labels=["workflow", "state"],
    )
    for (name, state), count in counts.items():
        family.add_metric([name, label(ExecutionState(state).value)], count)
    yield family


def _fires(engine: HarvestEngine) -> Iterator[Metric]:
    if engine.triggers is None:
        return
    outcomes = list(FIRE_OUTCOMES)
    limit = engine.settings.metrics_count_limit
    counts = engine.triggers.store.count_outcomes(outcomes, cap=limit)
    family = GaugeMetricFamily(
        "harvest_completion_trigger_fires_recorded",
        f"Completion-trigger fires recorded in the store's ledger by outcome (each counted up to {limit}).",
        labels=["outcome"],
    )
    for outcome, count in zip(outcomes, counts, strict=True):
        family.add_metric([FIRE_OUTCOMES[outcome]], count)
    yield family
    yield GaugeMetricFamily(
        "harvest_completion_trigger_outbox",
        "Cross-shard completion-trigger target starts waiting in the outbox, on every shard "
        f"(counted up to {limit}).",
        value=engine.triggers.store.count_outbox(cap=limit),
    )


def _workers(engine: HarvestEngine) -> Iterator[Metric]:
    try:
        counts = engine.backend.live_workers(limit=WORKER_LIMIT)
    except HarvestError as exc:
        # Redis is down: no worker can take a job, which is what the gauge tells.
        log.warning("harvest: could not read the workers from the job backend: %s", exc)
        counts = {engine.settings.webhooks_queue: 0}
    if counts is None:
        return  # jobs run in the web process itself: there are no worker processes to count
    family = GaugeMetricFamily(
        "harvest_workers",
        f"Worker processes alive on each job queue (from RQ's worker registry, up to {WORKER_LIMIT}).",
        labels=["queue"],
    )
    for queue, count in sorted(counts.items()):
        family.add_metric([queue], count)
    yield family
