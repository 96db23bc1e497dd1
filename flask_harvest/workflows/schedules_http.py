"""The workflow schedules' HTTP API, under the workflow API prefix (``HARVEST_WORKFLOW_API_PREFIX``).

``GET /workflow-schedules`` lists them; ``GET /workflow-schedules/<name>`` shows one;
``POST /workflow-schedules/<name>/pause`` and ``.../resume`` (a JSON object body, ``{}``: a
cross-site form cannot send one) change one. Outside ``/workflows/``, so no schedule name can be
taken for an execution id. Guarded like every admin blueprint (:mod:`flask_harvest.http.admin`):
404 an unknown schedule, 400 a body that is not a JSON object, 415 one not sent as JSON, 422 a
field the body must not have.
"""

from __future__ import annotations

import logging

from flask import Blueprint, Flask, Response, jsonify
from werkzeug.exceptions import NotFound

from .._app import get_engine
from ..errors import InvalidFieldError, StoreError
from ..http.admin import ApiError, install_admin_api, no_such_route, read_json
from ..jobs.base import JobBackend
from .schedules import WorkflowSchedules, schedule_to_dict

__all__ = ["install_schedules", "schedules_api"]

log = logging.getLogger(__name__)

schedules_api = Blueprint("harvest_workflow_schedules", __name__)
install_admin_api(schedules_api, realm="harvest-workflow-schedules")

_ROOT = "/workflow-schedules"


def install_schedules(
    app: Flask, schedules: WorkflowSchedules, backend: JobBackend, *, prefix: str, create_tables: bool
) -> None:
    """Create the schedules table (unless migrations own the schema), write the declared schedules
    into it, start the sweeps where this process runs them (the local backend), and register the
    HTTP API under the workflow API prefix."""
    if create_tables:
        schedules.store.ensure_schema()
    if schedules.declared():
        try:
            schedules.sync()
        except StoreError as exc:
            # Migrations may not have created the table yet: the app still starts, and every sweep
            # tries the sync again (and says so in the log) until they have.
            log.warning("harvest: could not write the workflow schedules yet (%s); the sweeper retries", exc)
        backend.start_sweeping()
    app.register_blueprint(schedules_api, url_prefix=prefix)


def _schedules() -> WorkflowSchedules:
    schedules = get_engine().schedules
    if schedules is None:  # pragma: no cover - the blueprint is registered only with schedules
        raise NotFound()
    return schedules


def _empty_body() -> None:
    data = read_json()
    if not isinstance(data, dict):
        raise ApiError(400, "bad_json", "the body must be a JSON object ({} will do)")
    for key in data:
        field = key if isinstance(key, str) and key.isprintable() and len(key) <= 100 else "body"
        error = InvalidFieldError(field, "is not a field of this request: send {}")
        raise ApiError(422, "validation_error", str(error), {field: [error.message]})


@schedules_api.get(_ROOT)
def list_schedules() -> Response:
    """Every schedule, by name: cron text, paused, last tick handled, next tick."""
    return jsonify({"schedules": [schedule_to_dict(v) for v in _schedules().list_schedules()]})


@schedules_api.get(f"{_ROOT}/<name>")
def show_schedule(name: str) -> Response:
    return jsonify(schedule_to_dict(_schedules().get(name)))


@schedules_api.post(f"{_ROOT}/<name>/pause")
def pause_schedule(name: str) -> Response:
    """Pause: no tick starts a run until it is resumed (pausing a paused schedule changes nothing)."""
    _empty_body()  # first, as on every admin write: a cross-site form gets a 415, whatever the name
    return jsonify(schedule_to_dict(_schedules().pause(name)))


@schedules_api.post(f"{_ROOT}/<name>/resume")
def resume_schedule(name: str) -> Response:
    """Resume: the next tick from now starts a run; the ticks that fell while paused do not."""
    _empty_body()
    return jsonify(schedule_to_dict(_schedules().resume(name)))


_ALL = ["GET", "POST", "PUT", "PATCH", "DELETE"]


@schedules_api.route(_ROOT, methods=["POST", "PUT", "PATCH", "DELETE"])
@schedules_api.route(f"{_ROOT}/", methods=_ALL)
@schedules_api.route(f"{_ROOT}/<anypath:path>", methods=_ALL)
def unknown_route(path: str = "") -> tuple[Response, int]:
    """Anything else under ``/workflow-schedules``: a JSON 404, or 405 with ``Allow``."""
    return no_such_route()
