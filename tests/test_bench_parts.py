"""The benchmark harness's own pieces, without services: a missing chart package costs the chart,
never the figures; absolute rates carry their share of the same run's ceiling; S14's endpoints."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from bench._report import NO_CHART, Row, format_table, optional_chart
from bench.compare import compare
from bench.s14_realistic_mix import FAN_OUT, TOPICS, answering, endpoints


def test_a_missing_matplotlib_skips_the_chart_with_a_note(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` does when absent
    drawn: list[Path] = []

    assert optional_chart(drawn.append, tmp_path / "chart.png") == NO_CHART
    assert drawn == []
    assert "pip install" in NO_CHART


def test_the_chart_is_drawn_exactly_when_matplotlib_is_installed(tmp_path: Path) -> None:
    # `make test` installs the bench extra (matplotlib); `make lowest` does not: each run checks
    # the branch its environment takes, the second without faking an absent module.
    drawn: list[Path] = []
    result = optional_chart(drawn.append, tmp_path / "chart.png")

    if importlib.util.find_spec("matplotlib") is None:
        assert (result, drawn) == (NO_CHART, [])
    else:
        assert (result, drawn) == (str(tmp_path / "chart.png"), [tmp_path / "chart.png"])


def test_an_absolute_rate_shows_its_share_of_the_session_loop() -> None:
    row = Row("S3", "deliveries/s", 300.0, "/s", ">= 500/s", False, ceiling=1500.0, note="mean 20")

    assert row.of_ceiling == pytest.approx(0.2)
    assert row.as_dict()["of_ceiling"] == pytest.approx(0.2)
    assert "| 0.20x the Session loop (1,500 /s); mean 20 |" in format_table([row])


def test_a_row_without_a_ceiling_keeps_its_note() -> None:
    row = Row("S5", "p50", 12.0, "ms", "<= 25 ms", True, note="n 1000")

    assert row.of_ceiling is None
    assert row.full_note() == "n 1000"
    assert Row("S3", "x", None, "/s", "", None, ceiling=1000.0).full_note() == ""


def test_s14_endpoints_have_the_issue_s_long_tail_and_are_the_same_every_run() -> None:
    points = endpoints()

    assert points == endpoints()
    assert len(points) == 1000
    assert sum(p.dead for p in points) == 10
    slow = [p.slow_ms for p in points if p.slow_ms is not None]
    assert len(slow) == 50 and all(1000 <= ms <= 2000 for ms in slow)
    assert all(20 <= p.fast_ms <= 100 for p in points)
    assert sum(p.healthy for p in points) == 940
    assert len(TOPICS) * FAN_OUT == 1000
    # Every event reaches FAN_OUT endpoints; in the mix, none of the silent ones answers.
    assert answering(points, 200, mixed=False) == 200 * FAN_OUT
    assert answering(points, len(TOPICS), mixed=True) == 1000 - 10
    mixed_paths = {p.path("t", mixed=True).split("/")[1] for p in points}
    assert mixed_paths == {"slow", "never"}
    assert {p.path("t", mixed=False).split("/")[1] for p in points} == {"slow"}


def _run(*rows: Row) -> dict[str, object]:
    return {"rows": [row.as_dict() for row in rows]}


def test_compare_calls_a_goal_met_only_when_every_run_meets_it() -> None:
    fast = Row("S12", "deliveries/s", 1250.0, "/s", ">= 1,000/s", True, ceiling=2000.0)
    # Matched by position in its scenario: a figure's text may carry the run's own counts.
    slow = Row("S12", "deliveries/s (19,998)", 900.0, "/s", ">= 1,000/s", False, ceiling=2000.0)
    report = Row("S14", "cpu per delivery", 1.1, "ms", "report", None)
    only_first = Row("S3", "rss growth", 3.0, "%", "<= 10%", True)

    table = compare([_run(fast, report, only_first), _run(slow, report)], ["run 1", "run 2"])
    lines = table.splitlines()

    assert lines[0] == "| id | figure | goal | run 1 | run 2 | met? |"
    assert lines[2] == (
        "| S12 | deliveries/s | >= 1,000/s | 1,250 /s, 0.62 of the Session loop | "
        "900 /s, 0.45 of the Session loop **no** | **no** |"
    )
    assert lines[3].endswith("| 1.10 ms | 1.10 ms | - |")
    assert lines[4] == "| S3 | rss growth | <= 10% | 3.00 % | (not run) | not in every run |"
    assert compare([_run(fast), _run(fast)], ["a", "b"]).splitlines()[2].endswith("| yes, in every run |")
