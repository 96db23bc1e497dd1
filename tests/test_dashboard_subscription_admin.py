"""Subscriptions from the console: create (SSRF policy, the secret shown once), delete after a
confirmation, and the last hour's success rate and latency; on every store."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import DeliveryState, OutboundWebhookHandler, get_engine
from flask_harvest._time import utcnow
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.attempt_stats import attempt_stats, nearest_rank
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .dashboard_client import PREFIX, dashboard_app, signed_in, text
from .pipeline import wait_final
from .properties import BUDGET, TEXT
from .test_actuator import dead_letters
from .test_dashboard_properties import FORM, encoded, snapshot

NEW = f"{PREFIX}/webhooks/subscriptions/new"
SECRET_SHOWN = re.compile(r'id="new-secret">(whsec_[^<]+)<')


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
    values = {"target_url": "http://127.0.0.1:9/hook", "topics": "order.created, order.*", "csrf_token": csrf}
    values.update(fields)
    return values


# -- create ------------------------------------------------------------------------------------------


def test_create_shows_the_secret_once(client: FlaskClient, csrf: str, store: OutboundWebhookHandler) -> None:
    """The answer to a creation shows the generated secret; no page shows it again."""
    assert 'id="create-subscription"' in text(client.get(NEW))
    created = client.post(NEW, data=form(csrf, description="shop <b>", subscription_id="sub_new"))
    assert created.status_code == 201
    assert created.headers["Cache-Control"] == "no-store"
    found = SECRET_SHOWN.search(text(created))
    assert found
    secret = found.group(1)
    [stored] = store.list_subscriptions()
    assert (stored.id, stored.secret) == ("sub_new", secret)
    assert list(stored.event_topics) == ["order.created", "order.*"]
    assert stored.description == "shop <b>" and "shop &lt;b&gt;" in text(created)
    for path in ("/webhooks/subscriptions", "/webhooks/subscriptions/sub_new", "/"):
        assert secret not in text(client.get(f"{PREFIX}{path}")), path


def test_the_ssrf_policy_applies(store: OutboundWebhookHandler) -> None:
    """A target the outbound policy refuses is refused with its reason; nothing is stored."""
    client = dashboard_app(store, HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS=False).test_client()
    csrf = signed_in(client)
    for target in ("http://10.0.0.5/hook", "http://127.0.0.1/hook", "http://169.254.169.254/latest"):
        response = client.post(NEW, data=form(csrf, target_url=target, description="kept"))
        assert response.status_code == 422, target
        page = text(response)
        assert 'id="form-error"' in page and "target_url" in page
        assert 'value="kept"' in page  # what was typed comes back
        assert not SECRET_SHOWN.search(page)
    assert store.list_subscriptions() == []


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({"topics": ""}, 422),
        ({"topics": "a..b"}, 422),
        ({"target_url": "ftp://example.com/x"}, 422),
        ({"target_url": ""}, 422),
        ({"subscription_id": "a\x00b"}, 422),
    ],
)
def test_bad_fields_are_refused_and_store_nothing(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler, fields: dict[str, str], status: int
) -> None:
    response = client.post(NEW, data=form(csrf, **fields))
    assert response.status_code == status
    assert store.list_subscriptions() == []


def test_a_taken_id_is_a_conflict(client: FlaskClient, csrf: str, store: OutboundWebhookHandler) -> None:
    assert client.post(NEW, data=form(csrf, subscription_id="sub_x")).status_code == 201
    again = client.post(NEW, data=form(csrf, subscription_id="sub_x", target_url="http://127.0.0.1:9/other"))
    assert again.status_code == 409
    assert [s.target_url for s in store.list_subscriptions()] == ["http://127.0.0.1:9/hook"]


def test_create_needs_the_csrf_token(client: FlaskClient, csrf: str, store: OutboundWebhookHandler) -> None:
    assert client.post(NEW, data=form("forged")).status_code == 403
    assert store.list_subscriptions() == []


# -- delete ------------------------------------------------------------------------------------------


def test_delete_after_a_confirmation(client: FlaskClient, csrf: str, store: OutboundWebhookHandler) -> None:
    """Delete asks first; without the box ticked nothing changes; the delivery logs stay."""
    client.post(NEW, data=form(csrf, subscription_id="sub_1"))
    [delivery_id] = dead_letters(store, 1)
    page = text(client.get(f"{PREFIX}/webhooks/subscriptions/sub_1"))
    assert 'id="delete-subscription"' in page
    url = f"{PREFIX}/webhooks/subscriptions/sub_1/delete"
    assert 'id="confirm-delete"' in text(client.get(url))
    assert client.post(url, data={"csrf_token": csrf}).status_code == 422
    assert client.post(url, data={"confirm": "yes"}).status_code == 403
    assert store.get_subscription("sub_1") is not None
    done = client.post(url, data={"confirm": "yes", "csrf_token": csrf})
    assert done.status_code == 303
    listed = text(client.get(done.headers["Location"]))
    assert "Deleted." in listed and "sub_1<" not in listed
    assert store.get_subscription("sub_1") is None
    assert store.get_delivery(delivery_id) is not None
    assert client.get(url).status_code == 404
    assert client.post(url, data={"confirm": "yes", "csrf_token": csrf}).status_code == 404


# -- health ------------------------------------------------------------------------------------------


def test_nearest_rank_percentiles() -> None:
    assert nearest_rank([], 0.5) is None
    assert nearest_rank([7], 0.99) == 7
    values = list(range(1, 101))
    assert (nearest_rank(values, 0.5), nearest_rank(values, 0.99), nearest_rank(values, 1.0)) == (50, 99, 100)


def test_attempt_stats_counts_2xx_as_success_and_no_answer_as_failure() -> None:
    stats = attempt_stats([(200, 10), (204, 30), (500, 20), (None, None), (None, 5000)])
    assert (stats.attempts, stats.succeeded, stats.success_rate) == (5, 2, 0.4)
    assert (stats.p50_ms, stats.p99_ms) == (20, 5000)
    assert attempt_stats([]).success_rate is None and attempt_stats([]).p50_ms is None


def test_the_subscription_page_shows_the_last_hour(
    client: FlaskClient, csrf: str, app: Flask, store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    """Success rate and p50/p99 latency over the last hour's attempts, from real deliveries."""
    client.post(NEW, data=form(csrf, subscription_id="sub_h", target_url=receiver.url("/hook")))
    empty = text(client.get(f"{PREFIX}/webhooks/subscriptions/sub_h"))
    assert re.search(r'id="health-attempts">0<', empty) and "no attempt" in empty
    receiver.respond("/hook", status=500, times=1)  # the first attempt fails, its retry succeeds
    with app.app_context():
        ids = [d for n in range(3) for d in get_engine().manager.dispatch("order.created", {"n": n})]
    assert wait_final(store, ids) == [DeliveryState.DELIVERED]
    page = text(client.get(f"{PREFIX}/webhooks/subscriptions/sub_h"))
    if isinstance(store, SqlOutboundWebhookStore):
        assert re.search(r'id="health-attempts">4<', page)
        assert "75.0% (3 answered 2xx)" in page
    else:  # the in-memory store keeps each delivery's latest attempt only
        assert re.search(r'id="health-attempts">3<', page)
        assert "100.0% (3 answered 2xx)" in page
    assert re.search(r'id="health-latency">\d+ ms / \d+ ms<', page)
    # The store's sample is the window's: nothing before the hour counts.
    with app.app_context():
        later = utcnow() + timedelta(seconds=1)
        rows = get_engine().operations.store.recent_attempts("sub_h", since=later, limit=10)
    assert rows == []


# -- hostile input -----------------------------------------------------------------------------------


@BUDGET
@given(
    fields=st.dictionaries(
        st.sampled_from(["target_url", "topics", "description", "subscription_id", "confirm"]),
        st.one_of(
            TEXT, st.sampled_from(["http://127.0.0.1:9/x", "a.b", "yes", "sub_1", "*", "http://[::1]/"])
        ),
        max_size=5,
    ),
    path=st.sampled_from(["/webhooks/subscriptions/new", "/webhooks/subscriptions/sub_1/delete"]),
)
def test_hostile_forms_never_fail_and_refusals_change_nothing(
    app: Flask, store: OutboundWebhookHandler, fields: dict[str, str], path: str
) -> None:
    """Any form: a page or a 4xx, never a 5xx; a refused one changes nothing."""
    client = app.test_client()
    csrf = signed_in(client)
    before = snapshot(store)
    response = client.post(f"{PREFIX}{path}", data=encoded({**fields, "csrf_token": csrf}), content_type=FORM)
    assert response.status_code < 500, response.status_code
    if response.status_code >= 400:
        assert snapshot(store) == before
