"""Bulk replay from the deliveries list: replay selected, replay all shown; on every store."""

from __future__ import annotations

import re

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import DeliveryState, OutboundWebhookHandler, WebhookSubscription, generate_secret

from .dashboard_client import PREFIX, dashboard_app, signed_in, text
from .properties import BUDGET, TEXT
from .test_actuator import dead_letters
from .test_dashboard_properties import FORM, encoded, snapshot

REPLAY = f"{PREFIX}/webhooks/deliveries/replay-selected"
DLQ_LIST = f"{PREFIX}/webhooks/deliveries?state=dlq"
NOWHERE = "http://127.0.0.1:9/none"


@pytest.fixture
def app(store: OutboundWebhookHandler, redis_url: str, redis_conn: object) -> Flask:
    store.add_subscription(WebhookSubscription(NOWHERE, ["a.b"], generate_secret(), id="sub_1"))
    # The RQ backend with no worker: a replayed delivery stays pending, so its state is checked
    # without racing a send.
    return dashboard_app(store, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def csrf(client: FlaskClient) -> str:
    return signed_in(client)


def states(store: OutboundWebhookHandler, ids: list[str]) -> list[DeliveryState]:
    found = {d.id: d.state for d in store.get_deliveries(ids)}
    return [found[i] for i in ids]


def test_dead_lettered_rows_have_checkboxes(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler
) -> None:
    ids = dead_letters(store, 3)
    page = text(client.get(DLQ_LIST))
    assert sorted(re.findall(r'name="delivery_id" value="([^"]+)"', page)) == sorted(ids)
    assert sorted(re.findall(r'name="shown" value="([^"]+)"', page)) == sorted(ids)
    assert 'id="replay-selected"' in page and 'id="replay-all-shown"' in page
    assert 'name="csrf_token"' in page.split('id="dlq-select"')[1]
    # A list without a dead-lettered row has no selection form.
    assert 'id="dlq-select"' not in text(client.get(f"{PREFIX}/webhooks/deliveries?state=pending"))


def test_replay_selected_replays_only_those(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler
) -> None:
    ids = dead_letters(store, 3)
    data = {"csrf_token": csrf, "action": "selected", "delivery_id": ids[:2], "shown": ids}
    response = client.post(REPLAY, data=data)
    assert response.status_code == 200
    page = text(response)
    replayed = page.split('id="replay-ids"')[1]
    assert sorted(re.findall(r"<li><a [^>]+>(msg_[^<]+)</a></li>", replayed)) == ids[:2]
    assert states(store, ids) == [DeliveryState.PENDING, DeliveryState.PENDING, DeliveryState.DLQ]


def test_replay_all_shown_and_a_row_replayed_meanwhile(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler
) -> None:
    """Every shown row is replayed; one that left the DLQ meanwhile is listed with the reason."""
    ids = dead_letters(store, 3)
    first = client.post(REPLAY, data={"csrf_token": csrf, "action": "selected", "delivery_id": [ids[0]]})
    assert first.status_code == 200
    response = client.post(REPLAY, data={"csrf_token": csrf, "action": "all", "shown": [*ids, "msg_gone"]})
    assert response.status_code == 200
    page = text(response)
    not_replayed = page.split('id="not-replayed"')[1]
    assert ids[0] in not_replayed and "msg_gone" in not_replayed
    assert states(store, ids) == [DeliveryState.PENDING] * 3


@pytest.mark.parametrize(
    "data",
    [
        {"action": "selected"},
        {"action": "selected", "shown": ["msg_sub_1_000"]},
        {"action": "nope", "delivery_id": ["msg_sub_1_000"]},
        {"action": "all"},
        {"action": "selected", "delivery_id": [f"msg_{n}" for n in range(51)]},
        {"action": "selected", "delivery_id": ["a\x00b"]},
    ],
)
def test_bad_selections_are_refused_and_change_nothing(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler, data: dict[str, object]
) -> None:
    ids = dead_letters(store, 1)
    response = client.post(REPLAY, data={"csrf_token": csrf, **data})
    assert response.status_code == 422
    assert states(store, ids) == [DeliveryState.DLQ]


def test_replay_needs_the_csrf_token(client: FlaskClient, csrf: str, store: OutboundWebhookHandler) -> None:
    ids = dead_letters(store, 1)
    response = client.post(REPLAY, data={"action": "all", "shown": ids})
    assert response.status_code == 403
    assert states(store, ids) == [DeliveryState.DLQ]


@BUDGET
@given(
    fields=st.dictionaries(
        st.sampled_from(["action", "delivery_id", "shown"]),
        st.one_of(TEXT, st.sampled_from(["selected", "all", "msg_sub_1_000", ""])),
        max_size=3,
    )
)
def test_hostile_forms_never_fail(app: Flask, store: OutboundWebhookHandler, fields: dict[str, str]) -> None:
    """Any form: a page or a 4xx, never a 5xx; a refused one changes nothing."""
    client = app.test_client()
    csrf = signed_in(client)
    before = snapshot(store)
    response = client.post(REPLAY, data=encoded({**fields, "csrf_token": csrf}), content_type=FORM)
    assert response.status_code < 500
    if response.status_code >= 400:
        assert snapshot(store) == before
