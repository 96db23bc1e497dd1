"""Bulk replay from the deliveries list: the dead-lettered rows shown have checkboxes, and the
list's form replays the selected ones or every one shown.

Thin over :meth:`~flask_harvest.webhooks.operations.WebhookOperations.replay_selected`: each is
replayed on its own, and one another operator replayed meanwhile is reported, not an error. The
POST carries the session's CSRF token (the blueprint checks it).
"""

from __future__ import annotations

from .._app import get_engine
from .._input import text_problem
from ..errors import InvalidFieldError
from ..http.forms import MAX_FIELD_CHARS, form_text, posted_form
from ._core import dashboard, render_page
from .paging import PAGE_SIZE

#: The most ids one form may send: a page's rows.
MAX_SELECTED = PAGE_SIZE


def posted_ids(name: str) -> list[str]:
    """The form's ids under ``name`` (a checkbox per row), at most :data:`MAX_SELECTED`; refuse
    bad text (422 naming the field)."""
    values = posted_form().getlist(name)
    if len(values) > MAX_SELECTED:
        raise InvalidFieldError(name, f"holds more than {MAX_SELECTED} deliveries")
    for value in values:
        problem = text_problem(value) if value else None
        if problem is not None or len(value) > MAX_FIELD_CHARS:
            raise InvalidFieldError(name, problem or f"is longer than {MAX_FIELD_CHARS} characters")
    return [value.strip() for value in values if value.strip()]


@dashboard.post("/webhooks/deliveries/replay-selected")
def replay_selected() -> tuple[str, int]:
    """Replay the checked dead-lettered deliveries (``action=selected``) or every one the page
    showed (``action=all``); the answer lists what was replayed and what was not, and why."""
    action = form_text("action", required=True, max_chars=16)
    if action not in ("selected", "all"):
        raise InvalidFieldError("action", "must be selected or all")
    chosen = posted_ids("delivery_id") if action == "selected" else posted_ids("shown")
    if not chosen:
        raise InvalidFieldError("delivery_id", "tick at least one delivery to replay")
    result = get_engine().operations.replay_selected(chosen)
    return render_page("webhooks/replay_selected.html", result=result, action=action)
