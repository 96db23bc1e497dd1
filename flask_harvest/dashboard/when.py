"""Times as the dashboard shows them: relative ("3 min ago"), with the absolute UTC time on hover.

Computed on the server (the pages run no script), in one format everywhere: every page renders
a time through :func:`when_html`, the ``harvest_when`` template filter, or :func:`relative` and
:func:`absolute` (the deliveries list builds its rows in Python). Pure but for :func:`page_now`.
"""

from __future__ import annotations

from datetime import datetime, timezone

from flask import g
from markupsafe import Markup, escape

from .._time import utcnow
from ._core import dashboard

__all__ = ["absolute", "as_time", "page_now", "relative", "when_html"]

#: (limit in seconds, unit in seconds, unit's text): the largest unit under which ``|delta|`` falls.
_UNITS = (
    (60, 1, "s"),
    (3600, 60, "min"),
    (48 * 3600, 3600, "h"),
)


def as_time(value: object) -> datetime | None:
    """``value`` as an aware UTC datetime: a datetime (naive is UTC) or ISO 8601 text (``Z``
    allowed); ``None`` for anything else (an empty cell, never an error page)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def relative(when: datetime, now: datetime) -> str:
    """``when`` relative to ``now``: ``now`` under a second apart, else ``N s ago``, ``N min ago``,
    ``N h ago`` (under 48 hours) or ``N d ago``, and ``in N …`` for a time ahead (a next attempt).
    Whole units, rounded down: "1 min ago" from 60 up to 119 seconds."""
    seconds = (now - when).total_seconds()
    size = abs(seconds)
    if size < 1:
        return "now"
    amount, unit = int(size // 86400), "d"
    for limit, step, name in _UNITS:
        if size < limit:
            amount, unit = int(size // step), name
            break
    return f"{amount} {unit} ago" if seconds > 0 else f"in {amount} {unit}"


def absolute(when: datetime) -> str:
    """``when`` as the hover text shows it: ``2026-12-03 10:00:00 UTC``."""
    # isoformat, not strftime: strftime's %Y does not pad a year before 1000 on every platform.
    return when.astimezone(timezone.utc).replace(tzinfo=None).isoformat(" ", "seconds") + " UTC"


def page_now() -> datetime:
    """The instant the current request's page measures its times from (one per request, so two
    equal times on a page read the same)."""
    now: datetime | None = g.get("harvest_dashboard_now")
    if now is None:
        now = g.harvest_dashboard_now = utcnow()
    return now


def when_html(value: object, now: datetime | None = None) -> Markup:
    """A ``<time>`` element: the relative text, ``datetime`` the ISO time, ``title`` the absolute
    UTC time; a dash for no time."""
    when = as_time(value)
    if when is None:
        return Markup('<span class="muted">\u2013</span>')
    text = relative(when, page_now() if now is None else now)
    return Markup('<time datetime="{}" title="{}">{}</time>').format(
        when.isoformat(), absolute(when), escape(text)
    )


dashboard.add_app_template_filter(when_html, "harvest_when")
