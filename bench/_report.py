"""What a scenario returns, the figures it computes, and the table the run prints."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from flask import Flask


@dataclass
class Row:
    """One line of the results table: a figure beside its baseline, and whether its goal is met."""

    scenario: str
    figure: str
    value: float | None
    unit: str
    goal: str
    met: bool | None
    baseline: float | None = None
    baseline_label: str = ""
    ratio: float | None = None
    note: str = ""
    #: The same run's HTTP ceiling (a plain ``requests.Session`` loop, per second), for a goal
    #: stated as an absolute rate: machines of one class differ by 2x from day to day, so the
    #: table also shows the figure as a share of it.
    ceiling: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "of_ceiling": self.of_ceiling}

    @property
    def of_ceiling(self) -> float | None:
        """The figure as a share of the same run's Session loop (None without one)."""
        if self.ceiling is None or self.value is None or not self.ceiling > 0:
            return None
        return self.value / self.ceiling

    def full_note(self) -> str:
        """The note, with the share of the ceiling in front when there is one."""
        share = self.of_ceiling
        if share is None or math.isnan(share):
            return self.note
        text = f"{share:.2f}x the Session loop ({fmt(self.ceiling, '/s')})"
        return f"{text}; {self.note}" if self.note else text


@dataclass
class Result:
    rows: list[Row] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    """What every scenario gets: the mode, a folder for worker logs, the database engine."""

    quick: bool
    log_dir: Path
    engine: sa.Engine
    chart_dir: Path
    apps: list[Flask] = field(default_factory=list)

    def pick(self, full: Any, quick: Any) -> Any:
        return quick if self.quick else full

    def app(self, config: dict[str, Any] | None = None) -> Flask:
        """An in-process app (the 'web process') on the benchmark's services."""
        from ._app import create_app

        app = create_app(config)
        self.apps.append(app)
        return app

    def close_apps(self) -> None:
        from flask_harvest import get_engine

        from ._app import db

        for app in self.apps:
            with app.app_context():
                get_engine(app).close()
                db.engine.dispose()
        self.apps.clear()


#: What a scenario reports instead of its chart when matplotlib (the bench extra) is missing.
NO_CHART = "chart not drawn: matplotlib is not installed (pip install -e '.[bench]')"


def optional_chart(draw: Callable[[Path], None], path: Path) -> str:
    """Draw a chart with ``draw(path)`` if matplotlib can be imported; the figures never depend on
    it. Return the chart's path, or :data:`NO_CHART` (for the scenario's details and notes)."""
    try:
        import matplotlib  # optional: the bench extra installs it
    except ImportError:
        return NO_CHART
    matplotlib.use("Agg")  # no display: draw to the file only
    draw(path)
    return str(path)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def rate(times: Sequence[float]) -> float:
    """Events per second between the first and the last of ``times``."""
    if len(times) < 2:
        return math.nan
    span = max(times) - min(times)
    return (len(times) - 1) / span if span > 0 else math.nan


def fmt(value: float | None, unit: str = "") -> str:
    """A figure as the tables print it: thousands separated, three significant digits below 10."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 100:
        text = f"{value:,.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    return f"{text} {unit}".strip()


def format_table(rows: Sequence[Row]) -> str:
    """A Markdown table: scenario, figure, baseline, ratio, goal, met?, note."""
    header = ["id", "figure", "value", "baseline", "ratio", "goal", "met?", "note"]
    lines = [header]
    for row in rows:
        baseline = fmt(row.baseline, row.unit)
        if row.baseline_label and row.baseline is not None:
            baseline = f"{baseline} ({row.baseline_label})"
        met = "-" if row.met is None else ("yes" if row.met else "**no**")
        lines.append(
            [
                row.scenario,
                row.figure,
                fmt(row.value, row.unit),
                baseline,
                "-" if row.ratio is None else f"{row.ratio:.2f}",
                row.goal,
                met,
                row.full_note(),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for number, line in enumerate(lines):
        out.append("| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)) + " |")
        if number == 0:
            out.append("| " + " | ".join("-" * widths[i] for i in range(len(header))) + " |")
    return "\n".join(out)
