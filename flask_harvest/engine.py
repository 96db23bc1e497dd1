"""The engine: store, job backend, transport, runners, manager and sweeper, wired without Flask.

:func:`build_engine` is the one place that assembles them; the Flask extension
(:class:`~flask_harvest.extension.Harvest`) only reads the configuration, calls
it and registers the result on an app. Scripts, tests and other frameworks can call it directly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import redis
import sqlalchemy as sa
from sqlalchemy.pool import QueuePool

from ._sql import new_pool_in_each_child
from .callbacks.service import CALLBACK_JOB, CompletionCallbacks
from .callbacks.sharded import ShardedCallbackStore
from .callbacks.store import SqlCallbackStore
from .config import KEYS, Settings
from .errors import ConfigurationError
from .jobs.base import JobBackend, JobKinds, JobRef
from .jobs.local import LocalBackend
from .jobs.rq import RqBackend, job_timeout_for
from .outbound.hold_episodes import HoldEpisodes, LocalHoldEpisodes, RedisHoldEpisodes
from .outbound.limiters import LocalRateLimiter, RateLimiter, RedisRateLimiter
from .outbound.transport import Transport
from .sweeper import Sweeper, SweepReport
from .triggers.firing import FireListener, TriggerFiring
from .triggers.outbox import TriggerOutbox
from .triggers.service import TriggerService
from .triggers.sharded import ShardedTriggerStore
from .triggers.store import SqlTriggerStore
from .webhooks import sweeper as webhook_sweeps
from .webhooks.catalog import EventCatalog
from .webhooks.delivery import WEBHOOK_JOB, AttemptListener, DeliveryRunner, RateListener
from .webhooks.manager import Delegate, OutboundWebhookManager, SkipListener
from .webhooks.operations import WebhookOperations
from .webhooks.outbox import SqlOutbox
from .webhooks.rate_holds import HoldWatch
from .webhooks.stores.base import OutboundWebhookHandler
from .workflows._schedule_store import SqlScheduleStore
from .workflows.queues import QueueTable, parse_queue_settings
from .workflows.registry import WorkflowRegistry
from .workflows.runner import WORKFLOW_JOB, WorkflowRunner
from .workflows.schedules import WorkflowSchedules, schedule_grace
from .workflows.service import WorkflowService
from .workflows.sharded import ShardedWorkflowStore
from .workflows.store import SqlWorkflowStore

#: Wraps every job and sweep the engine runs on its own threads (the extension passes
#: ``app.app_context`` so that signal receivers find the app).
JobContext = Callable[[], AbstractContextManager[Any]]

#: Decides whether a request may use the admin surfaces (the actuator): only ``True`` allows it.
Authorizer = Callable[[Any], bool]

logger = logging.getLogger(__name__)


@dataclass
class AdminAccess:
    """Who may use the admin surfaces besides a bearer of ``HARVEST_ACTUATOR_TOKEN``."""

    authorizer: Authorizer | None = None


@dataclass
class HarvestEngine:
    """Everything flask-harvest runs for one app, built by :func:`build_engine`."""

    settings: Settings
    store: OutboundWebhookHandler
    backend: JobBackend
    transport: Transport
    runner: DeliveryRunner
    manager: OutboundWebhookManager
    sweeper: Sweeper
    #: The kinds of work the job seam carries, and what runs each.
    jobs: JobKinds
    #: What operators can do (the actuator and the CLI are thin over it).
    operations: WebhookOperations
    access: AdminAccess = field(default_factory=AdminAccess)
    #: Durable workflows, once :func:`add_workflows` added them.
    workflows: WorkflowService | None = None
    #: Completion triggers, once :func:`add_triggers` added them.
    triggers: TriggerService | None = None
    #: Completion callbacks of the workflows, added with them.
    callbacks: CompletionCallbacks | None = None
    #: The workflows' cron schedules, added with them.
    schedules: WorkflowSchedules | None = None
    #: Entered around each job run on the engine's own threads (the Flask app context).
    job_context: JobContext = nullcontext

    def sweep(self) -> SweepReport:
        """Run one sweep of every kind of work (see :mod:`flask_harvest.sweeper`)."""
        return self.sweeper.sweep()

    def close(self) -> None:
        """Finish after-commit relays, stop the job backend and release its connections, and remove
        what the engine registered on the database engine (the triggers' transaction listeners)."""
        try:
            self.manager.close()
            if self.workflows is not None:
                self.workflows.runner.close()
            self.backend.close()
        finally:
            # Last, once no run of this engine can end any more, and even if a stop above failed:
            # the database engine is often shared (Flask-SQLAlchemy's), and outlives this one.
            if self.triggers is not None:
                self.triggers.firing.close()
            if self.workflows is not None and isinstance(self.workflows.store, ShardedWorkflowStore):
                self.workflows.store.close()


def build_engine(
    settings: Settings,
    store: OutboundWebhookHandler,
    *,
    delegate: Delegate | None = None,
    job_context: JobContext = nullcontext,
    on_attempt: AttemptListener | None = None,
    on_skipped: SkipListener | None = None,
    on_rate_limited: RateListener | None = None,
    access: AdminAccess | None = None,
    catalog: EventCatalog | None = None,
) -> HarvestEngine:
    """Assemble an engine from settings and a store.

    :param delegate: hand each delivery to this callable instead of the job backend.
    :param job_context: entered around each job and sweep run on the engine's own threads.
    :param on_attempt: told about every recorded attempt (the extension sends signals).
    :param on_skipped: told about deliveries a dispatch skipped.
    :param on_rate_limited: told about each delivery held back by its subscription's rate limit.
    :param catalog: the event types payloads are checked against (none: an empty catalog).
    """
    jobs = JobKinds()
    sweeper = Sweeper()
    backend, limiter = _build_backend(settings, jobs, sweeper, job_context)
    transport = Transport(
        connect_timeout=settings.webhooks_connect_timeout_seconds,
        read_timeout=settings.webhooks_timeout_seconds,
        deadline=settings.webhooks_deadline_seconds,
        policy=settings.ssrf_policy,
    )
    runner = DeliveryRunner(
        store,
        settings,
        transport,
        backend,
        listener=on_attempt,
        limiter=limiter,
        rate_listener=on_rate_limited,
        hold_watch=_hold_watch(settings, store, backend),
    )
    capabilities = store.capabilities
    if capabilities.engine is not None:
        # Built in a master that forks its workers (gunicorn --preload), whose pool already holds
        # the connection that created the tables: each worker must open its own.
        new_pool_in_each_child(capabilities.engine)
    outbox = SqlOutbox(capabilities.engine) if capabilities.transactions and capabilities.engine else None
    manager = OutboundWebhookManager(
        store, backend, settings, outbox=outbox, delegate=delegate, on_skipped=on_skipped, catalog=catalog
    )
    jobs.register(WEBHOOK_JOB, runner.run_many)
    sweeper.add_step(
        "outbox", partial(webhook_sweeps.relay_outbox, manager, settings.outbox_retention_seconds)
    )
    # A delegate owns the deliveries handed to it: queueing them again would send them twice.
    sweeper.add_step(
        "webhooks", partial(webhook_sweeps.sweep, store, backend, batch=1000, requeue=delegate is None)
    )
    operations = WebhookOperations(store, backend, manager, settings)
    try:
        # Only with HARVEST_OPERATIONAL_WEBHOOK_URL: otherwise nothing is read or written.
        operations.install_operational_endpoint()
    except BaseException:
        backend.close()
        raise
    return HarvestEngine(
        settings,
        store,
        backend,
        transport,
        runner,
        manager,
        sweeper,
        jobs,
        operations,
        access or AdminAccess(),
        job_context=job_context,
    )


#: Connections a worker process's own work takes beside its runs: the writer of a grouped
#: commit, a batch's claim and the sweeper.
_OWN_CONNECTIONS = 3


def _check_pool_room(sql: sa.Engine, concurrency: int) -> None:
    """Warn when the pool cannot give every run at once a connection beside the store's own: a
    run whose steps use the database (a Flask-SQLAlchemy session holds its connection until the
    run ends) would wait for one, and so would the commits that end the runs."""
    pool = sql.pool
    if not isinstance(pool, QueuePool):
        return  # no limit (NullPool), or one shared connection (an in-memory SQLite database)
    overflow = getattr(pool, "_max_overflow", -1)  # SQLAlchemy has no public reader of it
    room = pool.size() + overflow
    if overflow >= 0 and room < concurrency + _OWN_CONNECTIONS:
        logger.warning(
            "flask-harvest runs up to %d workflow runs at once per process (%s), but the database "
            "pool holds %d connections: if your steps use the database, runs will wait for one; "
            "give the pool at least %d (pool_size plus max_overflow, in SQLALCHEMY_ENGINE_OPTIONS "
            "with Flask-SQLAlchemy), or lower %s",
            concurrency,
            KEYS["workflow_concurrency"],
            room,
            concurrency + _OWN_CONNECTIONS,
            KEYS["workflow_concurrency"],
        )


def add_workflows(
    engine: HarvestEngine, store: SqlWorkflowStore, registry: WorkflowRegistry
) -> WorkflowService:
    """Add durable workflows to ``engine``: a kind of work for its jobs and a step for its sweeper.

    :raises ConfigurationError: the engine has workflows already.
    """
    if engine.workflows is not None:
        raise ConfigurationError("this engine runs workflows already: add them once")
    settings = engine.settings
    engines = store.shards.engines if isinstance(store, ShardedWorkflowStore) else [store.engine]
    for sql in engines:
        new_pool_in_each_child(sql)  # as build_engine does for the webhook store's
    runner = WorkflowRunner(
        store,
        registry,
        engine.backend,
        lease_seconds=settings.workflow_lease_seconds,
        max_recovery_attempts=settings.workflow_max_recovery_attempts,
        max_input_bytes=settings.workflow_max_input_bytes,
        concurrency=settings.workflow_concurrency,
        context=engine.job_context,
        # The settings' queues win over those declared in code, which stay live (declared later too).
        queues=QueueTable(
            parse_queue_settings(settings.workflow_queues, key=KEYS["workflow_queues"]),
            declared=registry.queues,
        ),
    )
    for sql in engines:
        _check_pool_room(sql, runner.concurrency)
    # A queued run's end frees its queue's slot: the queue gets a claim attempt after the commit.
    store.hooks.register(runner.queue_driver.on_terminal)
    # Runs that a terminal hook starts in its transaction are queued once that transaction commits.
    store.on_started = runner.schedule_started
    # A workflow job may run long (slow steps); its lease and heartbeat tell a dead run from a
    # live one, so the backend's job timeout (sized for one webhook attempt) must not kill it.
    engine.backend.set_job_timeout(WORKFLOW_JOB, None)
    # Where the backend allows it, a worker takes as many workflow jobs at a time as the runner's
    # threads have room for, and hands them over: its threads keep up to
    # HARVEST_WORKFLOW_CONCURRENCY runs going. Elsewhere a job runs its rows to the end.
    if engine.backend.allows_hand_off:
        engine.jobs.register(WORKFLOW_JOB, runner.submit_many, take=runner.free_slots)
    else:
        engine.jobs.register(WORKFLOW_JOB, runner.run_many, take=runner.concurrency)
    engine.sweeper.add_step("workflows", runner.sweep_once)
    # Child runs: a waiting parent's wake-up and the parent-close cascade, in terminal transactions.
    store.hooks.register(store.children_hook)
    engine.sweeper.add_step("child-waits", partial(_wake_stranded_parents, store, runner))
    engine.workflows = WorkflowService(store, registry, runner, store.hooks)
    _add_callbacks(engine, store, engine.workflows)
    _add_schedules(engine, store, engine.workflows)
    return engine.workflows


def add_triggers(
    engine: HarvestEngine, store: SqlTriggerStore, *, listener: FireListener | None = None
) -> TriggerService:
    """Add completion triggers to ``engine``: a terminal hook on its workflows and a sweeper step
    that purges old fires rows (``HARVEST_TRIGGER_FIRES_RETENTION_SECONDS``). With shards, also the
    cross-shard outbox and its sweeper step, and a step that repairs the shards' definitions.

    :param store: the trigger store; with shards, one on every shard
        (:func:`~flask_harvest.triggers.sharded.open_trigger_store`).
    :param listener: told about every fire outcome once its transaction committed.
    :raises ConfigurationError: the engine has no workflows, or has triggers already, or its
        workflows are sharded and ``store`` is not.
    """
    workflows = engine.workflows
    if workflows is None:
        raise ConfigurationError("completion triggers need workflows: call add_workflows first")
    if engine.triggers is not None:
        raise ConfigurationError("this engine has completion triggers already: add them once")
    settings = engine.settings
    registry = workflows.registry
    outbox: TriggerOutbox | None = None
    if isinstance(workflows.store, ShardedWorkflowStore):
        if not isinstance(store, ShardedTriggerStore):
            raise ConfigurationError(
                "the workflows are sharded: give add_triggers a trigger store on every shard "
                "(open_trigger_store(workflow_store))"
            )
        outbox = TriggerOutbox(store, workflows.store.shards, workflows.runner.start, known=registry.names)
    firing = TriggerFiring(
        store,
        workflows.runner.start,
        knows=registry.__contains__,
        max_chain_depth=settings.trigger_max_chain_depth,
        max_input_bytes=settings.workflow_max_input_bytes,
        place=workflows.runner.placement,
        listener=listener,
        cross_shard=outbox,
    )
    retention = settings.trigger_fires_retention_seconds or None
    engine.triggers = TriggerService(store, firing, workflows, retention_seconds=retention)
    workflows.hooks.register(firing)
    engine.sweeper.add_step("trigger-fires", partial(_purge_fires, engine.triggers))
    if outbox is not None and isinstance(store, ShardedTriggerStore):
        outbox.listener = firing.report
        engine.sweeper.add_step("completion-triggers-outbox", partial(_drain_trigger_outbox, outbox))
        engine.sweeper.add_step("trigger-definitions", partial(_repair_triggers, store))
    return engine.triggers


def _wake_stranded_parents(store: SqlWorkflowStore, runner: WorkflowRunner) -> SweepReport:
    woken = store.wake_stranded(now=runner.clock())
    runner.schedule_started(woken)
    return SweepReport(requeued=len(woken))


def _purge_fires(service: TriggerService) -> SweepReport:
    return SweepReport(fires_purged=service.purge_fires())


def _drain_trigger_outbox(outbox: TriggerOutbox) -> SweepReport:
    drained = outbox.enforce_completion_triggers_outbox()
    return SweepReport(trigger_starts=drained.started, trigger_starts_waiting=drained.left)


def _repair_triggers(store: ShardedTriggerStore) -> SweepReport:
    return SweepReport(triggers_repaired=store.repair())


def _add_callbacks(engine: HarvestEngine, store: SqlWorkflowStore, service: WorkflowService) -> None:
    """Completion callbacks: a start preparer, a terminal hook, a job kind and a sweeper step."""
    # A delivery row lives on its run's shard (inserted in the run's terminal transaction).
    deliveries = (
        ShardedCallbackStore(store.shards)
        if isinstance(store, ShardedWorkflowStore)
        else SqlCallbackStore(store.engine)
    )
    callbacks = CompletionCallbacks(
        engine.settings,
        deliveries,
        engine.backend,
        engine.transport,
    )
    service.add_start_preparer(callbacks.prepare)
    store.hooks.register(callbacks.terminal_hook)
    engine.jobs.register(CALLBACK_JOB, callbacks.run_many)
    engine.sweeper.add_step("completion-callbacks", callbacks.sweep)
    engine.callbacks = callbacks


def _add_schedules(engine: HarvestEngine, store: SqlWorkflowStore, service: WorkflowService) -> None:
    """Scheduled workflows: a sweeper step that starts each cron tick's run."""
    settings = engine.settings
    engine.schedules = WorkflowSchedules(
        SqlScheduleStore(store.engine),
        service,
        catchup=settings.workflow_schedule_catchup,
        grace=schedule_grace(settings.sweep_interval_seconds),
    )
    engine.sweeper.add_step("workflow-schedules", engine.schedules.sweep)


def _hold_watch(settings: Settings, store: OutboundWebhookHandler, backend: JobBackend) -> HoldWatch | None:
    """The watch that tells the operational endpoint of long rate-limit holds, or ``None`` (and
    nothing counted) without an endpoint or a threshold. Its episodes live where the rate limits'
    buckets do: in Redis for the ``rq`` backend's processes, in memory for the ``local`` one."""
    if not HoldWatch.wanted(settings):
        return None
    episodes: HoldEpisodes = (
        RedisHoldEpisodes(
            redis.Redis.from_url(settings.redis_url), f"harvest:held:{settings.webhooks_queue}:"
        )
        if settings.jobs_backend == "rq"
        else LocalHoldEpisodes()
    )
    return HoldWatch(store, backend, settings, episodes)


def _build_backend(
    settings: Settings, jobs: JobKinds, sweeper: Sweeper, context: JobContext
) -> tuple[JobBackend, RateLimiter]:
    """The job backend, and where the rate limits' buckets live: in its Redis for the ``rq``
    backend, whose worker processes must share them; in memory for the ``local`` one, whose
    deliveries all run in this process (so a bucket of its own is exact)."""
    if settings.jobs_backend == "rq":
        connection = redis.Redis.from_url(settings.redis_url)
        limiter = RedisRateLimiter(connection, f"harvest:rate:{settings.webhooks_queue}:")
        backend = RqBackend(
            connection,
            settings.webhooks_queue,
            job_timeout=job_timeout_for(
                settings.webhooks_deadline_seconds, settings.webhooks_connect_timeout_seconds
            ),
            # One job per this many rows of a fan-out: what a worker takes at a time.
            batch_size=max(1, settings.worker_concurrency // 4),
        )
        return backend, limiter

    def run(ref: JobRef) -> None:
        with context():
            jobs.run(ref.kind, [ref.id])

    def periodic() -> None:
        with context():
            sweeper.sweep()

    local = LocalBackend(
        run, workers=settings.local_workers, periodic=periodic, interval=settings.sweep_interval_seconds
    )
    return local, LocalRateLimiter()
