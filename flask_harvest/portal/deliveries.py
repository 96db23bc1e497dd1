"""The portal's delivery pages: a tenant's deliveries, newest first, filtered by endpoint, state,
event type and time; one delivery with its attempts; replay of one dead-lettered delivery, or of
everything dead-lettered in a time window.

Every read and replay passes the session's tenant to
:class:`~flask_harvest.webhooks.operations.WebhookOperations`, whose keyset cursors carry no
tenant: a cursor copied from another tenant's page walks this tenant's rows only.
"""

from __future__ import annotations

from typing import Any

from flask import redirect, request, url_for
from werkzeug.wrappers import Response as BaseResponse

from .._app import get_engine
from ..dashboard._core import link_maker
from ..dashboard.paging import PAGE_SIZE, PAGING_ARGS, Page, pager
from ..dashboard.webhooks import STATES, delivery_rows, form_time, query_time
from ..dashboard.when import page_now
from ..errors import InvalidFieldError
from ..http.forms import form_text, query_text
from ..outbound.ssrf import public_error
from ..webhooks.models import DeliveryState, DeliverySummary
from ..webhooks.operations import MAX_BULK_REPLAY
from ._core import portal, render_page, tenant


def _state(value: str | None) -> DeliveryState | None:
    if value is None:
        return None
    if value not in STATES:
        raise InvalidFieldError("state", f"must be one of {', '.join(STATES)}")
    return DeliveryState(value)


@portal.get("/deliveries")
def deliveries() -> tuple[str, int]:
    """The tenant's deliveries newest first, in keyset pages with a bounded count."""
    state = _state(query_text("state"))
    endpoint_id, topic = query_text("endpoint_id"), query_text("topic")
    since, until = query_time("since"), query_time("until")
    cursor = query_text("cursor")
    operations = get_engine().operations
    filters: dict[str, Any] = {
        "state": state,
        "subscription_id": endpoint_id,
        "topic": topic,
        "since": since,
        "until": until,
        "tenant": tenant(),
    }

    def fetch(at: str | None, limit: int) -> tuple[list[DeliverySummary], str | None]:
        return operations.delivery_summaries_page(cursor=at, limit=limit, **filters)

    def count(cap: int) -> int:
        return operations.count_deliveries(cap=cap, **filters)

    page = Page(*fetch(cursor, PAGE_SIZE))
    rows = delivery_rows(
        page.items,
        link_maker("harvest_portal.delivery", "delivery_id"),
        link_maker("harvest_portal.endpoint", "subscription_id"),
        page_now(),
    )
    next_args = {key: value for key, value in request.args.items() if key not in PAGING_ARGS and value}
    return render_page(
        "deliveries.html",
        rows=[row._replace(last_error=public_error(row.last_error)) for row in rows],
        states=STATES,
        filters={
            "state": state.value if state else "",
            "endpoint_id": endpoint_id or "",
            "topic": topic or "",
            "since": request.args.get("since", "")[:64],
            "until": request.args.get("until", "")[:64],
        },
        pages=pager("harvest_portal.deliveries", next_args, cursor, page, fetch, count),
    )


@portal.get("/deliveries/<delivery_id>")
def delivery(delivery_id: str) -> tuple[str, int]:
    """A delivery with its payload and every attempt."""
    shown = get_engine().operations.delivery_with_attempts(delivery_id, tenant=tenant())
    # Errors in the customer's words: a refused address names no setting and no resolved address.
    shown["last_error"] = public_error(shown["last_error"] or "")
    shown["attempts"] = [{**a, "error": public_error(a["error"] or "")} for a in shown["attempts"]]
    notice = "Replayed: it is due now." if request.args.get("done") == "replayed" else ""
    return render_page("delivery.html", delivery=shown, notice=notice)


@portal.post("/deliveries/<delivery_id>/replay")
def replay(delivery_id: str) -> BaseResponse:
    """Send a dead-lettered delivery again (same id, attempt 1, due now)."""
    get_engine().operations.replay(delivery_id, tenant=tenant())
    return redirect(url_for(".delivery", delivery_id=delivery_id, done="replayed"), 303)


@portal.route("/replay", methods=["GET", "POST"])
def replay_window() -> tuple[str, int]:
    """Replay everything dead-lettered in a time window (of one endpoint, or all): a count first,
    then, once confirmed, the replay of what the window holds then."""
    context: dict[str, Any] = {"max_limit": MAX_BULK_REPLAY, "result": None, "dry_run": False}
    endpoints = get_engine().operations.list_subscriptions(tenant=tenant())
    if request.method == "GET":
        return render_page("replay.html", form={}, endpoints=endpoints, **context)
    action = form_text("action", required=True)
    if action not in ("count", "replay"):
        raise InvalidFieldError("action", "must be count or replay")
    endpoint_id = form_text("endpoint") or None
    since, until = form_time("since"), form_time("until")
    if since is None or until is None:
        raise InvalidFieldError("since", "give the window's start and end")
    result = get_engine().operations.replay_many(
        subscription_id=endpoint_id,
        since=since,
        until=until,
        limit=MAX_BULK_REPLAY,
        dry_run=action == "count",
        tenant=tenant(),
    )
    form = {
        "endpoint": endpoint_id or "",
        "since": form_text("since", max_chars=64),
        "until": form_text("until", max_chars=64),
    }
    context.update(result=result, dry_run=result.dry_run)
    return render_page("replay.html", form=form, endpoints=endpoints, **context)
