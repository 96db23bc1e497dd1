"""The Flask extension: one object that registers flask-harvest on an app.

:class:`Harvest` reads the configuration once, builds the Flask-free engine of
:mod:`flask_harvest.engine` and registers it on the app, with the features its options switch on:
outbound webhooks always; durable workflows and their completion callbacks when a SQL database is
there; completion triggers with the workflows. Workflows, static triggers and the admin
authorizer can be declared on the extension before or after ``init_app``, in any order, as with
Flask-SQLAlchemy's models.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from flask import Flask
from sqlalchemy import Connection
from sqlalchemy import Engine as SqlEngine

from . import signals
from ._app import EXTENSION_KEY, get_engine, trigger_service, workflow_service
from ._shard_set import check_unsharded
from .callbacks.api import completion_blueprint
from .callbacks.service import CallbackListener
from .callbacks.store import CompletionDelivery, SqlCallbackStore
from .cli import harvest_cli
from .config import KEYS, Settings, load_settings, shard_urls
from .dashboard import install_dashboard
from .dashboard._core import check_dashboard_config
from .engine import AdminAccess, Authorizer, HarvestEngine, add_triggers, add_workflows, build_engine
from .errors import ConfigurationError
from .outbound.attempt import Verdict
from .portal import portal_url
from .triggers.admin import trigger_admin
from .triggers.definitions import CompletionTrigger
from .triggers.firing import FireEvent, FireListener
from .triggers.service import TriggerService
from .triggers.sharded import open_trigger_store
from .triggers.store import SqlTriggerStore
from .webhooks.actuator import actuator
from .webhooks.catalog import EventCatalog, EventType
from .webhooks.delivery import AttemptListener
from .webhooks.manager import Delegate, OutboundWebhookManager
from .webhooks.models import AttemptResult, Claim, DeliveryLog, DeliveryState, WebhookSubscriptionStatus
from .webhooks.outbox import TransactionTarget
from .webhooks.stores.base import OutboundWebhookHandler
from .webhooks.stores.sql import SqlOutboundWebhookStore
from .workflows.hooks import TerminalHook, after_commit
from .workflows.http import workflows_api
from .workflows.models import Execution, ExecutionState, ForkMode, IdReusePolicy, JsonValue
from .workflows.queues import QueueSpec, parse_queue_settings
from .workflows.registry import WorkflowFunction, WorkflowRegistry
from .workflows.schedules_http import install_schedules
from .workflows.service import WorkflowHandle, WorkflowService
from .workflows.sharded import ShardedWorkflowStore, open_workflow_store

if TYPE_CHECKING:
    from flask_sqlalchemy import SQLAlchemy

__all__ = ["Harvest", "OutboundWebhookPlugin", "get_manager"]

log = logging.getLogger(__name__)

F = TypeVar("F", bound=WorkflowFunction)


class Harvest:
    """flask-harvest for a Flask app: webhooks, workflows, completion callbacks and triggers::

        db = SQLAlchemy()
        harvest = Harvest(db=db)

        @harvest.workflow("process_refund", timeout=timedelta(minutes=10))
        def process_refund(ctx, refund):
            return {"refunded": ctx.step("charge", refund_charge, refund["charge_id"])}

        def create_app():
            app = Flask(__name__)
            db.init_app(app)
            harvest.init_app(app)
            return app

    Everything lives in the app's Flask-SQLAlchemy ``db`` (subscriptions, deliveries, executions,
    callback deliveries, triggers). A ``store`` instead keeps the webhooks elsewhere
    (``InMemoryOutboundWebhookHandler()`` for tests); workflows then run in ``db`` if given, or on
    a SQL store's engine with ``workflows=True``. Keyword ``options`` are the
    :class:`~flask_harvest.config.Settings` fields (``webhooks_max_attempts=3``); a ``HARVEST_*``
    key in ``app.config`` wins over them.

    :param app: register on this app at once.
    :param db: the app's Flask-SQLAlchemy database.
    :param store: the webhook store, shared by every app this extension is registered on.
    :param delegate: hand each delivery to this callable instead of the job backend.
    :param workflows: run durable workflows and their completion callbacks. ``None`` (the default)
        turns them on with ``db``; ``True`` also runs them on a SQL ``store``'s engine.
    :param triggers: run completion triggers; ``None`` (the default) follows ``workflows``.
    :param create_tables: create the missing tables at ``init_app`` (turn off when migrations own
        the schema).
    """

    def __init__(
        self,
        app: Flask | None = None,
        db: SQLAlchemy | None = None,
        *,
        store: OutboundWebhookHandler | None = None,
        delegate: Delegate | None = None,
        workflows: bool | None = None,
        triggers: bool | None = None,
        create_tables: bool = True,
        **options: Any,
    ) -> None:
        unknown = set(options) - set(KEYS)
        if unknown:
            raise ConfigurationError(
                f"unknown option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(KEYS))}"
            )
        if triggers and not (workflows or (workflows is None and db is not None)):
            raise ConfigurationError("completion triggers need workflows: leave workflows on")
        self._db = db
        self._store = store
        self._delegate = delegate
        self._want_workflows = workflows
        self._want_triggers = triggers
        self._create_tables = create_tables
        self._options = options
        self._access = AdminAccess()
        #: The workflows declared with :meth:`workflow`, shared by every app.
        self.registry = WorkflowRegistry()
        #: The event types declared with :meth:`event_type`, shared by every app.
        self.catalog = EventCatalog()
        self._static_triggers: list[CompletionTrigger] = []
        # The apps this extension is registered on, so a trigger declared after init_app still
        # reaches them; weak, so the extension never keeps an app alive (no ``self.app``).
        self._apps: weakref.WeakSet[Flask] = weakref.WeakSet()
        if app is not None:
            self.init_app(app)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} store={self._store!r} workflows={self.registry.names()}>"

    # -- registration -------------------------------------------------------------------------

    def init_app(self, app: Flask) -> None:
        """Register flask-harvest on ``app``: read its ``HARVEST_*`` keys, create missing tables,
        build the engine and register the blueprints, the CLI and the signals.

        :raises ConfigurationError: already registered on ``app``, no store or database to keep the
            webhooks in, workflows asked for without a SQL database, or a bad setting.
        """
        if EXTENSION_KEY in app.extensions:
            raise ConfigurationError(
                "flask-harvest is already registered on this app; call init_app once per app "
                "(use one Harvest extension, or create the app anew in tests)"
            )
        settings = load_settings(app.config, self._options)
        # Checked before anything is built or created: a wrong queue leaves nothing behind.
        parse_queue_settings(settings.workflow_queues, key=KEYS["workflow_queues"])
        if settings.dashboard:
            check_dashboard_config(app)
        # Before anything is built: a missing prometheus_client leaves nothing to clean up.
        install_metrics = _install_metrics() if settings.metrics else None
        store = self._webhook_store(app)
        sql = self._sql_engine(app, store)
        engine = build_engine(
            settings,
            store,
            delegate=self._delegate,
            job_context=app.app_context,
            on_attempt=_signal_listener(app),
            on_skipped=_skip_listener(app),
            on_rate_limited=_rate_listener(app),
            access=self._access,
            catalog=self.catalog,
        )
        try:
            if sql is not None:
                self._add_workflows(app, engine, sql)
            app.extensions[EXTENSION_KEY] = engine
            app.cli.add_command(harvest_cli)
            app.register_blueprint(actuator, url_prefix=settings.actuator_prefix)
            if settings.dashboard:
                install_dashboard(app, settings)
            if install_metrics is not None:
                install_metrics(app)
        except BaseException:
            # Its job threads and listeners must not outlive an app that failed to start.
            app.extensions.pop(EXTENSION_KEY, None)
            engine.close()
            raise
        self._apps.add(app)
        if not engine.backend.durable:
            app.logger.warning(
                "flask-harvest uses the 'local' job backend: jobs live in this process and are "
                "lost if it exits; set %s = 'rq' in production",
                KEYS["jobs_backend"],
            )

    def _webhook_store(self, app: Flask) -> OutboundWebhookHandler:
        if self._store is not None:
            return self._store
        if self._db is None:
            raise ConfigurationError(
                "choose where flask-harvest keeps its data: Harvest(app, db) with the app's "
                "Flask-SQLAlchemy db, or Harvest(app, store=InMemoryOutboundWebhookHandler()) for tests"
            )
        with app.app_context():
            store = SqlOutboundWebhookStore(self._db.engine)
        if self._create_tables:
            store.ensure_schema()
        return store

    def _sql_engine(self, app: Flask, store: OutboundWebhookHandler) -> SqlEngine | None:
        """The SQL engine the workflows live on, or ``None`` when they are off."""
        if self._want_workflows is False:
            return None
        sql: SqlEngine | None = None
        if self._db is not None:
            with app.app_context():
                sql = self._db.engine
        elif self._want_workflows and store.capabilities.transactions:
            sql = store.capabilities.engine
        if sql is None and self._want_workflows:
            raise ConfigurationError(
                "workflows and completion triggers keep their executions in SQL: give Harvest the "
                "app's Flask-SQLAlchemy db (Harvest(app, db)) or a SQL store"
            )
        return sql

    def _add_workflows(self, app: Flask, engine: HarvestEngine, sql: SqlEngine) -> None:
        settings = engine.settings
        store = open_workflow_store(sql, shard_urls(settings))
        if self._create_tables:
            store.ensure_schema()
        if not isinstance(store, ShardedWorkflowStore):
            check_unsharded(sql)
        else:
            try:
                self._prepare_shards(store)
            except BaseException:
                store.close()
                raise
        service = add_workflows(engine, store, self.registry)
        store.hooks.register(_finished_signal(app))
        app.register_blueprint(workflows_api, url_prefix=settings.workflow_api_prefix)
        callbacks = engine.callbacks
        if callbacks is not None:
            if self._create_tables:
                callbacks.store.ensure_schema()
            callbacks.listener = _callback_signals(app)
            app.register_blueprint(completion_blueprint(), url_prefix=settings.workflow_api_prefix)
        if engine.schedules is not None:
            install_schedules(
                app,
                engine.schedules,
                engine.backend,
                prefix=settings.workflow_api_prefix,
                create_tables=self._create_tables,
            )
        if self._want_triggers is False:
            return
        trigger_store = open_trigger_store(service.store)
        if self._create_tables:
            trigger_store.ensure_schema()
        triggers = add_triggers(engine, trigger_store, listener=_fire_listener(app))
        triggers.sync(self._static_triggers)
        app.register_blueprint(trigger_admin, url_prefix=settings.workflow_api_prefix)

    def _prepare_shards(self, store: ShardedWorkflowStore) -> None:
        if self._create_tables:
            # Callback deliveries, trigger fires and definitions live beside their runs.
            for shard_engine in store.shards.engines:
                SqlCallbackStore(shard_engine).ensure_schema()
                if self._want_triggers is not False:
                    SqlTriggerStore(shard_engine).ensure_schema()
        store.check_layout()

    def workflow(
        self,
        name: str,
        *,
        timeout: timedelta | None = None,
        schedule: str | None = None,
        queue: str | None = None,
        priority: int = 0,
    ) -> Callable[[F], F]:
        """Register ``fn(ctx, input) -> output`` as the workflow ``name`` (a decorator), before or
        after ``init_app``. Declare workflows where the web process and every worker import them.

        :param timeout: the run ends ``TimedOut`` when it has not finished this long after its start.
        :param schedule: cron text (UTC; a sixth, leading field for seconds): the workers' sweeper
            starts one run per tick, with input ``{"scheduled_at": "<tick, ISO 8601>"}``.
        :param queue: the workflow queue its runs are claimed through (see :meth:`queue`).
        :param priority: its runs' priority in the queue: lower first.
        :raises ConfigurationError: the schedule is not valid cron text, or the queue name or the
            priority is out of range (the message names the workflow).
        """
        return self.registry.workflow(
            name, timeout=timeout, schedule=schedule, queue=queue, priority=priority
        )

    def event_type(
        self, name: str, *, description: str = "", schema: Any, example: Any, version: int = 1
    ) -> EventType:
        """Register an event type in the catalog, before or after ``init_app``::

            harvest.event_type(
                "order.created",
                description="An order was placed.",
                schema={"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}},
                example={"id": "ord_1"},
            )

        Dispatching ``name`` then checks the payload against ``schema`` (``HARVEST_EVENT_VALIDATION``
        says whether a mismatch is refused or logged); see the event catalog guide.

        :raises InvalidFieldError: the name is not a plain topic, the schema is not a valid JSON
            Schema, the example does not match it, or another type has the name.
        """
        return self.catalog.register(
            name, description=description, schema=schema, example=example, version=version
        )

    def queue(
        self, name: str, *, concurrency: int | None = None, rate_limit: tuple[int, float] | None = None
    ) -> QueueSpec:
        """Declare the workflow queue ``name``, before or after ``init_app`` (a queue of the same
        name in ``HARVEST_WORKFLOW_QUEUES`` wins)::

            harvest.queue("emails", concurrency=4, rate_limit=(10, 1.0))

        :param concurrency: the most runs of the queue running at once; ``None`` for no limit.
        :param rate_limit: ``(limit, seconds)``: at most ``limit`` first starts in any ``seconds``.
        :raises ConfigurationError: a name or limit out of range.
        """
        return self.registry.queue(name, concurrency=concurrency, rate_limit=rate_limit)

    def completion_trigger(self, trigger: CompletionTrigger) -> CompletionTrigger:
        """Declare a static completion trigger: start its target when its source ends.

        Static triggers are upserted into the trigger table at ``init_app`` (and at once on the
        apps already registered): a row with the same id is replaced whole; rows registered
        through the admin API stay.

        :raises ConfigurationError: ``trigger`` is not a :class:`CompletionTrigger`, or another
            static trigger has its id.
        """
        if not isinstance(trigger, CompletionTrigger):
            raise ConfigurationError(
                f"a static completion trigger must be a CompletionTrigger, not {type(trigger).__name__}"
            )
        for known in self._static_triggers:
            if known.id == trigger.id and known != trigger:
                raise ConfigurationError(
                    f"two static completion triggers have the id {trigger.id} "
                    f"({known.source_workflow_name} -> {known.target_workflow_name} and "
                    f"{trigger.source_workflow_name} -> {trigger.target_workflow_name}); give each its own id"
                )
        if trigger not in self._static_triggers:
            self._static_triggers.append(trigger)
            for app in list(self._apps):
                service = get_engine(app).triggers
                if service is not None:
                    service.sync([trigger])
        return trigger

    def completion_triggers(self, triggers: Iterable[CompletionTrigger]) -> None:
        """Declare several static completion triggers (see :meth:`completion_trigger`)."""
        for trigger in triggers:
            self.completion_trigger(trigger)

    def actuator_authorizer(self, authorizer: Authorizer) -> Authorizer:
        """Register the function that decides who may use the admin surfaces (the actuator, the
        workflow and trigger APIs, the dashboard); use it as a decorator, before or after
        ``init_app``::

            @harvest.actuator_authorizer
            def only_admins(request):
                return current_user.is_admin

        A request with the right ``HARVEST_ACTUATOR_TOKEN`` is allowed whatever it returns.
        """
        self._access.authorizer = authorizer
        return authorizer

    # -- the current app's parts ----------------------------------------------------------------

    @property
    def engine(self) -> HarvestEngine:
        """The engine of the current app (needs an app context)."""
        return get_engine()

    @property
    def store(self) -> OutboundWebhookHandler:
        """The webhook store of the current app (needs an app context)."""
        return get_engine().store

    @property
    def manager(self) -> OutboundWebhookManager:
        """The webhook manager of the current app (needs an app context)."""
        return get_engine().manager

    @property
    def settings(self) -> Settings:
        """The settings of the current app (needs an app context)."""
        return get_engine().settings

    @property
    def workflows(self) -> WorkflowService:
        """The workflow service of the current app (needs an app context)."""
        return workflow_service()

    @property
    def triggers(self) -> TriggerService:
        """The completion-trigger service of the current app (needs an app context)."""
        return trigger_service()

    # -- the common calls ----------------------------------------------------------------------

    def dispatch(
        self, topic: str, payload: Any, *, ordering_key: str | None = None, tenant: str | None = None
    ) -> list[str]:
        """Send ``payload`` to every subscription of ``topic`` of ``tenant`` (``None``: the
        untenanted ones); return the delivery ids (see :meth:`OutboundWebhookManager.dispatch`).
        ``ordering_key``: deliveries of one key reach each subscription in dispatch order
        (:doc:`/ordering`)."""
        return get_engine().manager.dispatch(topic, payload, ordering_key=ordering_key, tenant=tenant)

    def dispatch_in_tx(
        self,
        conn: TransactionTarget,
        topic: str,
        payload: Any,
        *,
        ordering_key: str | None = None,
        tenant: str | None = None,
    ) -> str:
        """Write the event (for ``tenant``'s subscriptions) into the caller's transaction; it is
        delivered once that commits (see :meth:`OutboundWebhookManager.dispatch_in_tx`)."""
        return get_engine().manager.dispatch_in_tx(
            conn, topic, payload, ordering_key=ordering_key, tenant=tenant
        )

    def portal_url(self, tenant: str, *, expires_in: float | None = None) -> str:
        """Return a short-lived signed link that opens the consumer portal for ``tenant`` (its
        endpoints and deliveries only); hand it only to that tenant's signed-in users. Call it in
        a request, with the portal blueprint registered (:doc:`/portal`).

        :param expires_in: seconds the link can be opened (``HARVEST_PORTAL_LINK_SECONDS``).
        :raises InvalidFieldError: ``tenant`` is not a tenant id, or ``expires_in`` is out of range.
        :raises ConfigurationError: the portal blueprint is not registered on the app.
        """
        return portal_url(tenant, expires_in=expires_in)

    def start(
        self,
        name: str,
        input: JsonValue = None,
        *,
        workflow_id: str | None = None,
        policy: IdReusePolicy | str = IdReusePolicy.ALLOW_DUPLICATE,
        completion_callbacks: JsonValue = None,
        queue: str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        priority: int | None = None,
    ) -> WorkflowHandle:
        """Start a run of ``name`` (see :meth:`WorkflowService.start`); return its handle."""
        handle, _ = workflow_service().start(
            name,
            input,
            workflow_id=workflow_id,
            policy=policy,
            completion_callbacks=completion_callbacks,
            queue=queue,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            priority=priority,
        )
        return handle

    def start_many(
        self,
        name: str,
        inputs: Sequence[JsonValue],
        *,
        completion_callbacks: JsonValue = None,
        queue: str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        priority: int | None = None,
    ) -> list[WorkflowHandle]:
        """Start one run of ``name`` per input in one transaction and one enqueue (see
        :meth:`WorkflowService.start_many`); return their handles in the order of ``inputs``."""
        return workflow_service().start_many(
            name,
            inputs,
            completion_callbacks=completion_callbacks,
            queue=queue,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            priority=priority,
        )

    def fork(
        self, execution_id: str, from_step: int, mode: ForkMode | str = ForkMode.RECORDED
    ) -> WorkflowHandle:
        """Retry a run from step ``from_step`` as a new run (see :meth:`WorkflowService.fork`);
        return the fork's handle."""
        return workflow_service().fork(execution_id, from_step, mode)

    def get(self, execution_id: str) -> Execution:
        """Return an execution (see :meth:`WorkflowService.get`)."""
        return workflow_service().get(execution_id)

    def handle(self, execution_id: str) -> WorkflowHandle:
        """Return a handle on an existing execution."""
        return workflow_service().handle(execution_id)

    def list_executions(
        self,
        *,
        name: str | None = None,
        state: ExecutionState | str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> tuple[list[Execution], str | None]:
        """Return one page of executions, newest first (see :meth:`WorkflowService.list_executions`)."""
        return workflow_service().list_executions(name=name, state=state, cursor=cursor, limit=limit)

    def close(self, app: Flask | None = None) -> None:
        """Stop the engine of ``app`` (default: the current app): finish after-commit relays, stop
        the job backend's threads and release its connections. Call it when a script or test ends."""
        get_engine(app).close()


class OutboundWebhookPlugin(Harvest):
    """:class:`Harvest` under its compatibility name, taking the store first::

        OutboundWebhookPlugin(InMemoryOutboundWebhookHandler(), app)
        OutboundWebhookPlugin.sql(db, app)

    It is the same extension: workflows, triggers and the authorizer work on it as on
    :class:`Harvest`.
    """

    def __init__(
        self,
        store: OutboundWebhookHandler | None = None,
        app: Flask | None = None,
        *,
        db: SQLAlchemy | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, db, store=store, **kwargs)

    @classmethod
    def sql(cls, db: SQLAlchemy, app: Flask | None = None, **kwargs: Any) -> OutboundWebhookPlugin:
        """The extension on the app's Flask-SQLAlchemy ``db``: the same as ``Harvest(app, db)``."""
        return cls(None, app, db=db, **kwargs)


def get_manager() -> OutboundWebhookManager:
    """Return the current app's :class:`OutboundWebhookManager` (needs an app context)."""
    return get_engine().manager


# -- signals: each listener sends with the app as sender ------------------------------------------


def _signal_listener(app: Flask) -> AttemptListener:
    by_state = {
        DeliveryState.DELIVERED: signals.delivery_succeeded,
        DeliveryState.PENDING: signals.delivery_failed,
        DeliveryState.DLQ: signals.delivery_dead_lettered,
        DeliveryState.SKIPPED: signals.delivery_skipped,
    }

    def listener(claim: Claim, result: AttemptResult, changed: WebhookSubscriptionStatus | None) -> None:
        delivery = claim.delivery.replace(
            state=result.state,
            attempt=result.attempt_number,
            next_attempt_at=result.next_attempt_at,
            last_error=result.last_error,
            timestamp=result.timestamp,
        )
        by_state[result.state].send(app, delivery=delivery, attempt=result.attempt)
        if changed is WebhookSubscriptionStatus.DISABLED:
            signals.subscription_disabled.send(app, subscription_id=delivery.subscription_id)
        elif changed is WebhookSubscriptionStatus.FAILED:
            signals.subscription_failed.send(app, subscription_id=delivery.subscription_id)

    return listener


def _rate_listener(app: Flask) -> Callable[[Claim, float], None]:
    def listener(claim: Claim, seconds: float) -> None:
        signals.delivery_rate_limited.send(app, delivery=claim.delivery, seconds=seconds)

    return listener


def _skip_listener(app: Flask) -> Callable[[Sequence[DeliveryLog]], None]:
    def listener(deliveries: Sequence[DeliveryLog]) -> None:
        for delivery in deliveries:
            signals.delivery_skipped.send(app, delivery=delivery, attempt=None)

    return listener


def _finished_signal(app: Flask) -> TerminalHook:
    """A terminal hook that sends :data:`~flask_harvest.signals.workflow_finished` once the
    transition has committed (a rolled-back transition sends nothing)."""

    def hook(conn: Connection, execution: Execution) -> None:
        if signals.workflow_finished.has_receivers_for(app):
            after_commit(conn, partial(signals.workflow_finished.send, app, execution=execution))

    return hook


def _callback_signals(app: Flask) -> CallbackListener:
    by_state = {
        DeliveryState.DELIVERED: signals.completion_callback_delivered,
        DeliveryState.PENDING: signals.completion_callback_failed,
        DeliveryState.DLQ: signals.completion_callback_dead_lettered,
    }

    def listener(delivery: CompletionDelivery, outcome: Verdict) -> None:
        signal = by_state.get(outcome.state)
        if signal is not None:
            signal.send(app, delivery=delivery)

    return listener


def _fire_listener(app: Flask) -> FireListener:
    def listener(fired: FireEvent) -> None:
        signals.completion_trigger_fired.send(app, event=fired, outcome=fired.outcome.value)
        if fired.reason is not None:
            signals.completion_trigger_skipped.send(
                app,
                trigger_id=fired.trigger_id,
                source_exec_id=fired.source_exec_id,
                reason=fired.reason.value,
            )

    return listener


def _install_metrics() -> Callable[[Flask], None]:
    """Return :func:`flask_harvest.metrics.install`; that module needs the optional ``prometheus_client``."""
    # Imported here, not at the top: importing flask_harvest must work without prometheus_client.
    try:
        from . import metrics
    except ModuleNotFoundError as exc:
        if exc.name != "prometheus_client":
            raise
        raise ConfigurationError(
            f"{KEYS['metrics']} needs prometheus_client: pip install 'flask-harvest[metrics]' "
            f"(or set {KEYS['metrics']} = False)"
        ) from None
    return metrics.install
