"""The console and ordered delivery: the ordering policy in the new-subscription and edit forms
(checked as the admin API checks it, nothing written on a refusal), and a subscription's blocked
keys with the operator's skip (CSRF-protected)."""

from __future__ import annotations

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import DeliveryState, OutboundWebhookHandler, WebhookSubscription
from flask_harvest.webhooks.models import utcnow
from flask_harvest.webhooks.ordering import OrderingPolicy

from .dashboard_client import PREFIX, dashboard_app, signed_in, text
from .properties import BUDGET, TEXT
from .test_dashboard_properties import FORM, encoded
from .test_dashboard_subscription_options import NEW, form, snapshot
from .test_operational_webhooks import SECRET
from .test_ordered_store import fail_attempt, log_keyed

EDIT = f"{PREFIX}/webhooks/subscriptions/sub_1/edit"


@pytest.fixture
def app(store: OutboundWebhookHandler) -> Flask:
    return dashboard_app(store)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def csrf(client: FlaskClient) -> str:
    return signed_in(client)


def _add(store: OutboundWebhookHandler, policy: OrderingPolicy = OrderingPolicy.BLOCK) -> str:
    subscription = WebhookSubscription(
        "http://127.0.0.1:9/h", ["a.b"], SECRET, id="sub_1", ordering_policy=policy
    )
    return store.add_subscription(subscription).id


def _policy(store: OutboundWebhookHandler, subscription_id: str) -> OrderingPolicy:
    found = store.get_subscription(subscription_id)
    assert found is not None
    return found.ordering_policy


def test_the_forms_offer_the_policy_and_create_and_edit_set_it(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler
) -> None:
    blank = text(client.get(NEW))
    assert 'name="ordering_policy"' in blank and '<option value="block" selected>' in blank
    created = client.post(NEW, data=form(csrf, subscription_id="sub_1", ordering_policy="skip"))
    assert created.status_code == 201, text(created)
    assert _policy(store, "sub_1") is OrderingPolicy.SKIP
    page = text(client.get(f"{PREFIX}/webhooks/subscriptions/sub_1"))
    assert 'id="ordering-policy">skip' in page
    assert '<option value="skip" selected>' in text(client.get(EDIT))
    saved = client.post(EDIT, data={"csrf_token": csrf, "ordering_policy": "block"})
    assert saved.status_code == 303
    assert _policy(store, "sub_1") is OrderingPolicy.BLOCK
    # An edit that leaves the field out changes nothing of the policy; a creation takes the default.
    assert client.post(EDIT, data={"csrf_token": csrf, "headers": "X-A: 1"}).status_code == 303
    assert _policy(store, "sub_1") is OrderingPolicy.BLOCK
    assert client.post(NEW, data=form(csrf, subscription_id="sub_2")).status_code == 201
    assert _policy(store, "sub_2") is OrderingPolicy.BLOCK


@pytest.mark.parametrize("bad", ["maybe", "BLOCK", "skip!", "0", "x" * 64])
def test_a_bad_policy_is_refused_in_the_form_and_changes_nothing(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler, bad: str
) -> None:
    refused = client.post(NEW, data=form(csrf, description="kept", ordering_policy=bad))
    assert refused.status_code == 422
    assert 'id="form-error"' in text(refused) and "ordering_policy" in text(refused)
    assert 'value="kept"' in text(refused)
    assert store.list_subscriptions() == []
    _add(store, OrderingPolicy.SKIP)
    before = snapshot(store)
    refused = client.post(EDIT, data={"csrf_token": csrf, "ordering_policy": bad, "headers": "X-New: 1"})
    assert refused.status_code == 422
    assert 'id="form-error"' in text(refused) and "ordering_policy" in text(refused)
    assert snapshot(store) == before


POLICY_TEXT = st.one_of(TEXT, st.sampled_from(["block", "skip", "", " skip ", "Skip", "block\n", "none"]))


@BUDGET
@given(policy=POLICY_TEXT, edit=st.booleans())
def test_any_policy_field_gets_a_page_or_a_4xx_and_a_refusal_changes_nothing(
    app: Flask, store: OutboundWebhookHandler, policy: str, edit: bool
) -> None:
    """Whatever the field holds: never a 5xx; refused, nothing is written; accepted, the stored
    policy is what the field said (empty: unchanged on an edit, the default on creation)."""
    if store.get_subscription("sub_1") is None:
        _add(store, OrderingPolicy.SKIP)
    client = app.test_client()
    csrf = signed_in(client)
    before, previous = snapshot(store), _policy(store, "sub_1")
    if edit:
        path, data = EDIT, {"ordering_policy": policy, "csrf_token": csrf}
    else:
        path, data = NEW, {**form(csrf, subscription_id="sub_new"), "ordering_policy": policy}
    response = client.post(path, data=encoded(data), content_type=FORM)
    assert response.status_code < 500, response.status_code
    if response.status_code >= 400:
        assert 'id="form-error"' in text(response) or response.status_code in (400, 413)
        assert snapshot(store) == before
        return
    assert response.status_code == (303 if edit else 201)
    wanted = policy.strip() or (previous.value if edit else OrderingPolicy.BLOCK.value)
    assert _policy(store, "sub_1" if edit else "sub_new").value == wanted
    if not edit:
        store.remove_subscription("sub_new")


def test_the_page_lists_blocked_keys_and_an_operator_skips_one(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler
) -> None:
    sub = _add(store)
    now = utcnow()
    page_path = f"{PREFIX}/webhooks/subscriptions/{sub}"
    assert 'id="blocked-keys-none"' in text(client.get(page_path))
    # Logged straight into the store: no job, and the sweeper leaves rows due less than 2 s alone.
    head, waiting = log_keyed(store, sub, now, "order-42"), log_keyed(store, sub, now, "order-42")
    fail_attempt(store, head, now, DeliveryState.DLQ)
    page = text(client.get(page_path))
    assert 'id="blocked-keys"' in page and "order-42" in page and head.id in page
    skip_path = f"{PREFIX}/webhooks/deliveries/{head.id}/skip"
    assert skip_path in page
    # Without the session's CSRF token: refused, nothing changes.
    assert client.post(skip_path).status_code == 403
    assert client.post(skip_path, data={"csrf_token": "forged"}).status_code == 403
    assert store.get_delivery(head.id).state is DeliveryState.DLQ  # type: ignore[union-attr]
    skipped = client.post(skip_path, data={"csrf_token": csrf})
    assert skipped.status_code == 303 and skipped.headers["Location"].endswith(f"{sub}?done=skipped")
    assert store.get_delivery(head.id).state is DeliveryState.SKIPPED  # type: ignore[union-attr]
    after = text(client.get(f"{page_path}?done=skipped"))
    assert "Skipped: the next delivery of its key is queued." in after
    assert 'id="blocked-keys-none"' in after
    assert store.get_delivery(waiting.id) is not None
    # A delivery that is not dead-lettered (now skipped) or does not exist: a 4xx page, no change.
    again = client.post(skip_path, data={"csrf_token": csrf})
    assert again.status_code == 409
    assert store.get_delivery(head.id).state is DeliveryState.SKIPPED  # type: ignore[union-attr]
    assert (
        client.post(f"{PREFIX}/webhooks/deliveries/dlv_missing/skip", data={"csrf_token": csrf}).status_code
        == 404
    )
