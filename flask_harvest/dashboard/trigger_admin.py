"""Triggers from the console: delete after a confirmation; triggers declared in the app's code
shown read-only.

A trigger declared in code (``Harvest.completion_trigger``) is written over from the code at every
start-up, so an edit or a delete here would not last: the pages say so and refuse both (409).
Thin over :meth:`~flask_harvest.triggers.service.TriggerService.delete`, as the admin API's
``DELETE`` is. Every POST carries the session's CSRF token (the blueprint checks it).
"""

from __future__ import annotations

from flask import redirect, url_for
from werkzeug.wrappers import Response as BaseResponse

from ._core import dashboard, unconfirmed
from .triggers import refuse_code_defined, triggers_service


@dashboard.route("/triggers/<trigger_id>/delete", methods=["GET", "POST"])
def delete_trigger(trigger_id: str) -> BaseResponse | tuple[str, int]:
    """Delete a trigger and its fires rows, on a confirmation page: the POST acts only with its
    box ticked."""
    service = triggers_service()
    stored = service.get(trigger_id)
    refuse_code_defined(service, stored)
    page = unconfirmed("triggers/delete.html", "the trigger was kept", trigger=stored)
    if page is not None:
        return page
    service.delete(stored.id)
    return redirect(url_for(".triggers", done="deleted"), 303)
