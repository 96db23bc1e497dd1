"""The workflow schedules page: every schedule with its cron text, last and next tick, and a pause
or resume button (a POST with the dashboard's CSRF token, like cancel and terminate).

Shown only when the app uses workflows. Thin over
:class:`~flask_harvest.workflows.schedules.WorkflowSchedules`, which the HTTP API and the CLI use.
"""

from __future__ import annotations

from flask import redirect, request, url_for
from werkzeug.exceptions import NotFound
from werkzeug.wrappers import Response as BaseResponse

from .._app import get_engine
from ..engine import HarvestEngine
from ..workflows.schedules import WorkflowSchedules
from ._core import NAV, NavEntry, dashboard, render_page

#: Notices after an action, by the ``done`` query parameter of the redirect.
NOTICES = {
    "pause": "Paused: no tick starts a run until it is resumed.",
    "resume": "Resumed: the next tick starts a run; the ticks missed while paused do not.",
}


def uses_schedules(engine: HarvestEngine) -> bool:
    return engine.schedules is not None


NAV.append(NavEntry("Schedules", "harvest_dashboard.schedules", uses_schedules, order=25))


def schedules_service() -> WorkflowSchedules:
    """The app's workflow schedules; a 404 page on an app without workflows."""
    schedules = get_engine().schedules
    if schedules is None:
        raise NotFound("This app does not use workflows.")
    return schedules


@dashboard.get("/workflow-schedules")
def schedules() -> tuple[str, int]:
    """Every schedule, by name."""
    return render_page(
        "schedules/list.html",
        schedules=schedules_service().list_schedules(),
        notice=NOTICES.get(request.args.get("done", ""), ""),
    )


@dashboard.post("/workflow-schedules/<name>/pause", defaults={"action": "pause"})
@dashboard.post("/workflow-schedules/<name>/resume", defaults={"action": "resume"})
def change_schedule(name: str, action: str) -> BaseResponse:
    """Pause or resume a schedule (an unknown one is a 404 page and changes nothing)."""
    service = schedules_service()
    if action == "pause":
        service.pause(name)
    else:
        service.resume(name)
    return redirect(url_for(".schedules", done=action), 303)
