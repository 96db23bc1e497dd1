"""Prometheus metrics: gauges read from the store at scrape time, counters and histograms fed by
the signals.

Opt-in: ``HARVEST_METRICS = True`` and the ``metrics`` extra (``prometheus_client``). Only the
extension imports this module, and only when metrics are on, so flask-harvest runs without
``prometheus_client`` otherwise.

Two kinds of metrics, for two questions:

* **How much is where now** (deliveries and callback deliveries by state, executions by workflow
  and state, trigger fires by outcome, the DLQ, the queue lag, the live workers): read from the
  database (and RQ's worker registry) when a scrape asks, by :mod:`flask_harvest._metrics_store`,
  with bounded, indexed queries. They are right in any process's scrape, whatever process did the
  work, with no shared directory.
* **How fast things happen** (attempts, finished deliveries, finished runs, their durations): the
  counters and histograms below, in ``prometheus_client``'s default registry, fed by
  :mod:`flask_harvest.signals` (one receiver per app and signal), never from the delivery or
  workflow code itself. A process counts in its own memory: with ``PROMETHEUS_MULTIPROC_DIR`` set
  in the environment of every process of a host before it starts, each process writes its counts
  to files there and the scrape route adds them all up (forks and gunicorn's workers included);
  ``flask harvest worker --metrics-port`` gives a worker host a scrape target of its own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import prometheus_client
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
from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from . import signals
from ._app import METRICS_KEY, get_engine
from ._metrics_store import StoreCollector, label
from ._time import utcnow
from .config import KEYS
from .errors import ConfigurationError, HarvestError
from .http.admin import authorize_admin
from .triggers.firing import FireOutcome
from .webhooks.models import DeliveryAttempt, DeliveryLog
from .workflows.models import Execution, ExecutionState

log = logging.getLogger(__name__)

__all__ = [
    "ATTEMPT_DURATION",
    "CALLBACKS_FINISHED",
    "CALLBACK_ATTEMPTS",
    "DELIVERIES_FINISHED",
    "DELIVERY_ATTEMPTS",
    "DELIVERY_LATENCY",
    "RATE_LIMIT_WAIT",
    "SUBSCRIPTIONS_TURNED_OFF",
    "TRIGGER_FIRES",
    "TRIGGER_SKIPPED",
    "WORKFLOWS_FINISHED",
    "WORKFLOW_DURATION",
    "MetricsExposition",
    "install",
]

# A `_created` series beside every counter and histogram doubles what Prometheus stores for a
# timestamp nobody queries (and multiprocess mode never had it): off for the whole process.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

#: The environment variable of ``prometheus_client``'s multiprocess mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: The ``workflow`` label of an execution whose name this process has not registered: labels come
#: from registrations only, so the series stay bounded whatever the table holds.
UNREGISTERED_WORKFLOW = "_unregistered"
#: The realm of the scrape route's ``WWW-Authenticate`` answer.
REALM = "harvest-metrics"
#: How many trigger ids this process keeps the readable name of (one per registered trigger).
_TRIGGER_NAMES_KEPT = 1_000

#: The outcomes of a webhook delivery attempt: one per delivery signal that follows a request.
ATTEMPT_OUTCOMES = ("delivered", "failed", "dead_lettered")
#: How a webhook delivery ends: what a finished delivery counts.
FINISH_OUTCOMES = ("delivered", "dead_lettered", "skipped")
#: The outcomes of a completion-callback attempt.
CALLBACK_ATTEMPT_OUTCOMES = ("delivered", "failed", "dead_lettered")
#: How a completion-callback delivery ends.
CALLBACK_FINISH_OUTCOMES = ("delivered", "dead_lettered")

#: Buckets of durations that may be short or take hours (retries back off up to hours).
_LONG_BUCKETS = (
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    14400.0,
    86400.0,
)

DELIVERY_ATTEMPTS = Counter(
    "harvest_webhook_delivery_attempts",
    "Webhook delivery attempts by outcome: delivered (2xx), failed (will retry), dead_lettered.",
    ["outcome"],
)
DELIVERIES_FINISHED = Counter(
    "harvest_webhook_deliveries_finished",
    "Webhook deliveries that ended, by outcome: delivered, dead_lettered, skipped (not sent).",
    ["outcome"],
)
ATTEMPT_DURATION = Histogram(
    "harvest_webhook_attempt_duration_seconds",
    "Duration of webhook delivery attempts that made a request, from connect to the last byte.",
    # Up to the default HARVEST_WEBHOOKS_DEADLINE_SECONDS (30 s), past which an attempt is cut.
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
DELIVERY_LATENCY = Histogram(
    "harvest_webhook_delivery_latency_seconds",
    "From a webhook delivery's dispatch to its 2xx answer, retries included.",
    buckets=_LONG_BUCKETS,
)
CALLBACK_ATTEMPTS = Counter(
    "harvest_completion_callback_delivery_attempts",
    "Completion-callback attempts by outcome: delivered, failed (will retry), dead_lettered.",
    ["outcome"],
)
CALLBACKS_FINISHED = Counter(
    "harvest_completion_callback_deliveries_finished",
    "Completion-callback deliveries that ended, by outcome: delivered, dead_lettered.",
    ["outcome"],
)
SUBSCRIPTIONS_TURNED_OFF = Counter(
    "harvest_webhook_subscriptions_turned_off",
    "Webhook subscriptions turned off automatically, by status: disabled (410 Gone), failed "
    "(too many consecutive failures).",
    ["status"],
)
WORKFLOWS_FINISHED = Counter(
    "harvest_workflow_executions_finished",
    "Workflow executions that closed, by workflow name and state (lower snake case).",
    ["workflow", "state"],
)
WORKFLOW_DURATION = Histogram(
    "harvest_workflow_duration_seconds",
    "From a workflow execution's creation to its end, by workflow name and outcome.",
    ["workflow", "outcome"],
    buckets=_LONG_BUCKETS,
)
TRIGGER_FIRES = Counter(
    "harvest_completion_trigger_fires",
    "Completion-trigger evaluations by outcome (the counter harvest.completion_trigger.fires).",
    ["outcome"],
)
RATE_LIMIT_WAIT = Histogram(
    "harvest_webhook_rate_limit_wait_seconds",
    "How long webhook deliveries were held back by their subscription's rate limit, each time "
    "one had to wait for its turn (the sum: seconds held back; the count: times held).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)
TRIGGER_SKIPPED = Counter(
    "harvest_completion_trigger_skipped",
    "Completion triggers skipped by their guard, by trigger (source->target) and reason "
    "(condition_unmet, condition_invalid: a lost fire to start by hand).",
    ["trigger", "reason"],
)

# Every fixed label value exists from the start, at 0: rate() and absent-series alerts need it.
for _outcome in ATTEMPT_OUTCOMES:
    DELIVERY_ATTEMPTS.labels(outcome=_outcome)
for _outcome in FINISH_OUTCOMES:
    DELIVERIES_FINISHED.labels(outcome=_outcome)
for _status in ("disabled", "failed"):
    SUBSCRIPTIONS_TURNED_OFF.labels(status=_status)
for _outcome in CALLBACK_ATTEMPT_OUTCOMES:
    CALLBACK_ATTEMPTS.labels(outcome=_outcome)
for _outcome in CALLBACK_FINISH_OUTCOMES:
    CALLBACKS_FINISHED.labels(outcome=_outcome)
for _fire in FireOutcome:
    TRIGGER_FIRES.labels(outcome=_fire.value)

Receiver = Callable[..., None]


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
            # The gauges read from the store are right anyway; only the rates need the directory.
            log.warning(
                "harvest: %s is on but %s is not set: the counters and histograms of this app's "
                "scrape count this process only, not what `flask harvest worker` processes do "
                "(the gauges read from the store count every process; see the metrics docs)",
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
    multiprocess directory) and the gauges read from its store, in one registry."""

    def __init__(self, app: Flask, multiprocess: CollectorRegistry | None) -> None:
        self.registry = multiprocess if multiprocess is not None else CollectorRegistry(auto_describe=False)
        if multiprocess is None:
            self.registry.register(_Forward(REGISTRY))
        self.registry.register(StoreCollector(app))

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
        (signals.delivery_rate_limited, _rate_limited),
        (signals.subscription_disabled, _turned_off("disabled")),
        (signals.subscription_failed, _turned_off("failed")),
        (signals.workflow_finished, _workflow_finished),
        (signals.completion_callback_delivered, _callback("delivered")),
        (signals.completion_callback_failed, _callback("failed")),
        (signals.completion_callback_dead_lettered, _callback("dead_lettered")),
        (signals.completion_trigger_fired, _trigger_fired),
        (signals.completion_trigger_skipped, _trigger_skipper(app)),
    ]
    for signal, receiver in receivers:
        # weak=False: the receivers are closures nobody else holds; blinker drops them with the app.
        signal.connect(receiver, sender=app, weak=False)


def _delivery(outcome: str) -> Receiver:
    # A skip makes no request: it finishes the delivery without an attempt.
    attempts = DELIVERY_ATTEMPTS.labels(outcome=outcome) if outcome in ATTEMPT_OUTCOMES else None
    finished = DELIVERIES_FINISHED.labels(outcome=outcome) if outcome in FINISH_OUTCOMES else None

    def receiver(
        app: Flask,
        *,
        delivery: DeliveryLog | None = None,
        attempt: DeliveryAttempt | None = None,
        **extra: Any,
    ) -> None:
        # An attempt is counted where one was recorded: a delivery dead-lettered without a
        # request (its attempt limit was lowered, its subscription went away) only finishes.
        if attempts is not None and attempt is not None:
            attempts.inc()
        if finished is not None:
            finished.inc()
        if attempt is not None and attempt.elapsed_ms is not None:
            ATTEMPT_DURATION.observe(attempt.elapsed_ms / 1000.0)
        if outcome == "delivered" and delivery is not None:
            DELIVERY_LATENCY.observe(_seconds_since(delivery.created_at))

    return receiver


def _rate_limited(app: Flask, *, seconds: float, **extra: Any) -> None:
    RATE_LIMIT_WAIT.observe(seconds)


def _turned_off(status: str) -> Receiver:
    counter = SUBSCRIPTIONS_TURNED_OFF.labels(status=status)

    def receiver(app: Flask, **extra: Any) -> None:
        counter.inc()

    return receiver


def _seconds_since(start: datetime | None, end: datetime | None = None) -> float:
    if start is None:
        return 0.0
    return max(0.0, ((end or utcnow()) - start).total_seconds())


def _workflow_finished(app: Flask, *, execution: Execution, **extra: Any) -> None:
    service = get_engine(app).workflows
    known = service is not None and execution.workflow_name in service.registry
    name = execution.workflow_name if known else UNREGISTERED_WORKFLOW
    state = ExecutionState(execution.state)
    WORKFLOWS_FINISHED.labels(workflow=name, state=label(state.value)).inc()
    # A run that continued as new has not ended: its chain's last run observes the outcome.
    if state.outcome:
        WORKFLOW_DURATION.labels(workflow=name, outcome=label(state.value)).observe(
            _seconds_since(execution.created_at, execution.completed_at)
        )


def _callback(outcome: str) -> Receiver:
    attempts = CALLBACK_ATTEMPTS.labels(outcome=outcome)
    finished = CALLBACKS_FINISHED.labels(outcome=outcome) if outcome in CALLBACK_FINISH_OUTCOMES else None

    def receiver(app: Flask, **extra: Any) -> None:
        attempts.inc()
        if finished is not None:
            finished.inc()

    return receiver


def _trigger_fired(app: Flask, *, outcome: str, **extra: Any) -> None:
    TRIGGER_FIRES.labels(outcome=FireOutcome(outcome).value).inc()


def _trigger_skipper(app: Flask) -> Receiver:
    names: dict[str, str] = {}

    def receiver(app: Flask, *, trigger_id: str, reason: str, **extra: Any) -> None:
        name = names.get(trigger_id)
        if name is None:
            name = trigger_name(app, trigger_id)
            # A trigger read as its id (gone, or the store failed) is asked again next time.
            if name != trigger_id and len(names) < _TRIGGER_NAMES_KEPT:
                names[trigger_id] = name
        TRIGGER_SKIPPED.labels(trigger=name, reason=reason).inc()

    return receiver


def trigger_name(app: Flask, trigger_id: str) -> str:
    """The ``trigger`` label of a trigger: ``source->target`` (its workflows' names), or its id
    when the trigger is gone or the store cannot say."""
    triggers = get_engine(app).triggers
    try:
        stored = triggers.store.get(trigger_id) if triggers is not None else None
    except HarvestError as exc:
        log.warning("harvest: could not read trigger %s for its metrics label: %s", trigger_id, exc)
        return trigger_id
    if stored is None:
        return trigger_id
    return f"{stored.source_workflow_name}->{stored.target_workflow_name}"
