"""The overview chart's pure renderer."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from flask_harvest.dashboard.chart import _nice_ceiling, stacked_bars

SVG = "{http://www.w3.org/2000/svg}"
T0 = datetime(2026, 12, 3, 10, 0, tzinfo=timezone.utc)


def test_bars_are_stacked_and_scaled() -> None:
    buckets = [(T0, 0, 0), (T0 + timedelta(minutes=1), 3, 1), (T0 + timedelta(minutes=2), 0, 5)]
    root = ET.fromstring(  # noqa: S314 (our own output)
        stacked_bars(buckets, width=140, height=120)
    )
    rects = root.findall(f"{SVG}rect")
    assert [r.get("class") for r in rects] == ["delivered", "failed", "failed"]
    delivered, failed, alone = (float(r.get("height", "0")) for r in rects)
    assert delivered == 3 * failed  # one scale for both
    assert alone == 5 * failed  # 5 is the top of the axis
    assert "5" in [t.text for t in root.findall(f"{SVG}text")]


def test_an_empty_hour_draws_axes_only() -> None:
    root = ET.fromstring(  # noqa: S314 (our own output)
        stacked_bars([(T0 + timedelta(minutes=n), 0, 0) for n in range(60)])
    )
    assert root.findall(f"{SVG}rect") == []
    labels = [t.text for t in root.findall(f"{SVG}text")]
    assert "10:00" in labels and "10:50" in labels


def test_the_title_is_escaped() -> None:
    svg = stacked_bars([], title="<script>alert(1)</script>")
    assert "<script>" not in svg and "&lt;script&gt;" in svg


@given(st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 10**9)), max_size=120))
def test_any_counts_give_well_formed_svg_inside_the_box(counts: list[tuple[int, int]]) -> None:
    buckets = [(T0 + timedelta(minutes=n), ok, failed) for n, (ok, failed) in enumerate(counts)]
    root = ET.fromstring(  # noqa: S314 (our own output)
        stacked_bars(buckets, width=300, height=100)
    )
    for rect in root.findall(f"{SVG}rect"):
        assert float(rect.get("y", "-1")) >= 9.9
        assert float(rect.get("height", "-1")) >= 0


@given(st.integers(0, 10**12))
def test_nice_ceiling(value: int) -> None:
    top = _nice_ceiling(value)
    assert top >= max(value, 1) and top < 5 * max(value, 1) + 1
    assert str(top).strip("0") in ("1", "2", "5")
