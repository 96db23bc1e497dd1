"""Step durations and the timeline of a run's steps and sleeps on the run page."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest.dashboard.timeline import duration_text, spans, timeline_svg
from flask_harvest.workflows.context import SLEEP_STEP
from flask_harvest.workflows.models import StepRecord

from .dashboard_client import PREFIX, signed_in, text
from .properties import BUDGET
from .test_dashboard_workflows import finished, start, workflow_dashboard_app
from .workflow_app import TOKEN, database_url_fixture, wait_asleep

__all__ = ["database_url_fixture"]

T0 = datetime(2026, 12, 3, 10, 0, tzinfo=timezone.utc)


def step(seq: int, name: str, seconds: float, output: object = None, error: str | None = None) -> StepRecord:
    return StepRecord("e", seq, name, output, error, T0 + timedelta(seconds=seconds))


def test_a_step_runs_from_the_checkpoint_before_it_and_a_sleep_to_its_wake_time() -> None:
    wake = (T0 + timedelta(seconds=100)).isoformat()
    shown = spans(T0, [step(1, "a", 2), step(2, SLEEP_STEP, 3, wake), step(3, "b", 101.5, error="no")])
    assert [(s.name, s.sleep, s.failed, s.seconds) for s in shown] == [
        ("a", False, False, 2.0),
        ("sleep", True, False, 97.0),
        ("b", False, True, 1.5),
    ]


def test_a_step_without_a_time_is_left_out() -> None:
    untimed = StepRecord("e", 1, "a", None, None, None)
    assert spans(T0, [untimed, step(2, "b", 5)])[0].seq == 2


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.0, "0 ms"),
        (0.25, "250 ms"),
        (1.5, "1.5 s"),
        (125, "2 min 5 s"),
        (7500, "2 h 5 min"),
        (90000, "1 d 1 h"),
    ],
)
def test_duration_text(seconds: float, shown: str) -> None:
    assert duration_text(seconds) == shown


@BUDGET
@given(
    names=st.lists(
        st.text(st.characters(exclude_categories=["Cs", "Cc"]), min_size=1, max_size=40), max_size=6
    ),
    gaps=st.lists(st.floats(0, 1e6), min_size=6, max_size=6),
)
def test_the_svg_is_well_formed_and_escapes_every_name(names: list[str], gaps: list[float]) -> None:
    """Any step names and times: one well-formed SVG whose texts are the names, escaped."""
    at, steps = 0.0, []
    for n, name in enumerate(names, start=1):
        at += gaps[n - 1]
        steps.append(step(n, name, at))
    shown = spans(T0, steps)
    svg = timeline_svg(shown, start=T0, end=T0 + timedelta(seconds=at + 1))
    root = ET.fromstring(svg)  # noqa: S314 (our own output)
    labels = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert labels == [f"#{s.seq} {s.name}"[:28] for s in shown]
    assert "<script" not in svg


@pytest.fixture
def app(database_url: str) -> Flask:
    return workflow_dashboard_app(database_url)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    signed = app.test_client()
    signed_in(signed, TOKEN)
    return signed


def test_the_run_page_shows_durations_and_the_timeline(app: Flask, client: FlaskClient) -> None:
    execution_id = start(app, "three_steps", None)
    finished(app, execution_id)
    page = text(client.get(f"{PREFIX}/workflows/{execution_id}"))
    assert 'id="run-timeline"' in page and "<svg" in page
    durations = re.findall(r'id="duration-(\d+)">\d+(?:\.\d)? (?:ms|s)<', page)
    assert len(durations) == 3
    for seq, n in zip(durations, (1, 2, 3), strict=True):
        assert f"#{seq} step_{n}</text>" in page


def test_a_sleep_is_on_the_timeline_until_its_wake_time(app: Flask, client: FlaskClient) -> None:
    execution_id = start(app, "sleeper", None)
    wait_asleep(app, execution_id)
    page = text(client.get(f"{PREFIX}/workflows/{execution_id}"))
    assert 'class="sleep"' in page
    # An hour's sleep: its span runs to the wake time, ahead of now.
    assert re.search(r'id="duration-\d+">(59 min \d+ s|1 h 0 min)<', page)
