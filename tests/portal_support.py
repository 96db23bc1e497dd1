"""Shared helpers of the portal tests: an app with the portal mounted and an event catalog, a client
signed in through a link, and the portal's routes from the URL map."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse
from werkzeug.wrappers import Response

from flask_harvest import DeliveryState, OutboundWebhookHandler, OutboundWebhookPlugin, get_engine
from flask_harvest.portal import portal, portal_url
from flask_harvest.testing import CapturingReceiver, drain
from flask_harvest.webhooks.models import WebhookSubscriptionStatus

from .pipeline import FAST, close_later

PREFIX = "/portal"
SECRET_KEY = "portal-test-secret-key-0123456789abcdef"
PORTAL_KEY = "portal-test-portal-key-0123456789abcdef"
#: The catalog's one type, and its example payload.
EVENT_TYPE = "order.created"
EXAMPLE = {"order_id": "ord_example_1", "total": 12.5}
#: A form's content type, as the tests post it.
FORM = "application/x-www-form-urlencoded"
#: Every name a portal route reads from the query or the form (the property tests fill each).
FIELDS = [
    "endpoint_id", "state", "topic", "cursor", "since", "until", "page", "trail", "done", "token",
    "target_url", "description", "event_types", "topics", "status", "confirm", "event_type",
    "action", "endpoint", "rotation", "filename",
]  # fmt: skip
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
_SECRET = re.compile(r'id="new-secret">([^<]+)<')


def portal_app(store: OutboundWebhookHandler, *, delegate: Any = None, **config: Any) -> Flask:
    """An app on ``store`` with the portal at :data:`PREFIX` and a catalog of one type. Targets on
    127.0.0.1 are allowed by a network (the receivers' address), not by turning the SSRF policy off,
    so the portal's refusals of other private addresses are real."""
    app = Flask("harvest_portal_test")
    app.config.update(FAST)
    app.config.update(
        SECRET_KEY=SECRET_KEY,
        HARVEST_PORTAL_SECRET_KEY=PORTAL_KEY,
        HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS=False,
        HARVEST_WEBHOOKS_ALLOW_CIDRS="127.0.0.1/32",
    )
    app.config.update(config)
    harvest = OutboundWebhookPlugin(store, app, delegate=delegate)
    harvest.event_type(
        EVENT_TYPE,
        description="An order was placed.",
        schema={"type": "object", "required": ["order_id"]},
        example=EXAMPLE,
    )
    app.register_blueprint(portal, url_prefix=PREFIX)
    return close_later(app)


def link(app: Flask, tenant: str, **options: Any) -> str:
    """A portal link for ``tenant``, made as the app makes it (in a request)."""
    with app.test_request_context():
        return portal_url(tenant, **options)


def signed_in(app: Flask, tenant: str) -> tuple[FlaskClient, str]:
    """A client that opened ``tenant``'s link, and its session's CSRF token."""
    client = app.test_client()
    opened = client.get(link(app, tenant))
    assert opened.status_code == 303, text(opened)
    return client, csrf_of(client.get(f"{PREFIX}/replay"))  # a page with a form


def csrf_of(response: TestResponse) -> str:
    found = _CSRF.search(text(response))
    assert found, "the page has no CSRF token"
    return found.group(1)


def secret_of(response: TestResponse) -> str:
    """The secret a page shows once (``id="new-secret"``)."""
    found = _SECRET.search(text(response))
    assert found, text(response)
    return found.group(1)


def text(response: TestResponse) -> str:
    return response.get_data(as_text=True)


def portal_routes(app: Flask) -> list[tuple[str, str, list[str]]]:
    """Every (method, rule, path variables) of the portal, from the app's URL map: a route added
    later is covered without a change here."""
    found = []
    for rule in app.url_map.iter_rules():
        if not rule.endpoint.startswith(f"{portal.name}."):
            continue
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            found.append((method, rule.rule, sorted(rule.arguments)))
    return found


@dataclass
class Seeded:
    """One tenant's rows, made through the app with real attempts: endpoints (one answering, one
    failing, one disabled), delivered and dead-lettered deliveries, and every text of them that
    another tenant must never see."""

    tenant: str
    endpoint_ids: list[str]
    delivery_ids: list[str]
    dead_ids: list[str]
    #: A cursor of this tenant's delivery listing.
    cursor: str
    #: Ids, URLs, descriptions, secrets, header values, payload and response texts.
    private: list[str]


def seed_tenant(app: Flask, receiver: CapturingReceiver, tenant: str) -> Seeded:
    """Give ``tenant`` rows through ``app``, which sends to ``receiver`` (stop its job backend once
    done seeding, so that nothing moves while a test runs)."""
    tag = uuid.uuid4().hex[:10]
    failing = f"/{tag}/failing"
    body = f"{tenant}-response-{tag}"
    receiver.handle(failing, lambda _request: Response(body, status=500))
    with app.app_context():
        operations = get_engine().operations
        made = [
            operations.create_subscription(
                target_url=receiver.url(f"/{tag}/{name}"),
                event_topics=["*"],
                description=f"{tenant} {name} endpoint {tag}",
                headers={"X-Private": f"{tenant}-header-{name}-{tag}"},
                tenant=tenant,
            )
            for name in ("answering", "failing", "disabled")
        ]
        operations.update_subscription(
            made[2].subscription.id, status=WebhookSubscriptionStatus.DISABLED, tenant=tenant
        )
        for n in range(2):
            get_engine().manager.dispatch(
                EVENT_TYPE, {"order_id": f"{tenant}-order-{n}-{tag}"}, tenant=tenant
            )
        drain(app, retries=True)
        _, cursor = operations.delivery_summaries_page(limit=1, tenant=tenant)
        everything = get_engine().store.list_deliveries(limit=100, tenant=tenant)
    assert cursor is not None
    dead = [d.id for d in everything if d.state is DeliveryState.DLQ]
    # Two events to each endpoint: delivered, dead-lettered, and skipped (the disabled one).
    assert len(dead) == 2 and len(everything) == 6, [(d.id, d.state) for d in everything]
    private = [tenant, body, *(f"{tenant}-order-{n}-{tag}" for n in range(2))]
    for created in made:
        endpoint = created.subscription
        private += [endpoint.id, endpoint.target_url, endpoint.description, created.secret]
        private += list(endpoint.headers.values())
    private += [d.id for d in everything]
    return Seeded(
        tenant,
        [c.subscription.id for c in made],
        [d.id for d in everything],
        dead,
        cursor,
        private,
    )


def tenant_rows(store: OutboundWebhookHandler, tenant: str) -> Any:
    """Everything the store holds of ``tenant``: its endpoints (secrets too), deliveries and
    attempts."""
    endpoints = sorted(
        ((s.to_dict(), s.secret, s.previous_secret) for s in store.list_subscriptions(tenant=tenant)),
        key=lambda row: str(row[0]["id"]),
    )
    deliveries = sorted(store.list_deliveries(limit=1000, tenant=tenant), key=lambda d: d.id)
    attempts = {d.id: store.list_attempts(d.id) for d in deliveries}
    return endpoints, deliveries, attempts


def encoded(pairs: list[tuple[str, str]]) -> str:
    """Form or query text of ``pairs`` (a name may repeat), lone surrogates sent as the bytes a
    client would send."""
    return "&".join(f"{quote(k)}={quote(v.encode('utf-8', 'surrogatepass'), safe='')}" for k, v in pairs)


def fill(rule: str, values: dict[str, str]) -> str:
    """The rule with each ``<converter:name>`` replaced by its quoted value."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1).split(":")[-1]
        return quote(values.get(name, "x").encode("utf-8", "surrogatepass"), safe="") or "x"

    return re.sub(r"<([^>]+)>", one, rule)
