"""The completion-trigger admin API, under the workflow API prefix (``HARVEST_WORKFLOW_API_PREFIX``).

``GET /admin/completion-triggers``, ``POST /admin/completion-triggers`` (full-replacement upsert,
201), ``GET`` and ``DELETE /admin/completion-triggers/<id>``, ``GET .../<id>/fires``. Guarded like
every admin blueprint (:mod:`flask_harvest.admin_http`). The POST body is decoded by
:func:`~flask_harvest.triggers.definitions.trigger_from_json` itself, whatever its content type, so
every invalid shape gets the same 400 JSON error naming the field.
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from .._app import get_engine
from ..admin_http import ApiError, install_admin_api
from ..errors import ConfigurationError, InvalidFieldError
from .definitions import trigger_from_json, trigger_to_json
from .service import TriggerService, fire_to_json, stored_to_json

__all__ = ["trigger_admin"]

trigger_admin = Blueprint("harvest_completion_triggers", __name__)
install_admin_api(trigger_admin, realm="harvest-completion-triggers")

_ROOT = "/admin/completion-triggers"


def _service() -> TriggerService:
    service = get_engine().triggers
    if service is None:
        raise ConfigurationError("completion triggers are not registered on this app: use HarvestTriggers")
    return service


def _bad_request(exc: InvalidFieldError) -> ApiError:
    return ApiError(400, "invalid_trigger", str(exc), {exc.field: [exc.message]})


@trigger_admin.get(_ROOT)
def list_triggers() -> Response:
    """Every registered trigger, oldest first; ``condition`` is always present (``null``: none)."""
    return jsonify([stored_to_json(stored) for stored in _service().list_triggers()])


@trigger_admin.post(_ROOT)
def register_trigger() -> tuple[Response, int]:
    """Register or replace a trigger (every field: an omitted ``condition`` clears the stored one)."""
    try:
        data = request.get_json(force=True, silent=True)
    except RecursionError:
        raise ApiError(400, "bad_json", "the body is nested too deeply") from None
    if data is None:
        raise ApiError(400, "bad_json", "the body is not valid JSON")
    try:
        trigger = trigger_from_json(data)
    except InvalidFieldError as exc:
        raise _bad_request(exc) from None
    except RecursionError:
        raise ApiError(400, "invalid_trigger", "the body is nested too deeply") from None
    return jsonify(trigger_to_json(_service().register(trigger))), 201


@trigger_admin.get(f"{_ROOT}/<trigger_id>")
def show_trigger(trigger_id: str) -> Response:
    return jsonify(stored_to_json(_service().get(trigger_id)))


@trigger_admin.delete(f"{_ROOT}/<trigger_id>")
def delete_trigger(trigger_id: str) -> tuple[str, int]:
    """Delete a trigger and its fires rows."""
    _service().delete(trigger_id)
    return "", 204


@trigger_admin.get(f"{_ROOT}/<trigger_id>/fires")
def list_fires(trigger_id: str) -> Response:
    """The trigger's fires-ledger rows, newest first (``?limit=``, 1 to 500, default 100)."""
    service = _service()
    service.get(trigger_id)
    raw = request.args.get("limit", "100")
    try:
        limit = int(raw)
    except ValueError:
        raise ApiError(400, "invalid_query", "limit must be an integer between 1 and 500") from None
    try:
        fires = service.fires(trigger_id=trigger_id, limit=limit)
    except InvalidFieldError as exc:
        raise ApiError(400, "invalid_query", str(exc), {exc.field: [exc.message]}) from None
    return jsonify([fire_to_json(fire) for fire in fires])
