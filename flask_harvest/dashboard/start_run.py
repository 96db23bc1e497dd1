"""*Start a run…*: start a workflow run from the console, its name chosen among the workflows
registered in this app.

The form's fields become the workflow API's start body and go through the same
:class:`~flask_harvest.workflows.schemas.StartSchema` and
:meth:`~flask_harvest.workflows.service.WorkflowService.start`, so the console refuses exactly
what the API refuses. The POST carries the session's CSRF token (the blueprint checks it).
"""

from __future__ import annotations

from typing import Any

from flask import redirect, request, url_for
from marshmallow import ValidationError
from werkzeug.wrappers import Response as BaseResponse

from .._input import parse_json
from ..errors import HarvestError
from ..http.admin import error_answer
from ..http.forms import form_text
from ..workflows.models import IdReusePolicy
from ..workflows.schemas import StartSchema
from ._core import dashboard, render_page
from .workflows import workflows_service

#: The longest input text the form takes (the service then applies the input size limit).
MAX_INPUT_CHARS = 64 * 1024
POLICIES = [policy.value for policy in IdReusePolicy]


def _page(form: dict[str, str], *, error: str = "", status: int = 200) -> tuple[str, int]:
    return render_page(
        "workflows/start.html",
        status=status,
        form=form,
        error=error,
        names=workflows_service().registry.names(),
        policies=POLICIES,
    )


@dashboard.route("/workflows/start", methods=["GET", "POST"])
def start_run() -> BaseResponse | tuple[str, int]:
    """Start a run of a registered workflow; on success open its page."""
    service = workflows_service()
    if request.method == "GET":
        return _page({"name": "", "input": "null", "policy": POLICIES[0]})
    form = {
        "name": form_text("name", required=True, max_chars=255),
        "input": form_text("input", max_chars=MAX_INPUT_CHARS),
        "workflow_id": form_text("workflow_id", max_chars=255),
        "policy": form_text("policy", max_chars=32) or POLICIES[0],
    }
    body: dict[str, Any] = {"id_reuse_policy": form["policy"]}
    if form["workflow_id"]:
        body["workflow_id"] = form["workflow_id"]
    try:
        body["input"] = parse_json(form["input"] or "null", "input")
        loaded = StartSchema().load(body)
        policy = loaded["id_reuse_policy"]
        workflow_id = loaded.get("workflow_id")
        handle, created = service.start(form["name"], loaded["input"], workflow_id=workflow_id, policy=policy)
    except (HarvestError, ValidationError) as exc:
        # The form comes back with what was typed and the API's error; nothing was started.
        answer = error_answer(exc, "harvest dashboard")
        fields = answer.details.get("fields") if answer.details else None
        message = f"{answer.message}: {fields}" if fields else answer.message
        return _page(form, error=message, status=answer.status)
    done = "started" if created else "already_open"
    return redirect(url_for(".execution", execution_id=handle.execution_id, done=done), 303)
