"""The workflow pages: the overview panel, executions, an execution with its steps, completion
deliveries and trigger fires, cancel and terminate (after a confirmation), redrive.

Shown only when the app uses workflows. Thin over the services the workflow HTTP API uses
(:class:`~flask_harvest.workflows.service.WorkflowService`,
:class:`~flask_harvest.callbacks.service.CompletionCallbacks`,
:class:`~flask_harvest.triggers.service.TriggerService`): the same checks, the same errors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flask import redirect, request, url_for
from werkzeug.exceptions import NotFound
from werkzeug.wrappers import Response as BaseResponse

from .._app import get_engine
from ..callbacks.service import CompletionCallbacks
from ..engine import HarvestEngine
from ..http.forms import form_text, query_text
from ..workflows.models import Execution, ExecutionState, JsonValue
from ..workflows.service import WorkflowService
from ._core import NAV, PANELS, NavEntry, Panel, dashboard, render_page, unconfirmed
from .paging import PAGE_SIZE, Page, pager
from .timeline import run_timeline
from .when import page_now

STATES = [state.value for state in ExecutionState]
#: Executions counted per state on the overview at most (an index walk that stops there): the
#: deliveries' cap, so the overview costs the same at a thousand rows as at millions.
COUNT_CAP = 1_000
#: Trigger fires shown on an execution's page.
RECENT_FIRES = 100
#: Child runs shown on an execution's page (the CLI and the HTTP API page through all of them).
SHOWN_CHILDREN = 100
#: Cancel and terminate: what each does, for the confirmation page.
ACTIONS = {
    "cancel": "Cancel asks the run to stop: a pending run ends Cancelled now, a running one at its "
    "next step or sleep boundary.",
    "terminate": "Terminate ends the run Terminated at once: its code can record nothing more, "
    "even in the middle of a step.",
}
#: Notices after an action, by the ``done`` query parameter of the redirect.
NOTICES = {
    "cancel": "Cancel requested.",
    "terminate": "Terminated.",
    "forked": "The fork was created: this new run started from a copy of its source's steps.",
    "redriven": "The completion delivery was redriven: it is due now, with the same id.",
    "not_failed": "That completion delivery has not failed: nothing was changed.",
    "started": "Started.",
    "already_open": "A run with that workflow_id is open: this is it (nothing new was started).",
}


def uses_workflows(engine: HarvestEngine) -> bool:
    return engine.workflows is not None


NAV.append(NavEntry("Workflows", "harvest_dashboard.workflows", uses_workflows, order=20))


def workflows_service() -> WorkflowService:
    """The app's workflow service; a 404 page on an app without workflows."""
    service = get_engine().workflows
    if service is None:
        raise NotFound("This app does not use workflows.")
    return service


def _overview(engine: HarvestEngine) -> Mapping[str, Any]:
    assert engine.workflows is not None  # the panel is shown only then
    counts = engine.workflows.state_counts(cap=COUNT_CAP)
    return {"counts": {state.value: n for state, n in counts.items()}, "cap": COUNT_CAP, "states": STATES}


PANELS.append(Panel(20, "harvest_dashboard/workflows/_overview_panel.html", _overview, uses_workflows))


def pretty(value: JsonValue) -> str:
    """A JSON value as indented text for a ``<pre>`` (the template escapes it)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


@dashboard.get("/workflows")
def workflows() -> tuple[str, int]:
    """Executions newest first, filtered by workflow name and state; keyset pages."""
    service = workflows_service()
    name, state = query_text("name"), query_text("state")
    cursor = query_text("cursor")

    def fetch(at: str | None, limit: int) -> tuple[list[Execution], str | None]:
        return service.list_executions(name=name, state=state, cursor=at, limit=limit)

    items, next_cursor = fetch(cursor, PAGE_SIZE)
    filters = {"name": name or "", "state": state or ""}
    return render_page(
        "workflows/executions.html",
        page=Page(items, next_cursor),
        pages=pager(
            "harvest_dashboard.workflows",
            filters,
            cursor,
            Page(items, next_cursor),
            fetch,
            lambda cap: service.count_executions(name=name, state=state, cap=cap),
        ),
        states=STATES,
        names=service.registry.names(),
        filters=filters,
    )


def _execution_page(execution_id: str, *, notice: str = "") -> tuple[str, int]:
    engine = get_engine()
    service = workflows_service()
    execution = service.get(execution_id)
    callbacks: CompletionCallbacks | None = engine.callbacks
    deliveries = callbacks.deliveries(execution.execution_id) if callbacks is not None else []
    fires = (
        engine.triggers.fires(source_exec_id=execution.execution_id, limit=RECENT_FIRES)
        if engine.triggers is not None
        else None
    )
    children, more_children = service.children(execution.execution_id, limit=SHOWN_CHILDREN)
    steps = service.steps(execution.execution_id)
    return render_page(
        "workflows/execution.html",
        execution=execution,
        children=children,
        more_children=more_children is not None,
        steps=steps,
        **run_timeline(execution, steps, page_now()),
        deliveries=deliveries,
        fires=fires,
        notice=notice,
        pretty=pretty,
    )


@dashboard.get("/workflows/<execution_id>")
def execution(execution_id: str) -> tuple[str, int]:
    return _execution_page(execution_id, notice=NOTICES.get(request.args.get("done", ""), ""))


@dashboard.route("/workflows/<execution_id>/cancel", methods=["GET", "POST"], defaults={"action": "cancel"})
@dashboard.route(
    "/workflows/<execution_id>/terminate", methods=["GET", "POST"], defaults={"action": "terminate"}
)
def end_execution(execution_id: str, action: str) -> BaseResponse | tuple[str, int]:
    """Cancel or terminate, on a confirmation page: the POST acts only with its box ticked. Given a
    run that continued as new, the action is on its chain's last run."""
    service = workflows_service()
    found = service.last_run(execution_id)
    reason = form_text("reason", max_chars=1000) or None  # nothing on a GET
    page = unconfirmed(
        "workflows/confirm.html",
        f"the run was left as it is (no {action})",
        execution=found,
        action=action,
        explain=ACTIONS[action],
        reason=reason or "",
    )
    if page is not None:
        return page
    if action == "cancel":
        service.cancel(found.execution_id, reason)
    else:
        service.terminate(found.execution_id, reason)
    return redirect(url_for(".execution", execution_id=found.execution_id, done=action), 303)


@dashboard.post("/workflows/<execution_id>/completion-deliveries/<delivery_id>/redrive")
def redrive(execution_id: str, delivery_id: str) -> BaseResponse:
    """Send a failed completion delivery again (same id, same bytes, a fresh attempt budget)."""
    found = workflows_service().get(execution_id)
    callbacks = get_engine().callbacks
    if callbacks is None:
        raise NotFound("This app has no completion callbacks.")
    outcome = callbacks.redrive(found.execution_id, delivery_id)
    return redirect(url_for(".execution", execution_id=found.execution_id, done=outcome), 303)
