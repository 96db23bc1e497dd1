"""The console's subscription forms with a payload filter, custom headers and a rate limit (create
and edit: refusals rendered in the form, nothing written), and the operational endpoint's
subscription shown as reserved, with a test notification sent to a real receiver; on every store."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import DeliveryState, OutboundWebhookHandler, WebhookSubscription
from flask_harvest.outbound.rate import RateLimit
from flask_harvest.testing import CapturingReceiver
from flask_harvest.triggers.conditions import parse_condition
from flask_harvest.webhooks.models import filter_json
from flask_harvest.webhooks.operational import OPERATIONAL_SUBSCRIPTION_ID, TEST

from .dashboard_client import PREFIX, dashboard_app, signed_in, text
from .pipeline import wait_final
from .properties import BUDGET, TEXT
from .test_dashboard_properties import FORM, encoded
from .test_operational_webhooks import SECRET, body, check_signed, ops_config, ops_deliveries

NEW = f"{PREFIX}/webhooks/subscriptions/new"
EU = {"type": "Eq", "data": {"path": "region", "value": "EU"}}


@pytest.fixture
def app(store: OutboundWebhookHandler) -> Flask:
    return dashboard_app(store)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def csrf(client: FlaskClient) -> str:
    return signed_in(client)


def form(csrf: str, **fields: str) -> dict[str, str]:
    return {"target_url": "http://127.0.0.1:9/hook", "topics": "order.*", "csrf_token": csrf, **fields}


def snapshot(store: OutboundWebhookHandler) -> list[Any]:
    """Everything a form could change, secrets included."""
    return sorted(
        (json.dumps(s.to_dict(), sort_keys=True, default=str), s.secret) for s in store.list_subscriptions()
    )


# -- create ------------------------------------------------------------------------------------------


def test_create_takes_a_filter_headers_and_a_rate_limit_and_the_page_shows_them(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler
) -> None:
    page = text(client.get(NEW))
    for field in ("tenant", "payload_filter", "headers", "rate_per_second", "rate_burst"):
        assert f'name="{field}"' in page
    created = client.post(
        NEW,
        data=form(
            csrf,
            subscription_id="sub_opts",
            tenant="acme",
            payload_filter=json.dumps(EU),
            headers="X-Tenant: acme\n\nX-Env: prod\n",
            rate_per_second="2.5",
            rate_burst="4",
        ),
    )
    assert created.status_code == 201, text(created)
    [stored] = store.list_subscriptions()
    assert filter_json(stored.payload_filter) == filter_json(parse_condition(EU))
    assert stored.headers == {"X-Tenant": "acme", "X-Env": "prod"}
    assert stored.rate_limit == RateLimit(per_second=2.5, burst=4)
    assert stored.tenant == "acme"
    shown = text(client.get(f"{PREFIX}/webhooks/subscriptions/sub_opts"))
    assert (
        "&#34;region&#34;" in shown and "X-Tenant: acme" in shown and "2.5 per second, bursts of 4" in shown
    )


def test_empty_option_fields_create_a_plain_subscription(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler
) -> None:
    created = client.post(
        NEW, data=form(csrf, payload_filter="", headers="", rate_per_second="", rate_burst="")
    )
    assert created.status_code == 201
    [stored] = store.list_subscriptions()
    assert (stored.payload_filter, stored.headers, stored.rate_limit) == (None, {}, None)


BAD_OPTIONS = [
    ({"payload_filter": "{not json"}, "payload_filter"),
    ({"payload_filter": "null"}, "payload_filter"),
    ({"payload_filter": '{"type": "Nope", "data": {}}'}, "payload_filter"),
    ({"headers": "no colon here"}, "headers"),
    ({"headers": "Connection: close"}, "headers"),
    ({"headers": "webhook-signature: v1,forged"}, "headers"),
    ({"headers": "X-A: 1\nX-A: 2"}, "headers"),
    ({"headers": "X-Big: " + "v" * 5000}, "headers"),
    ({"rate_per_second": "5"}, "rate_limit"),
    ({"rate_burst": "5"}, "rate_limit"),
    ({"rate_per_second": "fast", "rate_burst": "5"}, "rate_limit"),
    ({"rate_per_second": "0", "rate_burst": "5"}, "rate_limit"),
    ({"rate_per_second": "nan", "rate_burst": "5"}, "rate_limit"),
    ({"rate_per_second": "5", "rate_burst": "-1"}, "rate_limit"),
    ({"rate_per_second": "5", "rate_burst": "9999999"}, "rate_limit"),
]


def test_a_bad_tenant_is_refused_in_the_form_with_the_options_kept(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler
) -> None:
    response = client.post(
        NEW, data=form(csrf, tenant="a b", headers="X-Env: prod", rate_per_second="2", rate_burst="3")
    )
    assert response.status_code == 422, text(response)
    page = text(response)
    assert 'id="form-error"' in page and "tenant" in page
    assert 'value="a b"' in page and "X-Env: prod" in page and 'value="3"' in page
    assert store.list_subscriptions() == []


@pytest.mark.parametrize(("fields", "named"), BAD_OPTIONS)
def test_bad_options_are_refused_in_the_form_and_store_nothing(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler, fields: dict[str, str], named: str
) -> None:
    response = client.post(NEW, data=form(csrf, description="kept", **fields))
    assert response.status_code == 422, text(response)
    page = text(response)
    assert 'id="form-error"' in page and named in page
    assert 'value="kept"' in page  # what was typed comes back
    assert store.list_subscriptions() == []


@pytest.mark.parametrize(("fields", "named"), BAD_OPTIONS)
def test_bad_options_are_refused_on_edit_and_change_nothing(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler, fields: dict[str, str], named: str
) -> None:
    store.add_subscription(
        WebhookSubscription(
            "http://127.0.0.1:9/h",
            ["a.b"],
            SECRET,
            id="sub_1",
            headers={"X-Old": "1"},
            rate_limit=RateLimit(per_second=1, burst=1),
        )
    )
    before = snapshot(store)
    response = client.post(f"{PREFIX}/webhooks/subscriptions/sub_1/edit", data={"csrf_token": csrf, **fields})
    assert response.status_code == 422
    assert 'id="form-error"' in text(response) and named in text(response)
    assert snapshot(store) == before


OPTION_TEXT = st.one_of(
    TEXT,
    st.sampled_from(
        [
            json.dumps(EU),
            '{"type": "Exists", "data": {"path": "a"}}',
            "X-A: 1",
            "X-A: 1\nX-B: 2",
            "Host: x",
            "1",
            "0.5",
            "100000",
            "1e308",
            "-1",
            "inf",
            "",
        ]
    ),
)


@BUDGET
@given(
    fields=st.dictionaries(
        st.sampled_from(["payload_filter", "headers", "rate_per_second", "rate_burst"]),
        OPTION_TEXT,
        max_size=4,
    ),
    edit=st.booleans(),
)
def test_any_option_fields_get_a_page_or_a_4xx_and_a_refusal_changes_nothing(
    app: Flask, store: OutboundWebhookHandler, fields: dict[str, str], edit: bool
) -> None:
    """Whatever the option fields hold: never a 5xx; refused (4xx), nothing is written; accepted,
    the stored options are what the fields said."""
    if store.get_subscription("sub_1") is None:
        store.add_subscription(WebhookSubscription("http://127.0.0.1:9/h", ["a.b"], SECRET, id="sub_1"))
    client = app.test_client()
    csrf = signed_in(client)
    before = snapshot(store)
    if edit:
        path, data = f"{PREFIX}/webhooks/subscriptions/sub_1/edit", {**fields, "csrf_token": csrf}
    else:
        path, data = NEW, {**form(csrf, subscription_id="sub_new"), **fields}
    response = client.post(path, data=encoded(data), content_type=FORM)
    assert response.status_code < 500, response.status_code
    if response.status_code >= 400:
        assert 'id="form-error"' in text(response) or response.status_code in (400, 413)
        assert snapshot(store) == before
        return
    assert response.status_code == (303 if edit else 201)
    changed = store.get_subscription("sub_1" if edit else "sub_new")
    assert changed is not None
    assert (changed.rate_limit is None) == (not fields.get("rate_per_second", "").strip())
    assert (changed.payload_filter is None) == (not fields.get("payload_filter", "").strip())
    if not edit:
        store.remove_subscription("sub_new")


# -- the operational endpoint --------------------------------------------------------------------------


def test_the_reserved_subscription_is_marked_and_a_test_reaches_the_endpoint_signed(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    client = dashboard_app(store, **ops_config(receiver)).test_client()
    csrf = signed_in(client)
    store.add_subscription(WebhookSubscription("http://127.0.0.1:9/h", ["a.b"], SECRET, id="sub_1"))
    listing = text(client.get(f"{PREFIX}/webhooks/subscriptions"))
    assert listing.count('id="operational-badge"') == 1
    page = text(client.get(f"{PREFIX}/webhooks/subscriptions/{OPERATIONAL_SUBSCRIPTION_ID}"))
    assert 'id="operational-note"' in page and "HARVEST_OPERATIONAL_WEBHOOK_URL" in page
    # Its URL and secret come from the configuration: no rotation or deletion offered here.
    assert 'id="rotate"' not in page and 'id="delete-subscription"' not in page
    ordinary = text(client.get(f"{PREFIX}/webhooks/subscriptions/sub_1"))
    assert 'id="operational-note"' not in ordinary and 'id="rotate"' in ordinary

    sent = client.post(f"{PREFIX}/webhooks/operational/test", data={"csrf_token": csrf})
    assert sent.status_code == 303
    assert "A test notification was queued" in text(client.get(sent.headers["Location"]))
    [notice] = ops_deliveries(store)
    assert wait_final(store, [notice.id]) == [DeliveryState.DELIVERED]
    [request] = receiver.wait_for(1, path="/ops")
    check_signed(request)
    assert body(request)["type"] == TEST
    # Without the CSRF token nothing is sent.
    assert client.post(f"{PREFIX}/webhooks/operational/test", data={}).status_code == 403
    assert len(ops_deliveries(store)) == 1


def test_a_test_without_an_endpoint_is_a_conflict(client: FlaskClient, csrf: str) -> None:
    response = client.post(f"{PREFIX}/webhooks/operational/test", data={"csrf_token": csrf})
    assert response.status_code == 409
    assert "HARVEST_OPERATIONAL_WEBHOOK_URL" in text(response)
