"""A run's steps and sleeps on a time line: each one's duration, and an inline SVG of the spans.

Pure functions (no SQL, no request). A checkpoint records when a step *ended*, so a step's span runs from
the checkpoint before it (the wake time after a sleep, or the run's start for the first) to its
own: it includes the workflow's code between the two steps. A sleep's span runs from its
checkpoint to its wake time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import Any

from markupsafe import Markup

from ..workflows.context import SLEEP_STEP
from ..workflows.models import Execution, StepRecord
from .when import absolute, as_time

__all__ = ["Span", "duration_text", "run_timeline", "spans", "timeline_svg"]


@dataclass(frozen=True)
class Span:
    """One step or sleep of a run, from ``start`` to ``end``."""

    seq: int
    name: str
    sleep: bool
    failed: bool
    start: datetime
    end: datetime

    @property
    def seconds(self) -> float:
        return max((self.end - self.start).total_seconds(), 0.0)


def spans(started: datetime | None, steps: Sequence[StepRecord]) -> list[Span]:
    """The spans of ``steps`` (in order), for a run that started at ``started``; a step without a
    checkpoint time (none has one in a store that does not keep it) is left out."""
    result: list[Span] = []
    previous = started
    for step in steps:
        at = step.created_at
        if at is None:
            continue
        if step.name == SLEEP_STEP:
            wake = as_time(step.output) or at
            result.append(Span(step.seq, "sleep", True, False, at, wake))
            previous = max(wake, at)
            continue
        begin = previous if previous is not None and previous <= at else at
        result.append(Span(step.seq, step.name, False, step.failed, begin, at))
        previous = at
    return result


def duration_text(seconds: float) -> str:
    """``850 ms``, ``12.3 s``, ``4 min 5 s``, ``2 h 7 min`` or ``3 d 4 h``."""
    if seconds < 1:
        return f"{int(seconds * 1000)} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def timeline_svg(shown: Sequence[Span], *, start: datetime, end: datetime, width: int = 720) -> str:
    """An ``<svg>`` with one row per span, placed and sized on the run's time from ``start`` to
    ``end``; each bar has its name, duration and times as its title. Every text is escaped here:
    the result is safe to insert into a page as markup."""
    row, left, label_w = 18, 4, 180
    plot = width - label_w - left - 4
    total = max((end - start).total_seconds(), 1e-3)
    height = row * max(len(shown), 1) + 4
    title = "Timeline of the run's steps and sleeps"
    parts = [
        f'<svg class="chart timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
    ]
    for n, span in enumerate(shown):
        y = 2 + n * row
        x = label_w + plot * max((span.start - start).total_seconds(), 0.0) / total
        w = max(plot * span.seconds / total, 1.5)
        kind = "sleep" if span.sleep else ("failed" if span.failed else "delivered")
        name = f"#{span.seq} {span.name}"
        tip = f"{name}: {duration_text(span.seconds)}, {absolute(span.start)} to {absolute(span.end)}"
        parts.append(f'<text x="{left}" y="{y + 12}">{escape(name[:28])}</text>')
        parts.append(
            f'<rect class="{kind}" x="{x:.1f}" y="{y + 2}" width="{min(w, width - x):.1f}" '
            f'height="{row - 6}"><title>{escape(tip)}</title></rect>'
        )
    parts.append("</svg>")
    return "".join(parts)


def run_timeline(execution: Execution, steps: Sequence[StepRecord], now: datetime) -> dict[str, Any]:
    """What the run page shows: ``durations`` (text by step ``seq``) and ``timeline`` (the SVG,
    or ``None`` without a timed step), over the run from its start to its end (or ``now``)."""
    start = execution.started_at or execution.created_at
    shown = spans(start, steps)
    if not shown:
        return {"durations": {}, "timeline": None}
    begin = min(start, *(s.start for s in shown))
    end = max(execution.completed_at or now, *(s.end for s in shown))
    # The renderer escapes every text it writes.
    svg = Markup(timeline_svg(shown, start=begin, end=end))  # noqa: S704
    return {"durations": {s.seq: duration_text(s.seconds) for s in shown}, "timeline": svg}
