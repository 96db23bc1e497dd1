"""The webhook pages: the overview panel, subscriptions, deliveries, replay.

Thin over :class:`~flask_harvest.webhooks.operations.WebhookOperations`: every read is one of its
bounded queries, every action one of its methods, so the dashboard, the actuator and the CLI do
the same thing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, NamedTuple

from flask import redirect, request, url_for
from markupsafe import Markup
from werkzeug.wrappers import Response as BaseResponse

from .._app import get_engine
from .._time import utcnow
from ..engine import HarvestEngine
from ..errors import InvalidFieldError
from ..http.forms import form_text, query_text
from ..webhooks.models import (
    DeliveryState,
    DeliverySummary,
    WebhookSubscription,
    WebhookSubscriptionStatus,
    count_text,
)
from ..webhooks.operational import OPERATIONAL_SUBSCRIPTION_ID
from ..webhooks.operations import MAX_BULK_REPLAY, MAX_GRACE_SECONDS
from ._core import NAV, PANELS, NavEntry, Panel, always, dashboard, link_maker, render_page
from .chart import stacked_bars
from .paging import PAGE_SIZE, PAGING_ARGS, Page, pager
from .subscription_admin import HEALTH_DELIVERIES, options_form, subscription_health
from .when import absolute, as_time, page_now, relative

NAV.append(NavEntry("Subscriptions", "harvest_dashboard.subscriptions", always))
NAV.append(NavEntry("Deliveries", "harvest_dashboard.deliveries", always))
NAV.append(NavEntry("Replay DLQ", "harvest_dashboard.bulk_replay", always))

#: Recent deliveries shown on a subscription's page.
RECENT = 20
#: The most blocked ordering keys a subscription's page lists (the admin API pages through more).
BLOCKED_KEYS_SHOWN = 50
#: Failing and disabled subscriptions listed on the overview (the most failures first).
TROUBLED_SHOWN = 20
STATES = [state.value for state in DeliveryState]
SUBSCRIPTION_STATUSES = [status.value for status in WebhookSubscriptionStatus]


def _overview(engine: HarvestEngine) -> Mapping[str, Any]:
    operations = engine.operations
    stats = operations.overall_stats()
    # A bounded read of the few troubled rows: a SaaS's overview must not load every subscription.
    troubled = operations.troubled_subscriptions(limit=TROUBLED_SHOWN)
    buckets = operations.attempts_per_minute(minutes=60)
    return {
        "stats": stats,
        # Capped counts read "1000+" (see STATS_COUNT_CAP).
        "shown": {name: count_text(stats, name) for name in STATES},
        "capped": any(stats["capped"].values()),
        "states": STATES,
        "troubled": troubled,
        "troubled_shown": TROUBLED_SHOWN,
        # The renderer escapes every text it writes.
        "chart": Markup(stacked_bars(buckets, title="Attempts per minute, last hour (UTC)")),  # noqa: S704
        "delivered_hour": sum(ok for _, ok, _ in buckets),
        "failed_hour": sum(failed for _, _, failed in buckets),
    }


# The webhooks panel comes first; the workflow and trigger panels take higher orders.
PANELS.append(Panel(10, "harvest_dashboard/webhooks/_overview_panel.html", _overview, always))


# -- input -----------------------------------------------------------------------------------------


def query_time(name: str) -> datetime | None:
    """A time filter: ISO 8601, or a form's ``datetime-local`` value; without a zone it is UTC."""
    value = query_text(name, max_chars=64)
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidFieldError(name, "must be a time such as 2026-12-03T10:00") from None
    return when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when


def form_time(name: str) -> datetime | None:
    value = form_text(name, max_chars=64)
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidFieldError(name, "must be a time such as 2026-12-03T10:00") from None
    return when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when


def _local(when: datetime | None) -> str:
    """A time as a ``datetime-local`` input's value, in UTC."""
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M") if when is not None else ""


def _choice(value: str | None, allowed: list[str], name: str) -> str | None:
    if value is not None and value not in allowed:
        raise InvalidFieldError(name, f"must be one of {', '.join(allowed)}")
    return value


# -- subscriptions ---------------------------------------------------------------------------------


@dashboard.get("/webhooks/subscriptions")
def subscriptions() -> tuple[str, int]:
    """Subscriptions oldest first, filtered by status and the topic they receive; keyset pages,
    filtered in the store's query."""
    status = _choice(query_text("status"), SUBSCRIPTION_STATUSES, "status")
    topic = query_text("topic")
    cursor = query_text("cursor")

    def fetch(at: str | None, limit: int) -> tuple[list[WebhookSubscription], str | None]:
        return get_engine().operations.subscriptions_page(
            limit=limit, cursor=at, status=WebhookSubscriptionStatus(status) if status else None, topic=topic
        )

    items, next_cursor = fetch(cursor, PAGE_SIZE)
    filters = {"status": status or "", "topic": topic or ""}
    return render_page(
        "webhooks/subscriptions.html",
        page=Page(items, next_cursor),
        pages=pager("harvest_dashboard.subscriptions", filters, cursor, Page(items, next_cursor), fetch),
        statuses=SUBSCRIPTION_STATUSES,
        filters=filters,
        operational_id=OPERATIONAL_SUBSCRIPTION_ID,
        notice="Deleted." if request.args.get("done") == "deleted" else "",
    )


def _subscription_page(
    subscription: WebhookSubscription, *, status: int = 200, new_secret: str | None = None, notice: str = ""
) -> tuple[str, int]:
    recent, _ = get_engine().operations.deliveries_page(subscription_id=subscription.id, limit=RECENT)
    return render_page(
        "webhooks/subscription.html",
        status=status,
        subscription=subscription,
        recent=recent,
        new_secret=new_secret,
        notice=notice,
        health=subscription_health(subscription.id),
        options=options_form(subscription),
        health_deliveries=HEALTH_DELIVERIES,
        operational=subscription.id == OPERATIONAL_SUBSCRIPTION_ID,
        blocked=get_engine().operations.blocked_keys(subscription.id, limit=BLOCKED_KEYS_SHOWN),
        blocked_shown=BLOCKED_KEYS_SHOWN,
        max_grace=int(MAX_GRACE_SECONDS),
        default_grace=int(get_engine().settings.webhooks_secret_grace_seconds),
    )


@dashboard.get("/webhooks/subscriptions/<subscription_id>")
def subscription(subscription_id: str) -> tuple[str, int]:
    notices = {
        "enabled": "Enabled.",
        "disabled": "Disabled.",
        "saved": "Saved.",
        "tested": "A test notification was queued: it is listed below once sent.",
        "skipped": "Skipped: the next delivery of its key is queued.",
    }
    notice = notices.get(request.args.get("done", ""), "")
    return _subscription_page(get_engine().operations.get_subscription(subscription_id), notice=notice)


@dashboard.post("/webhooks/subscriptions/<subscription_id>/status")
def set_subscription_status(subscription_id: str) -> BaseResponse:
    """Enable (which clears the failure count) or disable a subscription."""
    wanted = _choice(form_text("status", required=True), ["active", "disabled"], "status")
    get_engine().operations.update_subscription(subscription_id, status=WebhookSubscriptionStatus(wanted))
    done = "enabled" if wanted == "active" else "disabled"
    return redirect(url_for(".subscription", subscription_id=subscription_id, done=done), 303)


@dashboard.post("/webhooks/operational/test")
def operational_test() -> BaseResponse:
    """Send a test notification to the operational endpoint; back to its subscription's page."""
    get_engine().operations.send_operational_test()
    return redirect(url_for(".subscription", subscription_id=OPERATIONAL_SUBSCRIPTION_ID, done="tested"), 303)


@dashboard.post("/webhooks/subscriptions/<subscription_id>/rotate-secret")
def rotate_secret(subscription_id: str) -> tuple[str, int]:
    """Rotate the secret and show the new one on this answer only (never stored for display,
    never in a redirect, never cached: the page is ``no-store``)."""
    grace_text = form_text("grace_seconds", max_chars=32)
    try:
        grace = float(grace_text) if grace_text else None
    except ValueError:
        raise InvalidFieldError("grace_seconds", "must be a number of seconds") from None
    rotated = get_engine().operations.rotate_secret(subscription_id, grace_seconds=grace)
    return _subscription_page(
        rotated.subscription,
        new_secret=rotated.secret,
        notice="The secret was rotated. Copy the new secret now: it is shown only this once.",
    )


# -- deliveries ------------------------------------------------------------------------------------


class DeliveryRow(NamedTuple):
    """One row of the deliveries list as the page shows it: every cell's text (the template
    escapes each), so the template's loop only writes them out."""

    id: str
    link: str
    state: str
    subscription_id: str
    subscription_link: str
    topic: str
    attempt: str
    response_status: str
    last_error: str
    iso_time: str
    title: str
    time: str


def delivery_rows(
    items: Sequence[DeliverySummary],
    delivery_link: Callable[[str], str],
    subscription_link: Callable[[str], str],
    now: datetime,
) -> list[DeliveryRow]:
    """The deliveries list's rows: the list page's hot loop, built in one pass here (a call or an
    attribute lookup per cell in Jinja cost twice as much: bench S16). Times as the
    ``harvest_when`` filter shows them, relative to ``now``."""
    rows = []
    for id_, subscription_id, topic, state, attempt, max_attempts, status, error, stamp in items:
        when = as_time(stamp) or stamp
        rows.append(
            DeliveryRow(
                id_,
                delivery_link(id_),
                state.value,
                subscription_id,
                subscription_link(subscription_id),
                topic,
                f"{attempt}/{max_attempts}",
                "" if status is None else str(status),
                error or "",
                when.isoformat(),
                absolute(when),
                relative(when, now),
            )
        )
    return rows


@dashboard.get("/webhooks/deliveries")
def deliveries() -> tuple[str, int]:
    """Deliveries newest first, filtered by state, subscription, topic and time; keyset pages."""
    state = _choice(query_text("state"), STATES, "state")
    subscription_id, topic = query_text("subscription_id"), query_text("topic")
    since, until = query_time("since"), query_time("until")
    cursor = query_text("cursor")

    def fetch(at: str | None, limit: int) -> tuple[list[DeliverySummary], str | None]:
        return get_engine().operations.delivery_summaries_page(
            state=DeliveryState(state) if state else None,
            cursor=at,
            limit=limit,
            subscription_id=subscription_id,
            topic=topic,
            since=since,
            until=until,
        )

    def count(cap: int) -> int:
        return get_engine().operations.count_deliveries(
            state=DeliveryState(state) if state else None,
            subscription_id=subscription_id,
            topic=topic,
            since=since,
            until=until,
            cap=cap,
        )

    items, next_cursor = fetch(cursor, PAGE_SIZE)
    shown = {
        "state": state or "",
        "subscription_id": subscription_id or "",
        "topic": topic or "",
        "since": _local(since),
        "until": _local(until),
    }
    next_args = {key: value for key, value in request.args.items() if key not in PAGING_ARGS and value}
    return render_page(
        "webhooks/deliveries.html",
        page=Page(items, next_cursor),
        rows=delivery_rows(
            items,
            link_maker("harvest_dashboard.delivery", "delivery_id"),
            link_maker("harvest_dashboard.subscription", "subscription_id"),
            page_now(),
        ),
        states=STATES,
        filters=shown,
        pages=pager(
            "harvest_dashboard.deliveries", next_args, cursor, Page(items, next_cursor), fetch, count
        ),
        # The dead-lettered rows shown get a checkbox (dlq_select.replay_selected).
        dlq_shown=[item.id for item in items if item.state is DeliveryState.DLQ],
    )


@dashboard.get("/webhooks/deliveries/<delivery_id>")
def delivery(delivery_id: str) -> tuple[str, int]:
    return _delivery_page(delivery_id, notice="Replayed: due now." if request.args.get("done") else "")


def _delivery_page(delivery_id: str, *, notice: str = "", status: int = 200) -> tuple[str, int]:
    operations = get_engine().operations
    shown = operations.delivery_with_attempts(delivery_id)
    return render_page("webhooks/delivery.html", status=status, delivery=shown, notice=notice)


@dashboard.post("/webhooks/deliveries/<delivery_id>/replay")
def replay(delivery_id: str) -> BaseResponse:
    """Replay one dead-lettered delivery (same id, attempt 1, due now)."""
    get_engine().operations.replay(delivery_id)
    return redirect(url_for(".delivery", delivery_id=delivery_id, done="replayed"), 303)


@dashboard.post("/webhooks/deliveries/<delivery_id>/skip")
def skip(delivery_id: str) -> BaseResponse:
    """Give up on a dead-lettered delivery that holds its ordering key: it is never sent, and the
    next delivery of its key is queued; back to its subscription's page."""
    skipped = get_engine().operations.skip(delivery_id)
    return redirect(url_for(".subscription", subscription_id=skipped.subscription_id, done="skipped"), 303)


@dashboard.route("/webhooks/replay", methods=["GET", "POST"])
def bulk_replay() -> tuple[str, int]:
    """Replay the DLQ of a subscription and/or a time window: a dry-run count first, then the
    replay of exactly the form's selection."""
    context: dict[str, Any] = {"max_limit": MAX_BULK_REPLAY, "result": None, "dry_run": False}
    if request.method == "GET":
        return render_page("webhooks/bulk_replay.html", form={"limit": "100"}, **context)
    action = _choice(form_text("action", required=True), ["dry-run", "replay"], "action")
    limit_text = form_text("limit", max_chars=8) or "100"
    if not limit_text.isdigit():
        raise InvalidFieldError("limit", f"must be between 1 and {MAX_BULK_REPLAY}")
    subscription_id = form_text("subscription_id") or None
    result = get_engine().operations.replay_many(
        subscription_id=subscription_id,
        since=form_time("since"),
        until=form_time("until"),
        limit=int(limit_text),
        dry_run=action == "dry-run",
    )
    form = {
        "subscription_id": subscription_id or "",
        "since": form_text("since", max_chars=64),
        "until": form_text("until", max_chars=64),
        "limit": limit_text,
    }
    context.update(result=result, dry_run=result.dry_run)
    return render_page("webhooks/bulk_replay.html", form=form, now=utcnow(), **context)
