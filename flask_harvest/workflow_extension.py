"""The Flask extension for durable workflows: registers workflows and adds them to the app's engine.

Workflows share everything with webhooks: the ``HARVEST_*`` configuration, the job backend (Redis
and ``flask harvest worker``), the sweeper and the admin access rules. The execution tables live in
the app's SQL database (SQLite for development, PostgreSQL in production).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from flask import Flask
from sqlalchemy import Connection

from . import signals
from ._app import EXTENSION_KEY, get_engine, workflow_service
from .callbacks.api import completion_blueprint
from .callbacks.outcome import AttemptOutcome, DeliveryState
from .callbacks.service import CallbackListener
from .callbacks.store import CompletionDelivery
from .engine import add_workflows
from .errors import ConfigurationError
from .extension import OutboundWebhookPlugin
from .workflows.hooks import TerminalHook, after_commit
from .workflows.http import workflows_api
from .workflows.models import Execution, ExecutionState, IdReusePolicy, JsonValue
from .workflows.registry import WorkflowFunction, WorkflowRegistry
from .workflows.service import WorkflowHandle, WorkflowService
from .workflows.store import SqlWorkflowStore

if TYPE_CHECKING:
    from flask_sqlalchemy import SQLAlchemy

F = TypeVar("F", bound=WorkflowFunction)


class HarvestWorkflows:
    """Durable workflows for a Flask app.

    Build it on the app's Flask-SQLAlchemy database with :meth:`sql`, register workflows with
    :meth:`workflow` in the app module (so the web process and every worker know the same ones),
    and start them with :meth:`start`::

        workflows = HarvestWorkflows.sql(db, app)

        @workflows.workflow("process_refund", timeout=timedelta(minutes=10))
        def process_refund(ctx, refund):
            charge = ctx.step("charge", refund_charge, refund["charge_id"])
            return {"refunded": charge["amount"]}

        handle = workflows.start("process_refund", {"charge_id": "ch_1"}, workflow_id="refund-r-1")

    If the app has no flask-harvest engine yet (no :class:`OutboundWebhookPlugin`), :meth:`sql`
    registers one on the same database, with ``options`` as its settings.
    """

    def __init__(
        self, db: SQLAlchemy, app: Flask | None = None, *, create_tables: bool = True, **options: Any
    ) -> None:
        self._db = db
        self._create_tables = create_tables
        self._options = options
        self.registry = WorkflowRegistry()
        if app is not None:
            self.init_app(app)

    @classmethod
    def sql(
        cls, db: SQLAlchemy, app: Flask | None = None, *, create_tables: bool = True, **options: Any
    ) -> HarvestWorkflows:
        """Keep executions in the app's Flask-SQLAlchemy ``db``.

        :param create_tables: create the workflow tables at ``init_app`` if missing (turn off when
            migrations own the schema).
        :param options: settings (:class:`~flask_harvest.config.Settings` fields) for the engine, if
            this extension is the one that creates it.
        """
        return cls(db, app, create_tables=create_tables, **options)

    def __repr__(self) -> str:
        return f"<HarvestWorkflows workflows={self.registry.names()}>"

    def workflow(self, name: str, *, timeout: timedelta | None = None) -> Callable[[F], F]:
        """Register ``fn(ctx, input) -> output`` as the workflow ``name`` (a decorator).

        :param timeout: the run ends ``TimedOut`` when it has not finished this long after its start.
        """
        return self.registry.workflow(name, timeout=timeout)

    def init_app(self, app: Flask) -> None:
        """Add workflows to ``app``'s engine (creating the engine on the same database if needed).

        :raises ConfigurationError: workflows are registered on this app already, or options were
            given although another extension created the engine.
        """
        if EXTENSION_KEY not in app.extensions:
            OutboundWebhookPlugin.sql(self._db, app, create_tables=self._create_tables, **self._options)
        elif self._options:
            raise ConfigurationError(
                "the app's flask-harvest engine exists already: give settings to OutboundWebhookPlugin "
                "or as HARVEST_* keys in app.config, not to HarvestWorkflows"
            )
        engine = get_engine(app)
        if engine.workflows is not None:
            raise ConfigurationError(
                "workflows are registered on this app already; call init_app once per app"
            )
        with app.app_context():
            store = SqlWorkflowStore(self._db.engine)
        if self._create_tables:
            store.ensure_schema()
        add_workflows(engine, store, self.registry)
        store.hooks.register(_finished_signal(app))
        app.register_blueprint(workflows_api, url_prefix=engine.settings.workflow_api_prefix)
        callbacks = engine.callbacks
        if callbacks is not None:
            if self._create_tables:
                callbacks.store.ensure_schema()
            callbacks.listener = _callback_signals(app)
            app.register_blueprint(completion_blueprint(), url_prefix=engine.settings.workflow_api_prefix)

    @property
    def service(self) -> WorkflowService:
        """The workflow service of the current app (needs an app context)."""
        return workflow_service()

    def start(
        self,
        name: str,
        input: JsonValue = None,
        *,
        workflow_id: str | None = None,
        policy: IdReusePolicy | str = IdReusePolicy.ALLOW_DUPLICATE,
        completion_callbacks: JsonValue = None,
    ) -> WorkflowHandle:
        """Start a run of ``name`` (see :meth:`WorkflowService.start`); return its handle."""
        handle, _ = workflow_service().start(
            name, input, workflow_id=workflow_id, policy=policy, completion_callbacks=completion_callbacks
        )
        return handle

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


def _finished_signal(app: Flask) -> TerminalHook:
    """A terminal hook that sends :data:`~flask_harvest.signals.workflow_finished` once the
    transition has committed (a rolled-back transition sends nothing)."""

    def hook(conn: Connection, execution: Execution) -> None:
        if signals.workflow_finished.has_receivers_for(app):
            after_commit(conn, partial(signals.workflow_finished.send, app, execution=execution))

    return hook


def _callback_signals(app: Flask) -> CallbackListener:
    """Send the completion-callback signals with ``app`` as sender."""

    def listener(delivery: CompletionDelivery, outcome: AttemptOutcome) -> None:
        signal = {
            DeliveryState.DELIVERED: signals.completion_callback_delivered,
            DeliveryState.PENDING: signals.completion_callback_failed,
            DeliveryState.FAILED: signals.completion_callback_dead_lettered,
        }.get(outcome.state)
        if signal is not None:
            signal.send(app, delivery=delivery)

    return listener
