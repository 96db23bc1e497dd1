"""The completion-trigger pages: the overview panel, the list, a trigger with its recent fires and
skips, register and edit.

Shown only when the app uses triggers. The form's fields become the admin API's registration body
and go through the same :func:`~flask_harvest.triggers.definitions.trigger_from_json` and
:meth:`~flask_harvest.triggers.service.TriggerService.register`, so the dashboard refuses exactly
what the API refuses, with the same message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flask import redirect, request, url_for
from werkzeug.exceptions import Conflict, NotFound
from werkzeug.wrappers import Response as BaseResponse

from .._app import get_engine
from .._input import parse_json
from ..engine import HarvestEngine
from ..errors import InvalidFieldError
from ..http.forms import MAX_FIELD_CHARS, form_text, posted_form, query_text
from ..triggers.definitions import TERMINAL_STATE_NAMES, trigger_from_json
from ..triggers.service import TriggerService, stored_to_json
from ..triggers.store import StoredTrigger
from ._core import NAV, PANELS, NavEntry, Panel, dashboard, render_page
from .paging import PAGE_SIZE, Page, pager

#: Fires-ledger rows shown on a trigger's page and on the overview.
RECENT_FIRES = 100
RECENT_ON_OVERVIEW = 10
#: The longest JSON text a mapping or condition textarea takes.
MAX_JSON_CHARS = 64 * 1024
PASSTHROUGH = '{"type": "Passthrough"}'


def uses_triggers(engine: HarvestEngine) -> bool:
    return engine.triggers is not None


NAV.append(NavEntry("Triggers", "harvest_dashboard.triggers", uses_triggers, order=30))


#: What the pages of a trigger declared in code say.
CODE_DEFINED = (
    "This trigger is declared in the app's code: it is read-only here, because the next start-up "
    "writes it over again from the code. Change or remove it there."
)


def refuse_code_defined(service: TriggerService, stored: StoredTrigger) -> None:
    """Refuse (409) to change a trigger declared in code: the next start-up would undo it."""
    if stored.id in service.code_defined:
        raise Conflict(CODE_DEFINED)


def triggers_service() -> TriggerService:
    """The app's trigger service; a 404 page on an app without triggers."""
    service = get_engine().triggers
    if service is None:
        raise NotFound("This app does not use completion triggers.")
    return service


def _overview(engine: HarvestEngine) -> Mapping[str, Any]:
    assert engine.triggers is not None  # the panel is shown only then
    shown = [stored_to_json(stored) for stored in engine.triggers.list_triggers()]
    return {
        "count": len(shown),
        "invalid": [t for t in shown if "invalid" in t],
        "fires": engine.triggers.fires(limit=RECENT_ON_OVERVIEW),
    }


PANELS.append(Panel(30, "harvest_dashboard/triggers/_overview_panel.html", _overview, uses_triggers))


@dashboard.get("/triggers")
def triggers() -> tuple[str, int]:
    """The registered triggers, oldest first; keyset pages."""
    service = triggers_service()
    cursor = query_text("cursor")

    def fetch(at: str | None, limit: int) -> tuple[list[Any], str | None]:
        return service.triggers_page(limit=limit, cursor=at)

    stored, next_cursor = fetch(cursor, PAGE_SIZE)
    page = Page([stored_to_json(t) for t in stored], next_cursor)
    return render_page(
        "triggers/list.html",
        page=page,
        pages=pager("harvest_dashboard.triggers", {}, cursor, page, fetch),
        code_defined=service.code_defined,
        notice="Deleted." if request.args.get("done") == "deleted" else "",
    )


@dashboard.get("/triggers/<trigger_id>")
def trigger(trigger_id: str) -> tuple[str, int]:
    service = triggers_service()
    stored = service.get(trigger_id)
    notice = "Saved." if request.args.get("done") == "saved" else ""
    return render_page(
        "triggers/trigger.html",
        trigger=stored_to_json(stored),
        code_defined=CODE_DEFINED if stored.id in service.code_defined else "",
        fires=service.fires(trigger_id=stored.id, limit=RECENT_FIRES),
        notice=notice,
        pretty=_pretty,
    )


@dashboard.route("/triggers/new", methods=["GET", "POST"])
def new_trigger() -> BaseResponse | tuple[str, int]:
    """Register a trigger: the admin API's ``POST /admin/completion-triggers`` as a form."""
    triggers_service()  # a 404 page on an app without triggers
    if request.method == "GET":
        form = {"terminal_states": ["Completed"], "input_mapping": PASSTHROUGH, "condition": ""}
        return _form_page(form, trigger_id=None)
    return _save(trigger_id=None)


@dashboard.route("/triggers/<trigger_id>/edit", methods=["GET", "POST"])
def edit_trigger(trigger_id: str) -> BaseResponse | tuple[str, int]:
    """Edit a trigger: a full replacement of its definition (an empty condition clears it)."""
    service = triggers_service()
    stored = service.get(trigger_id)
    refuse_code_defined(service, stored)
    if request.method == "POST":
        return _save(trigger_id=stored.id)
    shown = stored_to_json(stored)
    form = {
        "source_workflow_name": stored.source_workflow_name,
        "target_workflow_name": stored.target_workflow_name,
        "terminal_states": shown["terminal_states"],
        # As registered; a row that no longer parses is shown as stored, to be fixed here.
        "input_mapping": _pretty(shown["input_mapping"]) if "invalid" not in shown else stored.input_mapping,
        "condition": (
            (stored.condition or "")
            if "invalid" in shown
            else ("" if shown["condition"] is None else _pretty(shown["condition"]))
        ),
    }
    return _form_page(form, trigger_id=stored.id)


def _save(trigger_id: str | None) -> BaseResponse | tuple[str, int]:
    service = triggers_service()
    form: dict[str, Any] = {
        "source_workflow_name": form_text("source_workflow_name"),
        "target_workflow_name": form_text("target_workflow_name"),
        "terminal_states": _form_list("terminal_states"),
        "input_mapping": form_text("input_mapping", max_chars=MAX_JSON_CHARS),
        "condition": form_text("condition", max_chars=MAX_JSON_CHARS),
    }
    if trigger_id is None and form_text("id", max_chars=64):
        form["id"] = form_text("id", max_chars=64)
    try:
        body = _body(form, trigger_id)
        saved = service.register(trigger_from_json(body))
    except InvalidFieldError as exc:
        # The admin API's 400 for the same definition, with its message; nothing was stored.
        return _form_page(form, trigger_id=trigger_id, error=str(exc), status=400)
    return redirect(url_for(".trigger", trigger_id=saved.id, done="saved"), 303)


def _body(form: Mapping[str, Any], trigger_id: str | None) -> dict[str, Any]:
    """The admin API's registration body that the form's fields stand for."""
    body: dict[str, Any] = {
        "terminal_states": form["terminal_states"],
        "input_mapping": parse_json(form["input_mapping"] or PASSTHROUGH, "input_mapping"),
    }
    for name in ("source_workflow_name", "target_workflow_name"):
        if form[name]:  # an empty field is a missing one: "is required"
            body[name] = form[name]
    if form["condition"]:
        body["condition"] = parse_json(form["condition"], "condition")
    ident = trigger_id or form.get("id")
    if ident:
        body["id"] = ident
    return body


def _form_list(name: str) -> list[str]:
    values = posted_form().getlist(name)
    if len(values) > len(TERMINAL_STATE_NAMES) * 2:
        raise InvalidFieldError(name, "has too many values")
    for value in values:
        if len(value) > MAX_FIELD_CHARS:
            raise InvalidFieldError(name, f"has a value longer than {MAX_FIELD_CHARS} characters")
    return values


def _form_page(
    form: Mapping[str, Any], *, trigger_id: str | None, error: str = "", status: int = 200
) -> tuple[str, int]:
    workflows = get_engine().workflows
    return render_page(
        "triggers/form.html",
        status=status,
        form=form,
        trigger_id=trigger_id,
        # A message may quote a value from the JSON (a lone surrogate there is written escaped).
        error=error.encode("utf-8", "backslashreplace").decode("utf-8"),
        states=TERMINAL_STATE_NAMES,
        names=workflows.registry.names() if workflows is not None else [],
    )


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)
