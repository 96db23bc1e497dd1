"""A small pure renderer of the overview's chart: stacked bars as inline SVG, no script, no
styles of its own (the stylesheet colours the ``delivered`` and ``failed`` classes)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from html import escape

#: Labels on the time axis every this many bars (minutes).
LABEL_EVERY = 10


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5 times a power of ten that is at least ``value`` (at least 1)."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if factor * step >= value:
                return factor * step
        step *= 10


def stacked_bars(
    buckets: Sequence[tuple[datetime, int, int]],
    *,
    width: int = 720,
    height: int = 180,
    title: str = "Attempts per minute",
) -> str:
    """Return an ``<svg>`` element: per bucket, the succeeded count (bottom) and the failed count
    stacked on it; a labelled y maximum and time labels every :data:`LABEL_EVERY` buckets.

    Every text is escaped here: the result is safe to insert into a page as markup.
    """
    left, bottom, top = 40, 20, 10
    plot_w, plot_h = width - left - 5, height - bottom - top
    peak = _nice_ceiling(max((ok + failed for _, ok, failed in buckets), default=0))
    slot = plot_w / max(len(buckets), 1)
    bar = max(slot - 1, 1)
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<line class="axis" x1="{left}" y1="{top + plot_h}" x2="{width - 5}" y2="{top + plot_h}"/>',
        f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}"/>',
        f'<text x="{left - 4}" y="{top + 8}" text-anchor="end">{peak}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end">0</text>',
    ]
    for n, (when, ok, failed) in enumerate(buckets):
        x = left + n * slot
        ok_h = plot_h * ok / peak
        failed_h = plot_h * failed / peak
        label = f"{when:%H:%M} UTC: {ok} delivered, {failed} failed"
        if ok:
            parts.append(
                f'<rect class="delivered" x="{x:.1f}" y="{top + plot_h - ok_h:.1f}" width="{bar:.1f}" '
                f'height="{ok_h:.1f}"><title>{escape(label)}</title></rect>'
            )
        if failed:
            parts.append(
                f'<rect class="failed" x="{x:.1f}" y="{top + plot_h - ok_h - failed_h:.1f}" '
                f'width="{bar:.1f}" height="{failed_h:.1f}"><title>{escape(label)}</title></rect>'
            )
        if n % LABEL_EVERY == 0:
            parts.append(f'<text x="{x:.1f}" y="{height - 5}">{when:%H:%M}</text>')
    parts.append("</svg>")
    return "".join(parts)
