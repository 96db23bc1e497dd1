"""Subscriptions from the console: create (the secret shown once) with or without a payload
filter, custom headers, a rate limit and an ordering policy, edit them, delete after a confirmation, and each
subscription's health over the last hour.

Thin over :class:`~flask_harvest.webhooks.operations.WebhookOperations`, as the actuator is: the
same model checks and SSRF policy, the same errors. Every POST carries the session's CSRF token
(the blueprint checks it).
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

from flask import redirect, request, url_for
from werkzeug.wrappers import Response as BaseResponse

from .._app import get_engine
from .._input import parse_json
from .._time import utcnow
from ..errors import HarvestError, InvalidFieldError
from ..http.admin import error_answer
from ..http.forms import form_text
from ..webhooks.attempt_stats import AttemptStats, attempt_stats
from ..webhooks.models import WebhookSubscription, filter_json
from ..webhooks.tenants import ALL_TENANTS, MAX_TENANT_LENGTH, TenantScope
from ._core import dashboard, render_page, unconfirmed

#: The window of a subscription's health, and the most deliveries (those attempted last) whose
#: attempts it reads: a busy subscription's page costs the same as a quiet one's.
HEALTH_WINDOW = timedelta(hours=1)
HEALTH_DELIVERIES = 1000
#: What separates topics in the form's field.
_TOPIC_SPLIT = re.compile(r"[\s,]+")
#: The longest text the filter and headers fields take (a filter's caps fit well within it).
MAX_OPTIONS_CHARS = 64 * 1024


def subscription_health(
    subscription_id: str,
    window: timedelta = HEALTH_WINDOW,
    deliveries: int = HEALTH_DELIVERIES,
    *,
    tenant: TenantScope = ALL_TENANTS,
) -> AttemptStats:
    """The success rate and p50/p99 latency of the subscription's attempts in the last ``window``
    (an hour), over the attempts of its ``deliveries`` deliveries attempted last, of ``tenant``'s
    deliveries only (an id can outlive its subscription, and be taken again by another tenant)."""
    store = get_engine().operations.store
    since = utcnow() - window
    return attempt_stats(store.recent_attempts(subscription_id, since=since, limit=deliveries, tenant=tenant))


def _form_values() -> dict[str, str]:
    return {
        "target_url": form_text("target_url"),
        "topics": form_text("topics"),
        "description": form_text("description"),
        "subscription_id": form_text("subscription_id", max_chars=255),
        "tenant": form_text("tenant", max_chars=MAX_TENANT_LENGTH),
        **_options_values(),
    }


def _options_values() -> dict[str, str]:
    """The posted payload filter, headers and rate fields, as typed (shown again on a refusal)."""
    return {
        "payload_filter": form_text("payload_filter", max_chars=MAX_OPTIONS_CHARS),
        "headers": form_text("headers", max_chars=MAX_OPTIONS_CHARS),
        "rate_per_second": form_text("rate_per_second", max_chars=64).strip(),
        "rate_burst": form_text("rate_burst", max_chars=64).strip(),
        "ordering_policy": form_text("ordering_policy", max_chars=64).strip(),
    }


def _posted_options(form: dict[str, str]) -> dict[str, Any]:
    """The filter, headers, rate limit and ordering policy fields as the operations' arguments
    (each empty: none; for the policy, the default on creation and no change on an edit).

    :raises InvalidFieldError: a field that does not parse (the model checks the rest).
    """
    condition: Any = parse_json(form["payload_filter"], "payload_filter") if form["payload_filter"] else None
    if form["payload_filter"] and condition is None:
        raise InvalidFieldError("payload_filter", "must be a condition; leave it empty for no filter")
    return {
        "payload_filter": condition,
        "headers": _posted_headers(form["headers"]),
        "rate_limit": _posted_rate_limit(form["rate_per_second"], form["rate_burst"]),
        # Checked with the subscription: anything but a policy is refused, naming the field.
        "ordering_policy": form["ordering_policy"] or None,
    }


def _creation_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options for a new subscription: an empty policy field leaves the default."""
    if options["ordering_policy"] is None:
        return {name: value for name, value in options.items() if name != "ordering_policy"}
    return options


@dashboard.route("/webhooks/subscriptions/new", methods=["GET", "POST"])
def new_subscription() -> tuple[str, int]:
    """The creation form; its answer shows the generated secret once (the page is ``no-store``
    and the secret is never shown again)."""
    if request.method == "GET":
        return render_page("webhooks/new_subscription.html", form={}, error="")
    operations = get_engine().operations
    values: dict[str, str] = {}
    try:
        # Inside the try: a field that cannot even be read (a NUL, too long) is refused in the
        # form too, which then comes back empty.
        values = _form_values()
        created = operations.create_subscription(
            target_url=values["target_url"],
            event_topics=[t for t in _TOPIC_SPLIT.split(values["topics"]) if t],
            description=values["description"],
            subscription_id=values["subscription_id"] or None,
            tenant=values["tenant"] or None,
            **_creation_options(_posted_options(values)),
        )
    except HarvestError as exc:
        # The form comes back with what was typed and the error; nothing was stored.
        answer = error_answer(exc, "harvest dashboard")
        return render_page(
            "webhooks/new_subscription.html", status=answer.status, form=values, error=answer.message
        )
    return render_page(
        "webhooks/created_subscription.html",
        status=201,
        subscription=created.subscription,
        secret=created.secret,
        warnings=operations.topic_warnings(created.subscription.event_topics),
    )


@dashboard.route("/webhooks/subscriptions/<subscription_id>/delete", methods=["GET", "POST"])
def delete_subscription(subscription_id: str) -> BaseResponse | tuple[str, int]:
    """Delete a subscription, on a confirmation page: the POST acts only with its box ticked."""
    operations = get_engine().operations
    found = operations.get_subscription(subscription_id)
    page = unconfirmed("webhooks/delete_subscription.html", "the subscription was kept", subscription=found)
    if page is not None:
        return page
    operations.remove_subscription(found.id)
    return redirect(url_for(".subscriptions", done="deleted"), 303)


def options_form(subscription: WebhookSubscription) -> dict[str, str]:
    """The edit form's fields for what ``subscription`` has now: the filter as indented JSON (empty
    for none), the headers one ``Name: value`` per line."""
    shown = filter_json(subscription.payload_filter)
    limit = subscription.rate_limit
    return {
        "payload_filter": "" if shown is None else json.dumps(shown, indent=2, ensure_ascii=False),
        "headers": "\n".join(f"{name}: {value}" for name, value in subscription.headers.items()),
        "rate_per_second": "" if limit is None else f"{limit.per_second:g}",
        "rate_burst": "" if limit is None else str(limit.burst),
        "ordering_policy": subscription.ordering_policy.value,
    }


def _posted_rate_limit(per_second: str, burst: str) -> dict[str, Any] | None:
    """The rate fields as a rate limit's JSON form (validated with the subscription); both empty:
    none."""
    if not per_second and not burst:
        return None
    if not per_second or not burst:
        raise InvalidFieldError("rate_limit", "give both the deliveries per second and the burst, or neither")
    try:
        rate = float(per_second)
    except ValueError:
        raise InvalidFieldError("rate_limit", "the deliveries per second must be a number") from None
    if not re.fullmatch(r"[0-9]{1,7}", burst):
        raise InvalidFieldError("rate_limit", "the burst must be a whole number")
    return {"per_second": rate, "burst": int(burst)}


def _posted_headers(text: str) -> dict[str, str]:
    """The headers field's lines as a mapping (validated with the subscription)."""
    headers: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, colon, value = line.partition(":")
        if not colon:
            raise InvalidFieldError("headers", f"line {number} is not 'Name: value'")
        if name.strip() in headers:
            raise InvalidFieldError("headers", f"{name.strip()!r:.80} is given twice")
        headers[name.strip()] = value.strip()
    return headers


@dashboard.route("/webhooks/subscriptions/<subscription_id>/edit", methods=["GET", "POST"])
def edit_subscription(subscription_id: str) -> BaseResponse | tuple[str, int]:
    """Edit the payload filter (empty: every payload), the custom headers (empty: none), the
    rate limit (empty: none) and the ordering policy; the same checks as the admin API, and
    nothing changes when one fails."""
    operations = get_engine().operations
    found = operations.get_subscription(subscription_id)
    if request.method == "GET":
        return render_page(
            "webhooks/edit_subscription.html", subscription=found, form=options_form(found), error=""
        )
    form = options_form(found)
    try:
        form = _options_values()
        options = _posted_options(form)
        operations.update_subscription(
            found.id,
            **options,
            remove_payload_filter=options["payload_filter"] is None,
            remove_rate_limit=options["rate_limit"] is None,
        )
    except HarvestError as exc:
        answer = error_answer(exc, "harvest dashboard")
        return render_page(
            "webhooks/edit_subscription.html",
            status=answer.status,
            subscription=found,
            form=form,
            error=answer.message,
        )
    return redirect(url_for(".subscription", subscription_id=found.id, done="saved"), 303)
