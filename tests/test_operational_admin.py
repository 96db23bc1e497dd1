"""The operational endpoint from the actuator and the CLI: its status, and a test notification
delivered signed to a real receiver on 127.0.0.1; the same access rules and JSON errors as every
actuator route, and any body refused or accepted without a 5xx. On every store."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import DeliveryState, OutboundWebhookHandler, WebhookSubscriptionStatus
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.models import SubscriptionChanges
from flask_harvest.webhooks.operational import KINDS, OPERATIONAL_SUBSCRIPTION_ID, TEST

from .pipeline import make_app, wait_final
from .properties import BUDGET
from .test_actuator import AUTH, PREFIX, TOKEN
from .test_operational_webhooks import OPS_SECRET, body, check_signed, ops_config, ops_deliveries

STATUS = f"{PREFIX}/operational"
TEST_ROUTE = f"{PREFIX}/operational/test"


def test_the_actuator_shows_the_endpoint_and_sends_a_signed_test(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    client = make_app(store, HARVEST_ACTUATOR_TOKEN=TOKEN, **ops_config(receiver)).test_client()
    status = client.get(STATUS, headers=AUTH)
    assert status.status_code == 200
    shown = status.get_json()
    assert shown["configured"] is True and shown["kinds"] == list(KINDS)
    assert shown["subscription"]["id"] == OPERATIONAL_SUBSCRIPTION_ID
    assert shown["subscription"]["target_url"] == receiver.url("/ops")
    assert shown["rate_limit_hold_seconds"] == 300 and shown["recent"] == []
    assert OPS_SECRET not in status.get_data(as_text=True)

    sent = client.post(TEST_ROUTE, headers=AUTH, json={})
    assert sent.status_code == 202, sent.get_json()
    assert sent.get_json()["topic"] == TEST
    assert wait_final(store, [sent.get_json()["id"]]) == [DeliveryState.DELIVERED]
    [request] = receiver.wait_for(1, path="/ops")
    check_signed(request)
    assert body(request)["type"] == TEST and request.webhook_id == sent.get_json()["id"]
    assert [d["id"] for d in client.get(STATUS, headers=AUTH).get_json()["recent"]] == [request.webhook_id]


def test_the_routes_are_closed_and_answer_json_errors(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    client = make_app(store, HARVEST_ACTUATOR_TOKEN=TOKEN, **ops_config(receiver)).test_client()
    assert client.get(STATUS).status_code == 401
    assert client.post(TEST_ROUTE, json={}).status_code == 401
    # A JSON body is required (a cross-site form cannot send one), and it has no fields.
    assert (
        client.post(
            TEST_ROUTE, headers=AUTH, data="x=1", content_type="application/x-www-form-urlencoded"
        ).status_code
        == 415
    )
    unknown = client.post(TEST_ROUTE, headers=AUTH, json={"to": "elsewhere"})
    assert unknown.status_code == 422 and "error" in unknown.get_json()
    closed = make_app(store, **ops_config(receiver)).test_client()
    assert closed.get(STATUS).status_code == 403
    assert ops_deliveries(store) == []


def test_without_an_endpoint_the_status_says_so_and_a_test_is_a_conflict(
    store: OutboundWebhookHandler,
) -> None:
    client = make_app(store, HARVEST_ACTUATOR_TOKEN=TOKEN).test_client()
    shown = client.get(STATUS, headers=AUTH).get_json()
    assert (shown["configured"], shown["subscription"], shown["recent"]) == (False, None, [])
    refused = client.post(TEST_ROUTE, headers=AUTH, json={})
    assert refused.status_code == 409
    assert "HARVEST_OPERATIONAL_WEBHOOK_URL" in refused.get_json()["error"]["message"]
    assert store.list_deliveries(limit=10) == []


def test_a_turned_off_endpoint_is_not_sent_a_test(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    client = make_app(store, HARVEST_ACTUATOR_TOKEN=TOKEN, **ops_config(receiver)).test_client()
    store.update_subscription(
        OPERATIONAL_SUBSCRIPTION_ID, SubscriptionChanges(status=WebhookSubscriptionStatus.FAILED)
    )
    refused = client.post(TEST_ROUTE, headers=AUTH, json={})
    assert refused.status_code == 409 and "enable" in refused.get_json()["error"]["message"]
    assert ops_deliveries(store) == []


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


@BUDGET
@given(payload=JSON)
def test_any_body_is_a_202_or_a_4xx_that_sends_nothing(
    store: OutboundWebhookHandler, receiver: CapturingReceiver, payload: Any
) -> None:
    client = make_app(
        store, HARVEST_ACTUATOR_TOKEN=TOKEN, HARVEST_JOBS_BACKEND="local", **ops_config(receiver)
    ).test_client()
    before = len(ops_deliveries(store))
    response = client.post(
        TEST_ROUTE, headers=AUTH, data=json.dumps(payload), content_type="application/json"
    )
    assert response.status_code < 500
    if response.status_code >= 400:
        assert "error" in response.get_json()
        assert len(ops_deliveries(store)) == before
    else:
        assert payload == {} and response.status_code == 202
        assert len(ops_deliveries(store)) == before + 1


# -- the CLI -----------------------------------------------------------------------------------------


def test_the_cli_shows_the_status_and_sends_a_test(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    runner = make_app(store, **ops_config(receiver)).test_cli_runner()
    status = runner.invoke(args=["harvest", "operational", "status"])
    assert status.exit_code == 0, status.output
    assert OPERATIONAL_SUBSCRIPTION_ID in status.output and "no notifications yet" in status.output
    assert OPS_SECRET not in status.output
    sent = runner.invoke(args=["harvest", "operational", "test", "--json"])
    assert sent.exit_code == 0, sent.output
    shown = json.loads(sent.output)
    assert shown["topic"] == TEST
    # The local backend's job ran before the command returned.
    assert shown["state"] == DeliveryState.DELIVERED.value and len(shown["attempts"]) == 1
    [request] = receiver.wait_for(1, path="/ops")
    check_signed(request)
    listed = json.loads(runner.invoke(args=["harvest", "operational", "status", "--json"]).output)
    assert [d["id"] for d in listed["recent"]] == [shown["id"]]


def test_the_cli_without_an_endpoint(store: OutboundWebhookHandler) -> None:
    runner = make_app(store).test_cli_runner()
    status = runner.invoke(args=["harvest", "operational", "status"])
    assert status.exit_code == 0 and "no operational endpoint is configured" in status.output
    refused = runner.invoke(args=["harvest", "operational", "test"])
    assert refused.exit_code == 1 and refused.output.startswith("Error: ")
    assert "Traceback" not in refused.output
