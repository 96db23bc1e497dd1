"""Prometheus metrics: counters fed by the signals, gauges read from the store at scrape time.

Opt-in: ``HARVEST_METRICS = True`` and the ``metrics`` extra (``prometheus_client``). Only the
extension imports this module, and only when metrics are on, so flask-harvest runs without
``prometheus_client`` otherwise.

Counters and the histogram live in ``prometheus_client``'s default registry and are fed by
:mod:`flask_harvest.signals` (one receiver per app and signal), never from the delivery or workflow
code itself. The DLQ size and queue lag are not counted as deliveries move: they are read from the
store when a scrape asks (:meth:`~flask_harvest.webhooks.stores.base.OutboundWebhookHandler.queue_gauges`,
two bounded, indexed queries), so they are right whatever process moved the rows.

Worker processes (``flask harvest worker``, gunicorn's workers, RQ's forks) count in their own
memory. We use ``prometheus_client``'s multiprocess mode rather than a port per worker: with
``PROMETHEUS_MULTIPROC_DIR`` set in the environment of every process of a host before it starts,
each process writes its counts to files in that directory and the scrape route adds them up. One
scrape target per host sees every process, forks included (a port per process would lose what a
fork counted when it exits, and could not serve gunicorn's several web workers on one port).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from flask import Flask, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from . import signals
from ._app import METRICS_KEY, get_engine
from ._time import utcnow
from .config import KEYS
from .errors import ConfigurationError, HarvestError
from .http.admin import authorize_admin
from .triggers.firing import FireOutcome
from .webhooks.models import DeliveryAttempt
from .workflows.models import Execution, ExecutionState

log = logging.getLogger(__name__)

__all__ = [
    "ATTEMPT_DURATION",
    "CALLBACK_DELIVERIES",
    "DELIVERIES",
    "DLQ_COUNT_LIMIT",
    "TRIGGER_FIRES",
    "TRIGGER_SKIPPED",
    "WORKFLOW_EXECUTIONS",
    "MetricsExposition",
    "install",
]

#: The environment variable of ``prometheus_client``'s multiprocess mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: The DLQ gauge counts at most this many rows, so a scrape's cost stays bounded when a broken
#: receiver fills the DLQ; past it the gauge stays at the limit (alert long before).
DLQ_COUNT_LIMIT = 100_000
#: The ``workflow`` label of an execution whose name this process has not registered: labels come
#: from registrations only, so the series stay bounded whatever the table holds.
UNREGISTERED_WORKFLOW = "_unregistered"
#: The realm of the scrape route's ``WWW-Authenticate`` answer.
REALM = "harvest-metrics"

#: Webhook delivery outcomes: one per delivery signal.
DELIVERY_OUTCOMES = ("delivered", "failed", "dead_lettered", "skipped")
#: Completion-callback outcomes: one per callback signal.
CALLBACK_OUTCOMES = ("delivered", "failed", "dead_lettered")

DELIVERIES = Counter(
    "harvest_webhook_deliveries",
    "Webhook delivery attempts by outcome: delivered (2xx), failed (will retry), dead_lettered, skipped.",
    ["outcome"],
)
ATTEMPT_DURATION = Histogram(
    "harvest_webhook_attempt_duration_seconds",
    "Duration of webhook delivery attempts that made a request, from connect to the last byte.",
    # Up to the default HARVEST_WEBHOOKS_DEADLINE_SECONDS (30 s), past which an attempt is cut.
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
WORKFLOW_EXECUTIONS = Counter(
    "harvest_workflow_executions",
    "Workflow executions that reached a terminal state, by workflow name and state.",
    ["workflow", "state"],
)
CALLBACK_DELIVERIES = Counter(
    "harvest_completion_callback_deliveries",
    "Completion-callback attempts by outcome: delivered, failed (will retry), dead_lettered.",
    ["outcome"],
)
TRIGGER_FIRES = Counter(
    "harvest_completion_trigger_fires",
    "Completion-trigger evaluations by outcome (the counter harvest.completion_trigger.fires).",
    ["outcome"],
)
TRIGGER_SKIPPED = Counter(
    "harvest_completion_trigger_skipped",
    "Completion triggers skipped by their guard, by trigger id and reason (condition_unmet, "
    "condition_invalid: a lost fire to start by hand).",
    ["trigger", "reason"],
)

# Every fixed label value exists from the start, at 0: rate() and absent-series alerts need it.
for _outcome in DELIVERY_OUTCOMES:
    DELIVERIES.labels(outcome=_outcome)
for _outcome in CALLBACK_OUTCOMES:
    CALLBACK_DELIVERIES.labels(outcome=_outcome)
for _fire in FireOutcome:
    TRIGGER_FIRES.labels(outcome=_fire.value)

Receiver = Callable[..., None]


class QueueCollector(Collector):
    """The DLQ size and queue lag of one app's store, read when a scrape asks."""

    def __init__(self, app: Flask) -> None:
        self._app = app

    def describe(self) -> list[Metric]:
        return []  # registering must not query the store

    def collect(self) -> Iterator[Metric]:
        now = utcnow()
        up = 1.0
        try:
            dlq, due_at = get_engine(self._app).store.queue_gauges(now=now, dlq_limit=DLQ_COUNT_LIMIT)
        except HarvestError as exc:
            # A scrape must still answer (and say the store is unreachable) when the database is down.
            log.warning("harvest: could not read the queue gauges: %s", exc)
            up, dlq, due_at = 0.0, 0, None
        lag = max(0.0, (now - due_at).total_seconds()) if due_at is not None else 0.0
        yield GaugeMetricFamily(
            "harvest_webhook_dlq_size",
            f"Dead-lettered webhook deliveries in the store (counted up to {DLQ_COUNT_LIMIT}).",
            value=dlq,
        )
        yield GaugeMetricFamily(
            "harvest_webhook_queue_lag_seconds",
            "How long the longest-waiting due webhook delivery has been due (0 when none waits).",
            value=lag,
        )
        yield GaugeMetricFamily(
            "harvest_metrics_store_up",
            "1 if the last scrape read the queue gauges from the store, 0 if the store failed.",
            value=up,
        )


def install(app: Flask) -> None:
    """Count ``app``'s signals and serve the metrics at ``HARVEST_METRICS_PATH``.

    :raises ConfigurationError: ``PROMETHEUS_MULTIPROC_DIR`` names no directory.
    """
    engine = get_engine(app)
    settings = engine.settings
    directory = os.environ.get(MULTIPROC_ENV)
    if directory:
        if not os.path.isdir(directory):
            raise ConfigurationError(
                f"{MULTIPROC_ENV} is {directory!r}, which is not a directory: create it (empty) "
                "before the app's processes start, or unset it"
            )
        # Every process of the host writes its counts there; this scrape adds them all up.
        counters = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(counters, path=directory)  # type: ignore[no-untyped-call]
    else:
        counters = None
        if settings.jobs_backend == "rq":
            log.warning(
                "harvest: %s is on but %s is not set: what `flask harvest worker` processes count "
                "is not visible to this app's scrape (see the metrics docs)",
                KEYS["metrics"],
                MULTIPROC_ENV,
            )
    exposition = MetricsExposition(app, counters)
    app.extensions[METRICS_KEY] = exposition
    _connect(app)

    def scrape() -> Response | tuple[Response, int]:
        if not settings.metrics_unauthenticated:
            refusal = authorize_admin(REALM)
            if refusal is not None:
                return refusal
        return Response(
            exposition.render(), content_type=CONTENT_TYPE_LATEST, headers={"Cache-Control": "no-store"}
        )

    app.add_url_rule(settings.metrics_route, endpoint="harvest_metrics", view_func=scrape, methods=["GET"])


class MetricsExposition:
    """What one app's scrape shows: the counters (this process's, or every process's of the
    multiprocess directory) and the queue gauges of its store, in one registry."""

    def __init__(self, app: Flask, multiprocess: CollectorRegistry | None) -> None:
        self.registry = multiprocess if multiprocess is not None else CollectorRegistry(auto_describe=False)
        if multiprocess is None:
            self.registry.register(_Forward(REGISTRY))
        self.registry.register(QueueCollector(app))

    def render(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.registry)

    def serve(self, port: int, address: str) -> None:
        """Serve :meth:`render` on ``address:port`` from a daemon thread, unauthenticated (a worker's
        own scrape target: ``flask harvest worker --metrics-port``)."""
        start_http_server(port, addr=address, registry=self.registry)


class _Forward(Collector):
    """Everything another registry collects (the default one, where the counters live)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._registry.collect()


def _connect(app: Flask) -> None:
    """Connect one receiver per signal, for ``app`` as sender only (other apps count nothing here)."""
    receivers: list[tuple[Any, Receiver]] = [
        (signals.delivery_succeeded, _delivery("delivered")),
        (signals.delivery_failed, _delivery("failed")),
        (signals.delivery_dead_lettered, _delivery("dead_lettered")),
        (signals.delivery_skipped, _delivery("skipped")),
        (signals.workflow_finished, _workflow_finished),
        (signals.completion_callback_delivered, _callback("delivered")),
        (signals.completion_callback_failed, _callback("failed")),
        (signals.completion_callback_dead_lettered, _callback("dead_lettered")),
        (signals.completion_trigger_fired, _trigger_fired),
        (signals.completion_trigger_skipped, _trigger_skipped),
    ]
    for signal, receiver in receivers:
        # weak=False: the receivers are closures nobody else holds; blinker drops them with the app.
        signal.connect(receiver, sender=app, weak=False)


def _delivery(outcome: str) -> Receiver:
    counter = DELIVERIES.labels(outcome=outcome)

    def receiver(app: Flask, *, attempt: DeliveryAttempt | None = None, **extra: Any) -> None:
        counter.inc()
        if attempt is not None and attempt.elapsed_ms is not None:
            ATTEMPT_DURATION.observe(attempt.elapsed_ms / 1000.0)

    return receiver


def _workflow_finished(app: Flask, *, execution: Execution, **extra: Any) -> None:
    service = get_engine(app).workflows
    known = service is not None and execution.workflow_name in service.registry
    state = ExecutionState(execution.state).value
    WORKFLOW_EXECUTIONS.labels(
        workflow=execution.workflow_name if known else UNREGISTERED_WORKFLOW, state=state
    ).inc()


def _callback(outcome: str) -> Receiver:
    counter = CALLBACK_DELIVERIES.labels(outcome=outcome)

    def receiver(app: Flask, **extra: Any) -> None:
        counter.inc()

    return receiver


def _trigger_fired(app: Flask, *, outcome: str, **extra: Any) -> None:
    TRIGGER_FIRES.labels(outcome=FireOutcome(outcome).value).inc()


def _trigger_skipped(app: Flask, *, trigger_id: str, reason: str, **extra: Any) -> None:
    # Trigger ids are chosen by whoever registers triggers: as many series as registered triggers.
    TRIGGER_SKIPPED.labels(trigger=trigger_id, reason=reason).inc()
