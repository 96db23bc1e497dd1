"""Where a Flask app keeps its engine: the one lookup the extension, blueprints, CLI and worker share."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import Flask, current_app

from .errors import ConfigurationError

if TYPE_CHECKING:
    from .engine import HarvestEngine
    from .triggers.service import TriggerService
    from .workflows.service import WorkflowService

#: The key of the engine in ``app.extensions``.
EXTENSION_KEY = "harvest"
#: The key of the app's :class:`~flask_harvest.metrics.MetricsExposition` (``HARVEST_METRICS``).
METRICS_KEY = "harvest_metrics"


def get_engine(app: Flask | None = None) -> HarvestEngine:
    """Return the engine registered on ``app`` (default: the current app).

    :raises ConfigurationError: flask-harvest is not registered on the app.
    """
    target = app if app is not None else current_app
    try:
        engine: HarvestEngine = target.extensions[EXTENSION_KEY]
    except KeyError:
        raise ConfigurationError(
            "flask-harvest is not registered on this app; call Harvest(...).init_app(app)"
        ) from None
    return engine


def workflow_service(app: Flask | None = None) -> WorkflowService:
    """Return the workflow service of ``app`` (default: the current app).

    :raises ConfigurationError: flask-harvest, or workflows, are not registered on the app.
    """
    service = get_engine(app).workflows
    if service is None:
        raise ConfigurationError(
            "workflows are off on this app: give Harvest the app's Flask-SQLAlchemy db "
            "(Harvest(app, db)) and leave workflows on"
        )
    return service


def trigger_service(app: Flask | None = None) -> TriggerService:
    """Return the completion-trigger service of ``app`` (default: the current app).

    :raises ConfigurationError: flask-harvest, or completion triggers, are not on the app.
    """
    service = get_engine(app).triggers
    if service is None:
        raise ConfigurationError(
            "completion triggers are off on this app: they need workflows (Harvest(app, db)) "
            "and triggers left on"
        )
    return service
