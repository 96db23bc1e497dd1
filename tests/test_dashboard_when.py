"""Times on the dashboard: relative text, the absolute UTC time on hover, one format everywhere."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import DeliveryState, OutboundWebhookHandler
from flask_harvest.dashboard.when import absolute, as_time, relative, when_html

from .dashboard_client import PREFIX, dashboard_app, signed_in, text
from .properties import BUDGET
from .test_actuator import dead_letters

NOW = datetime(2026, 12, 3, 10, 0, 0, tzinfo=timezone.utc)
#: A <time> element as every page writes one.
TIME = re.compile(r'<time datetime="([^"]+)" title="(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC)">([^<]+)</time>')


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "now"),
        (0.5, "now"),
        (1, "1 s ago"),
        (59.9, "59 s ago"),
        (60, "1 min ago"),
        (119, "1 min ago"),
        (180, "3 min ago"),
        (3599, "59 min ago"),
        (3600, "1 h ago"),
        (47 * 3600, "47 h ago"),
        (48 * 3600, "2 d ago"),
        (400 * 86400, "400 d ago"),
        (-90, "in 1 min"),
        (-7200, "in 2 h"),
    ],
)
def test_relative_text(seconds: float, shown: str) -> None:
    assert relative(NOW - timedelta(seconds=seconds), NOW) == shown


def test_the_element_carries_the_iso_and_absolute_utc_times() -> None:
    html = str(when_html(datetime(2026, 12, 3, 11, 57, tzinfo=timezone(timedelta(hours=2))), NOW))
    assert html == (
        '<time datetime="2026-12-03T09:57:00+00:00" title="2026-12-03 09:57:00 UTC">3 min ago</time>'
    )


@pytest.mark.parametrize("value", ["2026-12-03T09:57:00Z", "2026-12-03T09:57:00+00:00", "2026-12-03T09:57"])
def test_iso_text_and_naive_times_are_utc(value: str) -> None:
    assert as_time(value) == datetime(2026, 12, 3, 9, 57, tzinfo=timezone.utc)
    assert as_time(datetime(2026, 12, 3, 9, 57)) == datetime(2026, 12, 3, 9, 57, tzinfo=timezone.utc)


@pytest.mark.parametrize("value", [None, "", "not a time", 12, "<script>"])
def test_no_time_is_a_dash(value: object) -> None:
    assert str(when_html(value, NOW)) == '<span class="muted">\u2013</span>'


@BUDGET
@given(
    when=st.datetimes(timezones=st.just(timezone.utc)),
    now=st.datetimes(min_value=datetime(1970, 1, 1), timezones=st.just(timezone.utc)),
)
def test_any_time_renders_one_element(when: datetime, now: datetime) -> None:
    """Any time, however far from now, is one well-formed element whose title is the time."""
    found = TIME.fullmatch(str(when_html(when, now)))
    assert found is not None
    assert as_time(found.group(1)) == when
    assert found.group(2) == absolute(when)
    assert found.group(3) == relative(when, now)


@pytest.fixture
def app(store: OutboundWebhookHandler) -> Flask:
    return dashboard_app(store)


def test_pages_show_times_relative_with_the_absolute_time_on_hover(
    app: Flask, store: OutboundWebhookHandler
) -> None:
    """The deliveries list and a delivery's page show each time as a <time> element with the
    absolute UTC time as its title; no page shows a bare ISO time."""
    dead_letters(store, 1)
    [dlq] = store.list_deliveries(state=DeliveryState.DLQ, limit=10)
    client: FlaskClient = app.test_client()
    signed_in(client)
    for path in (f"{PREFIX}/webhooks/deliveries", f"{PREFIX}/webhooks/deliveries/{dlq.id}"):
        body = text(client.get(path))
        shown = TIME.findall(body)
        assert shown, path
        for iso, title, relative_text in shown:
            when = as_time(iso)
            assert when is not None and title == absolute(when)
            assert relative_text == "now" or re.fullmatch(r"(in )?\d+ (s|min|h|d)( ago)?", relative_text)
        # Every time is inside a <time> element: none is written out bare.
        outside = re.sub(r"<time[^>]*>[^<]*</time>", "", body)
        assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", outside), path
