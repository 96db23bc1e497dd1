"""The completion-delivery admin routes, under the workflow API prefix (``/api/harvest``).

``GET /workflows/<execution_id>/completion-deliveries`` lists every delivery by ``callback_index``;
``POST /workflows/<execution_id>/completion-deliveries/<delivery_id>/redrive`` (body ``{}``, sent
as ``application/json`` like every admin write) sends a ``FAILED`` one again. Admin-guarded by
:func:`flask_harvest.http.admin.install_admin_api`.
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify
from marshmallow import Schema

from .._app import get_engine
from ..http.admin import ApiError, install_admin_api, load_body
from .service import CompletionCallbacks

__all__ = ["completion_blueprint"]

_blueprint = Blueprint("harvest_completion_callbacks", __name__)
install_admin_api(_blueprint, realm="harvest-workflows")


def completion_blueprint() -> Blueprint:
    """The blueprint of the completion-delivery routes (register it at the workflow API prefix)."""
    return _blueprint


def _callbacks() -> CompletionCallbacks:
    callbacks = get_engine().callbacks
    if callbacks is None:
        raise ApiError(404, "not_found", "workflows are not registered on this app")
    return callbacks


@_blueprint.get("/workflows/<execution_id>/completion-deliveries")
def list_deliveries(execution_id: str) -> Response:
    rows = _callbacks().deliveries(execution_id)
    return jsonify(deliveries=[row.to_json() for row in rows])


class RedriveSchema(Schema):
    """A redrive takes no fields; its body is ``{}``."""


@_blueprint.post("/workflows/<execution_id>/completion-deliveries/<delivery_id>/redrive")
def redrive_delivery(execution_id: str, delivery_id: str) -> Response:
    # A JSON body, though there is nothing in it: a cross-site form cannot send one.
    load_body(RedriveSchema())
    return jsonify(outcome=_callbacks().redrive(execution_id, delivery_id))
