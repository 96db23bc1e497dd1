"""The portal's endpoint pages: a tenant's endpoints with their recent success rate; add (the
secret shown once), edit, disable and enable, delete, rotate the secret with a grace period, and
send a test event of a type from the catalog.

Thin over :class:`~flask_harvest.webhooks.operations.WebhookOperations`, always with the session's
tenant: the same model checks and SSRF policy as the console, the same errors as pages.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from flask import redirect, request, url_for
from werkzeug.wrappers import Response as BaseResponse

from .._app import get_engine
from .._input import to_utc
from ..dashboard.paging import PAGE_SIZE, Page, pager
from ..dashboard.subscription_admin import HEALTH_DELIVERIES, subscription_health
from ..errors import InvalidFieldError, InvalidStateError
from ..http.forms import form_text, form_texts, query_text
from ..outbound.ssrf import SsrfError, public_reason
from ..webhooks.catalog import EventType
from ..webhooks.models import WebhookSubscription, WebhookSubscriptionStatus
from ._core import portal, render_page, tenant, unconfirmed

#: The window of an endpoint's success rate.
HEALTH_WINDOW = timedelta(hours=24)
#: Endpoints on a page of the index.
ENDPOINTS_SHOWN = PAGE_SIZE
#: The deliveries (attempted last) whose attempts make an endpoint's success rate on the index: a
#: list of busy endpoints costs what a quiet one does (each endpoint's page reads more).
INDEX_HEALTH_DELIVERIES = 100
#: The pattern that selects every event type, offered beside the catalog's types.
EVERY_TYPE = "*"
#: What separates topics in the text field shown when the app has no catalog.
_TOPIC_SPLIT = re.compile(r"[\s,]+")
#: Notices after a redirect, by the ``done`` query value.
_NOTICES = {
    "enabled": "Enabled.",
    "disabled": "Disabled.",
    "saved": "Saved.",
    "tested": "A test event was queued: it is listed under Recent deliveries once sent.",
    "deleted": "The endpoint was deleted; its deliveries are still listed.",
}


def _refusal(exc: InvalidFieldError) -> str:
    """What the form says of a refused field: for a URL the SSRF policy refuses, why in the
    customer's terms (the console's message names the app's settings)."""
    if isinstance(exc, SsrfError):
        return f"That URL cannot receive events: {public_reason(exc.reason)}."
    return str(exc)


def _catalog() -> list[EventType]:
    return get_engine().operations.event_types()


def _posted_topics(kept: Sequence[str] = ()) -> list[str]:
    """The event types ticked (or, without a catalog, typed), at least one. With a catalog, only
    its types, every type, or a pattern the endpoint has already (``kept``) can be chosen: the
    form offers nothing else."""
    types = _catalog()
    if types:
        topics = form_texts("event_types", max_chars=255)
        offered = {t.name for t in types} | {EVERY_TYPE} | set(kept)
        unknown = [t for t in topics if t not in offered]
        if unknown:
            raise InvalidFieldError("event_types", f"{unknown[0][:100]!r} is not an event type")
    else:
        topics = [t for t in _TOPIC_SPLIT.split(form_text("topics")) if t]
    if not topics:
        raise InvalidFieldError("event_types", "choose at least one event type")
    return list(dict.fromkeys(topics))


def _posted_values() -> dict[str, str]:
    """The form's text fields as typed (shown again on a refusal)."""
    return {
        "target_url": form_text("target_url"),
        "description": form_text("description"),
        "topics": form_text("topics"),
    }


def _choices(selected: list[str]) -> list[dict[str, Any]]:
    """The event-type checkboxes: every catalog type, then any pattern the endpoint already has
    that is not one (kept ticked, so saving the form keeps it)."""
    types = _catalog()
    names = {t.name for t in types}
    rows: list[dict[str, Any]] = [
        {"value": t.name, "label": t.name, "description": t.description, "checked": t.name in selected}
        for t in types
    ]
    extra = [p for p in selected if p not in names and p != EVERY_TYPE]
    rows += [{"value": p, "label": p, "description": "", "checked": True} for p in extra]
    return rows


def _form_context(values: dict[str, str], selected: list[str], error: str = "") -> dict[str, Any]:
    return {
        "form": values,
        "choices": _choices(selected),
        "every_type": EVERY_TYPE in selected,
        "has_catalog": bool(_catalog()),
        "error": error,
    }


@portal.get("/")
def index() -> tuple[str, int]:
    """The tenant's endpoints, oldest first in keyset pages, each with its success rate over the
    last day."""
    operations = get_engine().operations
    cursor = query_text("cursor")

    def fetch(at: str | None, limit: int) -> tuple[list[WebhookSubscription], str | None]:
        return operations.subscriptions_page(limit=limit, cursor=at, tenant=tenant())

    page = Page(*fetch(cursor, ENDPOINTS_SHOWN))
    rows = [
        (s, subscription_health(s.id, HEALTH_WINDOW, INDEX_HEALTH_DELIVERIES, tenant=tenant()))
        for s in page.items
    ]
    return render_page(
        "index.html",
        rows=rows,
        pages=pager("harvest_portal.index", {}, cursor, page, fetch),
        notice=_NOTICES.get(request.args.get("done", ""), ""),
        sample=INDEX_HEALTH_DELIVERIES,
    )


@portal.route("/endpoints/new", methods=["GET", "POST"])
def new_endpoint() -> tuple[str, int]:
    """Add an endpoint; the answer shows its signing secret, once."""
    if request.method == "GET":
        return render_page("new_endpoint.html", **_form_context({}, []))
    values = _posted_values()
    selected = form_texts("event_types", max_chars=255)
    try:
        created = get_engine().operations.create_subscription(
            target_url=values["target_url"],
            event_topics=_posted_topics(),
            description=values["description"],
            tenant=tenant(),
        )
    except InvalidFieldError as exc:
        return render_page("new_endpoint.html", status=422, **_form_context(values, selected, _refusal(exc)))
    return render_page("secret.html", endpoint=created.subscription, secret=created.secret, rotated=False)


def _endpoint(subscription_id: str) -> WebhookSubscription:
    return get_engine().operations.get_subscription(subscription_id, tenant=tenant())


@portal.get("/endpoints/<subscription_id>")
def endpoint(subscription_id: str) -> tuple[str, int]:
    """One endpoint: its settings, success rate, recent deliveries and actions."""
    found = _endpoint(subscription_id)
    recent, _ = get_engine().operations.delivery_summaries_page(
        subscription_id=found.id, limit=10, tenant=tenant()
    )
    return render_page(
        "endpoint.html",
        endpoint=found,
        health=subscription_health(found.id, HEALTH_WINDOW, tenant=tenant()),
        health_deliveries=HEALTH_DELIVERIES,
        recent=recent,
        types=_catalog(),
        notice=_NOTICES.get(request.args.get("done", ""), ""),
    )


@portal.route("/endpoints/<subscription_id>/edit", methods=["GET", "POST"])
def edit_endpoint(subscription_id: str) -> BaseResponse | tuple[str, int]:
    """Change an endpoint's URL, description and event types."""
    found = _endpoint(subscription_id)
    if request.method == "GET":
        values = {
            "target_url": found.target_url,
            "description": found.description,
            "topics": ", ".join(found.event_topics),
        }
        return render_page(
            "edit_endpoint.html", endpoint=found, **_form_context(values, list(found.event_topics))
        )
    values = _posted_values()
    selected = form_texts("event_types", max_chars=255)
    try:
        get_engine().operations.update_subscription(
            found.id,
            target_url=values["target_url"],
            event_topics=_posted_topics(kept=found.event_topics),
            description=values["description"],
            tenant=tenant(),
        )
    except InvalidFieldError as exc:
        context = _form_context(values, selected, _refusal(exc))
        return render_page("edit_endpoint.html", status=422, endpoint=found, **context)
    return redirect(url_for(".endpoint", subscription_id=found.id, done="saved"), 303)


@portal.post("/endpoints/<subscription_id>/status")
def set_status(subscription_id: str) -> BaseResponse:
    """Disable an endpoint, or enable it (which clears its failure count)."""
    wanted = form_text("status", required=True)
    if wanted not in ("active", "disabled"):
        raise InvalidFieldError("status", "must be active or disabled")
    get_engine().operations.update_subscription(
        subscription_id, status=WebhookSubscriptionStatus(wanted), tenant=tenant()
    )
    done = "enabled" if wanted == "active" else "disabled"
    return redirect(url_for(".endpoint", subscription_id=subscription_id, done=done), 303)


@portal.route("/endpoints/<subscription_id>/delete", methods=["GET", "POST"])
def delete_endpoint(subscription_id: str) -> BaseResponse | tuple[str, int]:
    """Delete an endpoint after a confirmation; its deliveries stay listed."""
    found = _endpoint(subscription_id)
    answer = unconfirmed("delete_endpoint.html", "the endpoint was kept", endpoint=found)
    if answer is not None:
        return answer
    get_engine().operations.remove_subscription(found.id, tenant=tenant())
    return redirect(url_for(".index", done="deleted"), 303)


def _rotation_mark(endpoint: WebhookSubscription) -> str:
    """What changes with each rotation and nothing else (not the failure count, which workers
    change): the previous secret's end."""
    expires = endpoint.previous_secret_expires_at
    return "" if expires is None else expires.isoformat()


def _seen_rotation(mark: str) -> datetime | None:
    """The last rotation a form saw, from its mark (422 for text no form of ours holds)."""
    if not mark:
        return None
    try:
        return to_utc(datetime.fromisoformat(mark), "rotation")
    except (ValueError, InvalidFieldError):
        raise InvalidFieldError("rotation", "is not a mark this form holds; reload the page") from None


@portal.route("/endpoints/<subscription_id>/rotate", methods=["GET", "POST"])
def rotate_secret(subscription_id: str) -> tuple[str, int]:
    """Give the endpoint a new secret after a confirmation and show it once; the old one keeps
    signing for ``HARVEST_WEBHOOKS_SECRET_GRACE_SECONDS``."""
    found = _endpoint(subscription_id)
    grace = get_engine().settings.webhooks_secret_grace_seconds
    answer = unconfirmed(
        "rotate_secret.html",
        "the secret was kept",
        endpoint=found,
        grace_hours=grace / 3600,
        rotation=_rotation_mark(found),
    )
    if answer is not None:
        return answer
    try:
        # Checked in the store's own update: a form sent twice at once (a double click) rotates
        # once, and the first rotation keeps its grace period.
        rotated = get_engine().operations.rotate_secret(
            found.id, tenant=tenant(), after=_seen_rotation(form_text("rotation", max_chars=64))
        )
    except InvalidStateError:
        # The form was sent again (a reload, a second click): a second rotation would end the
        # first one's grace period at once, and the secret just shown would be the old one.
        current = _endpoint(subscription_id)
        return render_page(
            "rotate_secret.html",
            status=409,
            endpoint=current,
            grace_hours=grace / 3600,
            rotation=_rotation_mark(current),
            error=(
                "The secret was rotated since this form was opened, so it was not rotated again. "
                "Use the secret shown then; to rotate once more, confirm again."
            ),
        )
    return render_page(
        "secret.html",
        endpoint=rotated.subscription,
        secret=rotated.secret,
        rotated=True,
        grace_hours=grace / 3600,
    )


@portal.route("/endpoints/<subscription_id>/test", methods=["GET", "POST"])
def send_test(subscription_id: str) -> BaseResponse | tuple[str, int]:
    """Send the example payload of an event type from the catalog to this endpoint only."""
    found = _endpoint(subscription_id)
    if request.method == "GET":
        return render_page("send_test.html", endpoint=found, types=_catalog(), error="")
    get_engine().operations.send_test_event(
        found.id, form_text("event_type", required=True, max_chars=255), tenant=tenant()
    )
    return redirect(url_for(".endpoint", subscription_id=found.id, done="tested"), 303)


@portal.get("/event-types")
def event_types() -> tuple[str, int]:
    """The catalog: every event type the app sends, what it means, and an example payload."""
    return render_page("event_types.html", types=_catalog())
