"""The failed completion-callback deliveries of every execution, with bulk redrive.

Shown only when the app sends completion callbacks. Thin over
:class:`~flask_harvest.callbacks.service.CompletionCallbacks`: a redrive here is the execution
page's *Redrive* (same ``delivery_id``, same bytes, a fresh attempt budget, due now), for the
ticked rows or every row shown. The POST carries the session's CSRF token (the blueprint checks it).
"""

from __future__ import annotations

from werkzeug.exceptions import NotFound

from .._app import get_engine
from ..callbacks.service import CompletionCallbacks
from ..callbacks.store import CompletionDelivery
from ..engine import HarvestEngine
from ..errors import InvalidFieldError
from ..http.forms import form_text, query_text
from ._core import NAV, NavEntry, dashboard, render_page
from .dlq_select import MAX_SELECTED, posted_ids
from .paging import PAGE_SIZE, Page, pager


def uses_callbacks(engine: HarvestEngine) -> bool:
    return engine.callbacks is not None


NAV.append(NavEntry("Failed callbacks", "harvest_dashboard.failed_callbacks", uses_callbacks, order=25))


def callbacks_service() -> CompletionCallbacks:
    """The app's completion callbacks; a 404 page on an app without them."""
    service = get_engine().callbacks
    if service is None:
        raise NotFound("This app does not send completion callbacks.")
    return service


@dashboard.get("/workflows/completion-deliveries/failed")
def failed_callbacks() -> tuple[str, int]:
    """``FAILED`` completion deliveries of every execution, the latest to fail first; keyset pages."""
    service = callbacks_service()
    cursor = query_text("cursor")

    def fetch(at: str | None, limit: int) -> tuple[list[CompletionDelivery], str | None]:
        return service.failed_page(limit=limit, cursor=at)

    items, next_cursor = fetch(cursor, PAGE_SIZE)
    page = Page(items, next_cursor)
    return render_page(
        "workflows/failed_callbacks.html",
        page=page,
        pages=pager(
            "harvest_dashboard.failed_callbacks",
            {},
            cursor,
            page,
            fetch,
            lambda cap: service.count_failed(cap=cap),
        ),
    )


@dashboard.post("/workflows/completion-deliveries/redrive-selected")
def redrive_selected_callbacks() -> tuple[str, int]:
    """Redrive the ticked failed deliveries (``action=selected``) or every one the page showed
    (``action=all``); the answer lists those redriven and those that were no longer failed."""
    service = callbacks_service()
    action = form_text("action", required=True, max_chars=16)
    if action not in ("selected", "all"):
        raise InvalidFieldError("action", "must be selected or all")
    chosen = posted_ids("delivery_id") if action == "selected" else posted_ids("shown")
    if not chosen:
        raise InvalidFieldError("delivery_id", "tick at least one delivery to redrive")
    redriven = service.redrive_selected(chosen)
    done = {row.delivery_id for row in redriven}
    return render_page(
        "workflows/redriven_callbacks.html",
        redriven=redriven,
        not_redriven=[delivery_id for delivery_id in dict.fromkeys(chosen) if delivery_id not in done],
        max_selected=MAX_SELECTED,
    )
