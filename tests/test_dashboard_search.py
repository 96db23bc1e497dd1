"""The dashboard's search box: an exact delivery id, outbox message id, execution id or
workflow_id opens its page; anything else says "Not found"; hostile text is a 4xx."""

from __future__ import annotations

import re
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import OutboundWebhookHandler, WebhookSubscription, generate_secret, get_engine

from .dashboard_client import PREFIX, dashboard_app, signed_in, text
from .properties import BUDGET, TEXT
from .test_actuator import dead_letters
from .test_dashboard_properties import encoded, snapshot
from .test_dashboard_workflows import finished, start, workflow_dashboard_app
from .workflow_app import TOKEN as WORKFLOW_TOKEN
from .workflow_app import database_url_fixture
from .workflow_app import snapshot as workflow_snapshot

__all__ = ["database_url_fixture"]

SEARCH = f"{PREFIX}/search"
NOWHERE = "http://127.0.0.1:9/none"


@pytest.fixture
def app(store: OutboundWebhookHandler) -> Flask:
    store.add_subscription(WebhookSubscription(NOWHERE, ["a.b"], generate_secret(), id="sub_1"))
    dead_letters(store, 2)
    return dashboard_app(store)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    client = app.test_client()
    signed_in(client)
    return client


def test_a_delivery_id_opens_the_delivery(client: FlaskClient) -> None:
    response = client.get(SEARCH, query_string={"q": " msg_sub_1_001 "})
    assert response.status_code == 303
    assert response.headers["Location"] == f"{PREFIX}/webhooks/deliveries/msg_sub_1_001"


@pytest.mark.parametrize("query", ["msg_sub_1_00", "MSG_SUB_1_001", "msg_sub_1_001x", "sub_1", "%", "*"])
def test_only_an_exact_id_matches(client: FlaskClient, query: str) -> None:
    """A prefix, another case, a wildcard or a subscription id is not a match: "Not found", 404."""
    response = client.get(SEARCH, query_string={"q": query})
    assert response.status_code == 404
    assert 'id="search-not-found"' in text(response)
    assert "Not found" in text(response)


def test_an_empty_search_shows_the_page(client: FlaskClient) -> None:
    for query in ({}, {"q": ""}, {"q": "   "}):
        response = client.get(SEARCH, query_string=query)
        assert response.status_code == 200
        assert "search-not-found" not in text(response)


def test_the_box_is_on_every_page_once_signed_in(app: Flask, client: FlaskClient) -> None:
    for path in ("/", "/webhooks/subscriptions", "/webhooks/deliveries", "/webhooks/replay"):
        page = text(client.get(f"{PREFIX}{path}"))
        assert 'role="search"' in page and 'name="q"' in page, path
    # Not on the sign-in form, and the search itself needs a sign-in.
    anonymous = app.test_client()
    assert 'role="search"' not in text(anonymous.get(f"{PREFIX}/sign-in"))
    refused = anonymous.get(SEARCH, query_string={"q": "msg_sub_1_001"})
    assert refused.status_code == 303 and "/sign-in" in refused.headers["Location"]


def test_the_searched_text_is_shown_escaped(client: FlaskClient) -> None:
    page = text(client.get(SEARCH, query_string={"q": "<script>alert(1)</script>"}))
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page


@pytest.mark.parametrize("query", ["a\x00b", "x" * 513])
def test_bad_text_is_refused(client: FlaskClient, query: str) -> None:
    response = client.get(SEARCH, query_string={"q": query})
    assert response.status_code == 422
    assert "q" in text(response)


@BUDGET
@given(query=st.one_of(TEXT, st.sampled_from(["msg_sub_1_000", "sub_1", "evt_0", "a/b", "..", "%2F"])))
def test_any_search_is_a_4xx_or_a_page_and_changes_nothing(
    app: Flask, store: OutboundWebhookHandler, query: str
) -> None:
    """Hostile text in the box never reaches a 5xx and changes nothing."""
    client = app.test_client()
    signed_in(client)
    before = snapshot(store)
    response = client.get(SEARCH, query_string=encoded({"q": query}))
    assert response.status_code in (200, 303, 404, 422), response.status_code
    assert "Traceback" not in text(response)
    assert snapshot(store) == before


# -- workflows and the outbox ------------------------------------------------------------------------


@pytest.fixture
def workflow_app(database_url: str) -> Flask:
    return workflow_dashboard_app(database_url)


@pytest.fixture
def workflow_client(workflow_app: Flask) -> FlaskClient:
    client = workflow_app.test_client()
    signed_in(client, WORKFLOW_TOKEN)
    return client


def test_an_execution_id_or_workflow_id_opens_the_execution(
    workflow_app: Flask, workflow_client: FlaskClient
) -> None:
    """An execution id opens that run; a workflow_id opens its latest run."""
    first = start(workflow_app, "echo", 1, workflow_id="order-1001")
    finished(workflow_app, first)
    for query in (first, "order-1001"):
        response = workflow_client.get(SEARCH, query_string={"q": query})
        assert response.status_code == 303, query
        assert response.headers["Location"] == f"{PREFIX}/workflows/{first}"
    assert workflow_client.get(SEARCH, query_string={"q": "order-1002"}).status_code == 404


def test_an_outbox_message_id_opens_its_delivery_or_lists_them(
    workflow_app: Flask, workflow_client: FlaskClient, database_url: str
) -> None:
    """A message id opens the delivery made from it; with two subscriptions, lists both."""
    with workflow_app.app_context():
        engine = get_engine()
        for sub_id in ("sub_a", "sub_b"):
            engine.operations.store.add_subscription(
                WebhookSubscription(NOWHERE, ["order.created"], generate_secret(), id=sub_id)
            )
        database = sa.create_engine(database_url)
        try:
            with database.begin() as conn:
                message_id = engine.manager.dispatch_in_tx(conn, "order.created", {"ref": "ord_1"})
        finally:
            database.dispose()
    # Not relayed yet: no delivery exists, so the message id finds nothing.
    assert workflow_client.get(SEARCH, query_string={"q": message_id}).status_code == 404
    with workflow_app.app_context():
        assert get_engine().operations.relay_outbox() == (1, 0)
    response = workflow_client.get(SEARCH, query_string={"q": message_id})
    assert response.status_code == 200
    page = text(response)
    links = re.findall(r'href="([^"]+/webhooks/deliveries/msg_[0-9a-f]{32})"', page)
    assert len(links) == 2, page
    for link in links:
        assert workflow_client.get(link).status_code == 200
    # Each delivery's own id still opens it.
    delivery_id = links[0].rsplit("/", 1)[1]
    assert workflow_client.get(SEARCH, query_string={"q": delivery_id}).headers["Location"] == links[0]


@BUDGET
@given(query=st.one_of(TEXT, st.sampled_from(["order-1001", "evt_", "00000000-0000-0000-0000-000000000000"])))
def test_any_search_on_a_workflow_app_changes_nothing(workflow_app: Flask, query: str) -> None:
    """Hostile text in the box never reaches a 5xx on a workflow app, and changes nothing."""
    client = workflow_app.test_client()
    signed_in(client, WORKFLOW_TOKEN)
    before: Any = workflow_snapshot(workflow_app)
    response = client.get(SEARCH, query_string=encoded({"q": query}))
    assert response.status_code in (200, 303, 404, 422), response.status_code
    assert workflow_snapshot(workflow_app) == before
