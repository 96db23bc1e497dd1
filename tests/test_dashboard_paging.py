"""First, previous and next pages on every dashboard list, with a capped total ("1-50 of 1,000+")."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import OutboundWebhookHandler, WebhookSubscription, generate_secret
from flask_harvest.dashboard.paging import COUNT_CAP, PAGE_SIZE, TRAIL_KEPT, capped_count, range_text

from .dashboard_client import PREFIX, dashboard_app, signed_in, text
from .properties import BUDGET, TEXT
from .test_actuator import dead_letters
from .test_dashboard_properties import encoded, snapshot
from .test_dashboard_workflows import start, workflow_dashboard_app
from .workflow_app import TOKEN as WORKFLOW_TOKEN
from .workflow_app import database_url_fixture

__all__ = ["database_url_fixture"]

DASH = "\u2013"


def list_fetch(rows: Sequence[int]) -> Any:
    """A list's ``fetch`` over ``rows``, its cursor the index of the next row as text."""

    def fetch(cursor: str | None, limit: int) -> tuple[list[int], str | None]:
        start = int(cursor or 0)
        page = list(rows[start : start + limit])
        return page, str(start + limit) if start + limit < len(rows) else None

    return fetch


@pytest.mark.parametrize(
    ("rows", "cap", "counted"),
    [(0, 1000, (0, False)), (7, 1000, (7, False)), (1000, 1000, (1000, False)), (1001, 1000, (1000, True)),
     (5000, 1000, (1000, True)), (3, 2, (2, True)), (2, 2, (2, False)), (501, 1000, (501, False))],
)  # fmt: skip
def test_the_count_stops_at_the_cap(rows: int, cap: int, counted: tuple[int, bool]) -> None:
    assert capped_count(list_fetch(range(rows)), cap) == counted


def test_the_count_reads_at_most_the_cap_and_one_probe() -> None:
    asked: list[int] = []
    inner = list_fetch(range(100_000))

    def fetch(cursor: str | None, limit: int) -> tuple[list[int], str | None]:
        asked.append(limit)
        return inner(cursor, limit)  # type: ignore[no-any-return]

    assert capped_count(fetch, 1000) == (1000, True)
    assert sum(asked) <= 1000 + 1


@pytest.mark.parametrize(
    ("number", "shown", "total", "capped", "text_"),
    [(1, 50, 10_000, True, f"1{DASH}50 of 10,000+"), (2, 50, 137, False, f"51{DASH}100 of 137"),
     (3, 37, 137, False, f"101{DASH}137 of 137"), (1, 0, 0, False, "0 of 0")],
)  # fmt: skip
def test_the_range_text(number: int, shown: int, total: int, capped: bool, text_: str) -> None:
    assert range_text(number, shown, total, capped) == text_


# -- through the pages -------------------------------------------------------------------------------


@pytest.fixture
def app(store: OutboundWebhookHandler) -> Flask:
    return dashboard_app(store)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    client = app.test_client()
    signed_in(client)
    return client


def link(page: str, element_id: str) -> str | None:
    found = re.search(rf'id="{element_id}" href="([^"]+)"', page)
    return html.unescape(found.group(1)) if found else None


def shown_range(page: str) -> str:
    found = re.search(r'<span id="page-range">([^<]+)</span>', page)
    assert found, "the page has no range"
    return html.unescape(found.group(1))


def delivery_ids(page: str) -> list[str]:
    return re.findall(r'href="[^"]*/webhooks/deliveries/(msg_[^"]+)"', page)


def test_subscriptions_walk_forward_and_back(store: OutboundWebhookHandler, client: FlaskClient) -> None:
    """Next, previous and first pages show the same rows each time, with the range of each."""
    for n in range(120):
        store.add_subscription(
            WebhookSubscription("http://127.0.0.1:9/none", ["a.b"], generate_secret(), id=f"sub_{n:03d}")
        )
    first = text(client.get(f"{PREFIX}/webhooks/subscriptions?topic=a.b"))
    assert shown_range(first) == f"1{DASH}50 of 120"
    assert link(first, "first-page") is None and link(first, "previous-page") is None
    second_url = link(first, "next-page")
    assert second_url and "topic=a.b" in second_url  # the filter is kept
    second = text(client.get(second_url))
    assert shown_range(second) == f"51{DASH}100 of 120"
    third = text(client.get(link(second, "next-page") or ""))
    assert shown_range(third) == f"101{DASH}120 of 120" and link(third, "next-page") is None
    back = text(client.get(link(third, "previous-page") or ""))
    assert shown_range(back) == f"51{DASH}100 of 120"
    rows = re.compile(r"/webhooks/subscriptions/(sub_\d+)")
    assert rows.findall(back) == rows.findall(second)
    for url in (link(back, "previous-page"), link(third, "first-page")):
        again = text(client.get(url or ""))
        assert shown_range(again) == f"1{DASH}50 of 120"
        assert rows.findall(again) == rows.findall(first)


def test_a_long_list_reads_a_capped_total(store: OutboundWebhookHandler, client: FlaskClient) -> None:
    """More rows than the cap: the total reads "1,000+"; previous reaches back TRAIL_KEPT pages, and
    first always works."""
    pages_wanted = TRAIL_KEPT + 2
    dead_letters(store, PAGE_SIZE * pages_wanted)
    assert PAGE_SIZE * pages_wanted > COUNT_CAP
    page = text(client.get(f"{PREFIX}/webhooks/deliveries?state=dlq"))
    assert shown_range(page) == f"1{DASH}50 of {COUNT_CAP:,}+"
    seen = [delivery_ids(page)]
    for number in range(2, pages_wanted + 1):
        page = text(client.get(link(page, "next-page") or ""))
        start = (number - 1) * PAGE_SIZE + 1
        assert shown_range(page) == f"{start:,}{DASH}{start + PAGE_SIZE - 1:,} of {COUNT_CAP:,}+"
        seen.append(delivery_ids(page))
    assert link(page, "next-page") is None
    all_ids = [i for ids in seen for i in ids]
    assert len(all_ids) == len(set(all_ids)) == PAGE_SIZE * pages_wanted
    for number in range(pages_wanted - 1, pages_wanted - 1 - TRAIL_KEPT, -1):
        page = text(client.get(link(page, "previous-page") or ""))
        assert delivery_ids(page) == seen[number - 1], number
    # The trail kept TRAIL_KEPT pages: from here only First goes back.
    assert link(page, "previous-page") is None
    first = text(client.get(link(page, "first-page") or ""))
    assert delivery_ids(first) == seen[0]


@pytest.mark.parametrize(
    "position", ["page=0", "page=abc", "page=99999999", "page=%D9%A3", "trail=abc", "trail=%00", "page=%00"]
)
def test_a_bad_position_is_refused(store: OutboundWebhookHandler, client: FlaskClient, position: str) -> None:
    """A page number or trail no link holds is a 422 naming it, with or without a cursor."""
    dead_letters(store, PAGE_SIZE + 1)
    cursor = re.search(r"cursor=([^&\"]+)", text(client.get(f"{PREFIX}/webhooks/deliveries")))
    assert cursor
    for query in (position, f"cursor={cursor.group(1)}&{position}"):
        response = client.get(f"{PREFIX}/webhooks/deliveries?{query}")
        assert response.status_code == 422, query
        assert position.split("=")[0] in text(response)


@pytest.mark.parametrize("name", ["endpoint", "_external", "_scheme", "_anchor", "_method"])
def test_a_query_argument_named_like_url_fors_own_is_not_carried(
    store: OutboundWebhookHandler, client: FlaskClient, name: str
) -> None:
    """A filter the page does not know is dropped from its links, even one url_for would take as its
    own argument (``endpoint`` was a 500 on any list with a next page)."""
    dead_letters(store, PAGE_SIZE + 1)
    response = client.get(f"{PREFIX}/webhooks/deliveries?state=dlq&{name}=https")
    assert response.status_code == 200
    next_url = link(text(response), "next-page")
    assert next_url and next_url.startswith(f"{PREFIX}/") and "state=dlq" in next_url
    assert f"{name}=" not in next_url


@BUDGET
@given(
    fields=st.dictionaries(
        st.sampled_from(["cursor", "page", "trail", "state", "topic"]),
        st.one_of(TEXT, st.sampled_from(["1", "2", "~", "~~", "dlq", "0", "-1", "1e3", "٣"])),
        max_size=4,
    ),
    path=st.sampled_from(["/webhooks/deliveries", "/webhooks/subscriptions"]),
)
def test_any_position_is_a_page_or_a_4xx_and_changes_nothing(
    app: Flask, store: OutboundWebhookHandler, fields: dict[str, str], path: str
) -> None:
    """Hostile page numbers, trails and cursors never reach a 5xx and change nothing."""
    client = app.test_client()
    signed_in(client)
    before = snapshot(store)
    response = client.get(f"{PREFIX}{path}", query_string=encoded(fields))
    assert response.status_code in (200, 422), response.status_code
    assert snapshot(store) == before


def test_the_executions_and_triggers_lists_have_the_pager(database_url: str) -> None:
    """Every list has the pager: the workflow executions (with their filters kept) and triggers."""
    app = workflow_dashboard_app(database_url)
    client = app.test_client()
    signed_in(client, WORKFLOW_TOKEN)
    for n in range(PAGE_SIZE + 2):
        start(app, "echo", n)
    first = text(client.get(f"{PREFIX}/workflows?name=echo"))
    assert shown_range(first) == f"1{DASH}50 of 52"
    second = text(client.get(link(first, "next-page") or ""))
    assert shown_range(second) == f"51{DASH}52 of 52"
    assert "name=echo" in (link(second, "first-page") or "")
    assert shown_range(text(client.get(f"{PREFIX}/triggers"))) == "0 of 0"
