"""The Flask extension for completion triggers: static registration, the admin API, signals, CLI.

Triggers live in the workflows' database; the extension needs :class:`~flask_harvest.HarvestWorkflows`
on the app first.
"""

from __future__ import annotations

from collections.abc import Iterable

from flask import Flask

from . import signals
from ._app import get_engine
from .engine import add_triggers
from .errors import ConfigurationError
from .triggers.admin import trigger_admin
from .triggers.definitions import CompletionTrigger
from .triggers.firing import FireEvent, FireListener
from .triggers.service import TriggerService
from .triggers.store import SqlTriggerStore

__all__ = ["HarvestTriggers", "trigger_service"]


class HarvestTriggers:
    """Completion triggers for a Flask app: start workflow B when workflow A ends::

        workflows = HarvestWorkflows.sql(db, app)
        triggers = HarvestTriggers(
            app,
            triggers=[CompletionTrigger("etl_ingest", "daily_report", input_mapping=Projection("summary"))],
        )

    Static triggers are upserted into ``harvest_completion_triggers`` at ``init_app`` (full
    replacement of a row with the same id; rows registered through the admin API stay). The admin
    API is registered under ``HARVEST_WORKFLOW_API_PREFIX``.

    :param triggers: the static triggers.
    :param create_tables: create the trigger tables at ``init_app`` if missing.
    :raises ConfigurationError: a static trigger is not a :class:`CompletionTrigger`, or two share
        an id.
    """

    def __init__(
        self,
        app: Flask | None = None,
        *,
        triggers: Iterable[CompletionTrigger] = (),
        create_tables: bool = True,
    ) -> None:
        self._static: list[CompletionTrigger] = []
        self._create_tables = create_tables
        self.completion_triggers(triggers)
        if app is not None:
            self.init_app(app)

    def __repr__(self) -> str:
        return f"<HarvestTriggers static={len(self._static)}>"

    def completion_trigger(self, trigger: CompletionTrigger) -> CompletionTrigger:
        """Add a static trigger (synced by ``init_app``, so add it before)."""
        if not isinstance(trigger, CompletionTrigger):
            raise ConfigurationError(
                f"a static completion trigger must be a CompletionTrigger, not {type(trigger).__name__}"
            )
        for known in self._static:
            if known.id == trigger.id and known != trigger:
                raise ConfigurationError(
                    f"two static completion triggers have the id {trigger.id} "
                    f"({known.source_workflow_name} -> {known.target_workflow_name} and "
                    f"{trigger.source_workflow_name} -> {trigger.target_workflow_name}); give each its own id"
                )
        if trigger not in self._static:
            self._static.append(trigger)
        return trigger

    def completion_triggers(self, triggers: Iterable[CompletionTrigger]) -> None:
        """Add several static triggers."""
        for trigger in triggers:
            self.completion_trigger(trigger)

    def init_app(self, app: Flask) -> None:
        """Add triggers to ``app``'s engine, sync the static ones and register the admin API.

        :raises ConfigurationError: the app has no workflows, or has triggers already.
        """
        engine = get_engine(app)
        if engine.workflows is None:
            raise ConfigurationError(
                "completion triggers need workflows: register HarvestWorkflows on the app first"
            )
        store = SqlTriggerStore(engine.workflows.store.engine)
        if self._create_tables:
            store.ensure_schema()
        service = add_triggers(engine, store, listener=_signal_listener(app))
        service.sync(self._static)
        app.register_blueprint(trigger_admin, url_prefix=engine.settings.workflow_api_prefix)

    @property
    def service(self) -> TriggerService:
        """The trigger service of the current app (needs an app context)."""
        return trigger_service()


def trigger_service(app: Flask | None = None) -> TriggerService:
    """Return the completion-trigger service of ``app`` (default: the current app).

    :raises ConfigurationError: no triggers are registered on the app.
    """
    service = get_engine(app).triggers
    if service is None:
        raise ConfigurationError(
            "completion triggers are not registered on this app: use HarvestTriggers(app)"
        )
    return service


def _signal_listener(app: Flask) -> FireListener:
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
