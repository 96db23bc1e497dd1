"""The one storable-id check (:func:`flask_harvest._input.id_problem`) and every place an id
enters: created ids with a control character are refused with a 4xx, looked-up ones are unknown
(404), never a 5xx and never a change."""

from __future__ import annotations

import unicodedata
import urllib.parse
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import (
    InvalidFieldError,
    OutboundWebhookHandler,
    WebhookSubscription,
    trigger_service,
    workflow_service,
)
from flask_harvest._input import CONTROL_MESSAGE, check_id, id_problem
from flask_harvest.http.cursor import decode_position, encode_position

from .pipeline import make_app
from .properties import BUDGET, TEXT
from .test_actuator import AUTH, PREFIX, SECRET, TOKEN
from .test_triggers_api import AUTH as API_AUTH
from .test_triggers_api import build_app

#: Every C0 control, DEL and every C1 control: Unicode's category Cc.
CONTROLS = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))]
#: Ids with one control character in them, ESC and BEL first (what a terminal acts on).
CONTROL_IDS = st.builds(
    lambda head, char, tail: head + char + tail,
    st.sampled_from(["", "sub_", "msg_1"]),
    st.sampled_from(["\x1b", "\x07", *CONTROLS]),
    st.sampled_from(["", "[31m", "_x"]),
)
#: Anything a caller may pass as an id.
ANY_IDS = st.one_of(TEXT, CONTROL_IDS, st.text(max_size=8), st.sampled_from(["", "sub_1", "é", "\u202e"]))
#: What one path segment can carry: not empty, no "/" (an empty segment is another path, which
#: the router redirects), not a dot segment.
PATH_IDS = ANY_IDS.filter(lambda text: text not in ("", ".", "..") and "/" not in text)


def has_control(text: str) -> bool:
    """Whether ``text`` holds a control character (a lone surrogate, which a URL cannot carry,
    reaches a server as replacement characters: that id is merely unknown)."""
    return any(unicodedata.category(c) == "Cc" for c in text)


def quoted(text: str) -> str:
    return urllib.parse.quote(text.encode("utf-8", "surrogatepass"), safe="")


# -- the function -----------------------------------------------------------------------------------


@pytest.mark.parametrize("char", CONTROLS)
def test_every_control_character_is_refused(char: str) -> None:
    assert id_problem(f"sub{char}1") is not None
    with pytest.raises(InvalidFieldError) as caught:
        check_id(f"sub{char}1", "id")
    assert caught.value.field == "id"
    assert char not in str(caught.value)  # the message never echoes the value


@pytest.mark.parametrize("value", ["sub_1", "é", "\u202e", "ümlaut-ß", "a" * 255, str(uuid.uuid4())])
def test_text_without_control_characters_is_an_id(value: str) -> None:
    assert id_problem(value) is None
    assert check_id(value, "id") == value


@pytest.mark.parametrize(
    ("value", "max_chars"), [("", None), (None, None), (7, None), ("\ud800", None), ("abc", 2)]
)
def test_what_no_row_can_hold_is_not_an_id(value: Any, max_chars: int | None) -> None:
    assert id_problem(value, max_chars=max_chars) is not None


def test_esc_says_control_characters() -> None:
    assert id_problem("\x1b[2J") == CONTROL_MESSAGE


@BUDGET
@given(value=st.one_of(ANY_IDS, st.none(), st.integers()), max_chars=st.none() | st.integers(0, 10))
def test_id_problem_is_the_definition(value: Any, max_chars: int | None) -> None:
    """An id is a non-empty string, within the length, encodable, with no Cc character."""
    expected = (
        isinstance(value, str)
        and bool(value)
        and (max_chars is None or len(value) <= max_chars)
        and not any(unicodedata.category(c) == "Cc" for c in value)
        and not any("\ud800" <= c <= "\udfff" for c in value)
    )
    assert (id_problem(value, max_chars=max_chars) is None) == expected


@BUDGET
@given(row_id=ANY_IDS)
def test_a_cursor_holds_only_an_id(row_id: str) -> None:
    cursor = encode_position(datetime(2026, 1, 1, tzinfo=timezone.utc), row_id)
    if id_problem(row_id) is None and "|" not in row_id:
        assert decode_position(cursor)[1] == row_id
    elif id_problem(row_id) is not None:
        with pytest.raises(InvalidFieldError):
            decode_position(cursor)


# -- webhooks: creation and lookups, on every store -------------------------------------------------


def test_a_subscription_id_with_a_control_character_is_refused(store: OutboundWebhookHandler) -> None:
    for bad in ("sub\x1b[31m", "sub\x07", "sub\x85", "sub\x7f"):
        with pytest.raises(InvalidFieldError):
            WebhookSubscription("https://a.example.com/h", ("a.b",), SECRET, id=bad)
    assert store.list_subscriptions() == []


@pytest.fixture
def actuator(store: OutboundWebhookHandler) -> FlaskClient:
    store.add_subscription(WebhookSubscription("https://a.example.com/h", ("a.b",), SECRET, id="sub_1"))
    return make_app(store, HARVEST_ACTUATOR_TOKEN=TOKEN).test_client()


def test_the_actuator_refuses_a_control_character_in_a_new_id(
    actuator: FlaskClient, store: OutboundWebhookHandler
) -> None:
    body = {"id": "sub\x1b[2J", "target_url": "https://a.example.com/h", "event_topics": ["a.b"]}
    response = actuator.post(f"{PREFIX}/subscriptions", json=body, headers=AUTH)
    assert response.status_code == 422, response.get_data(as_text=True)
    assert [s.id for s in store.list_subscriptions()] == ["sub_1"]


ACTUATOR_ROUTES = [
    ("GET", "/subscriptions/{id}"),
    ("PATCH", "/subscriptions/{id}"),
    ("DELETE", "/subscriptions/{id}"),
    ("POST", "/subscriptions/{id}/rotate-secret"),
    ("GET", "/deliveries/{id}"),
]


@BUDGET
@given(route=st.sampled_from(ACTUATOR_ROUTES), ident=PATH_IDS)
def test_actuator_routes_never_find_an_id_with_a_control_character(
    actuator: FlaskClient, store: OutboundWebhookHandler, route: tuple[str, str], ident: str
) -> None:
    method, path = route
    body = {"description": "d"} if method == "PATCH" else {}
    response = actuator.open(PREFIX + path.format(id=quoted(ident)), method=method, json=body, headers=AUTH)
    assert response.status_code < 500, response.get_data(as_text=True)
    if has_control(ident):
        assert response.status_code == 404, (ident, response.get_data(as_text=True))
    assert [s.id for s in store.list_subscriptions()] in (["sub_1"], [])
    if not store.list_subscriptions():
        store.add_subscription(WebhookSubscription("https://a.example.com/h", ("a.b",), SECRET, id="sub_1"))


# -- workflows, callbacks and triggers ---------------------------------------------------------------


@pytest.fixture
def api(tmp_path: Path) -> Flask:
    return build_app(f"sqlite:///{tmp_path / 'ids.db'}")


def test_a_workflow_id_with_a_control_character_is_refused(api: Flask) -> None:
    client = api.test_client()
    for bad in ("order\x1b[2J", "order\x07", "order\x9b"):
        response = client.post(
            "/api/harvest/workflows/order_flow/start", json={"workflow_id": bad}, headers=API_AUTH
        )
        assert response.status_code == 422, response.get_data(as_text=True)
        assert "workflow_id" in response.get_json()["error"]["fields"]
        with api.app_context(), pytest.raises(InvalidFieldError):
            workflow_service().start("order_flow", None, workflow_id=bad)
    with api.app_context():
        assert workflow_service().list_executions(limit=10)[0] == []


ID_ROUTES = [
    ("GET", "/api/harvest/workflows/{id}"),
    ("GET", "/api/harvest/workflows/{id}/result"),
    ("POST", "/api/harvest/workflows/{id}/cancel"),
    ("POST", "/api/harvest/workflows/{id}/terminate"),
    ("GET", "/api/harvest/workflows/{id}/completion-deliveries"),
    ("POST", "/api/harvest/workflows/{id}/completion-deliveries/{id}/redrive"),
    ("GET", "/api/harvest/admin/completion-triggers/{id}"),
    ("DELETE", "/api/harvest/admin/completion-triggers/{id}"),
    ("GET", "/api/harvest/admin/completion-triggers/{id}/fires"),
]


@BUDGET
@given(route=st.sampled_from(ID_ROUTES), ident=PATH_IDS)
def test_id_routes_never_find_an_id_with_a_control_character(
    api: Flask, route: tuple[str, str], ident: str
) -> None:
    method, path = route
    response = api.test_client().open(path.format(id=quoted(ident)), method=method, json={}, headers=API_AUTH)
    assert response.status_code < 500, response.get_data(as_text=True)
    assert response.is_json
    if has_control(ident):
        assert response.status_code == 404, (ident, response.get_data(as_text=True))


def test_lookups_in_python_find_nothing_for_a_control_character(api: Flask) -> None:
    with api.app_context():
        handle, _ = workflow_service().start("order_flow", {"n": 1}, workflow_id="order-1")
        triggers = trigger_service()
        assert triggers.fires(source_exec_id=handle.execution_id + "\x1b") == []
        assert triggers.fires(trigger_id="\x07") == []
        store = workflow_service().store
        assert store.get(handle.execution_id + "\x1b") is None
        assert store.get_by_workflow_id("order-1\x1b") is None
        assert store.get_by_workflow_id("order-1\x00") is None
        assert store.get_by_workflow_id("order-1") is not None
