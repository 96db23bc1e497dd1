"""Cron schedules of workflows and which ticks a sweep starts. Pure: no Flask, SQL or clock.

A schedule is cron text read by croniter, in UTC: five fields (minute hour day month weekday), six
with a leading seconds field (``*/10 * * * * *``: every ten seconds), or a macro such as
``@hourly``. :func:`plan_ticks` decides what one sweep does with the ticks that fell since the
last tick handled: the recent ones start, and of the older (missed) ones only the most recent
``catchup`` do.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from croniter import croniter
from croniter.croniter import CroniterError

from ..errors import InvalidFieldError

__all__ = ["CronSchedule", "TickPlan", "plan_ticks", "tick_iso"]

#: Cron text is stored in a column of this width.
MAX_CRON_LENGTH = 255
#: The macros croniter understands, besides the five- and six-field forms.
MACROS = frozenset(("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"))
#: Missed ticks counted at most for the log line of one sweep (a per-second schedule after a month
#: of downtime has millions; counting them all would stall the sweep).
MAX_COUNTED = 1000
_JUST_AFTER = timedelta(microseconds=1)


def tick_iso(tick: datetime) -> str:
    """The ISO 8601 text of a tick, as a run's input and ``workflow_id`` carry it."""
    return tick.isoformat()


@dataclass(frozen=True)
class CronSchedule:
    """A parsed cron schedule; build one with :meth:`parse`."""

    text: str

    @classmethod
    def parse(cls, text: object) -> CronSchedule:
        """Return the schedule ``text`` describes.

        :raises InvalidFieldError: not five or six fields (or a macro) croniter accepts, or a
            schedule that never fires (the 30th of February).
        """
        if not isinstance(text, str) or not text.strip() or len(text) > MAX_CRON_LENGTH:
            raise InvalidFieldError(
                "schedule", f"must be cron text of at most {MAX_CRON_LENGTH} characters, not {text!r}"
            )
        fields = text.split()
        if not (len(fields) in (5, 6) or (len(fields) == 1 and fields[0].lower() in MACROS)):
            raise InvalidFieldError(
                "schedule",
                f"{text!r} is not cron text: give five fields (minute hour day month weekday), six "
                "with a leading seconds field, or a macro such as @hourly",
            )
        schedule = cls(" ".join(fields))
        try:
            schedule._iterator(datetime(2000, 1, 1, tzinfo=timezone.utc)).get_next(datetime)
        except (CroniterError, ValueError, KeyError, TypeError) as exc:
            raise InvalidFieldError("schedule", f"{text!r} is not valid cron text ({exc})") from None
        return schedule

    def _iterator(self, start: datetime) -> croniter:
        # Seconds first, as in DBOS and Quartz: "*/5 * * * * *" is every five seconds.
        return croniter(self.text, start, second_at_beginning=True)

    def next_after(self, when: datetime) -> datetime:
        """The first tick strictly after ``when``."""
        tick: datetime = self._iterator(when).get_next(datetime)
        return tick

    def last_at_or_before(self, when: datetime) -> datetime | None:
        """The latest tick at or before ``when`` (``None`` if croniter finds none)."""
        try:
            tick: datetime = self._iterator(when + _JUST_AFTER).get_prev(datetime)
        except CroniterError:
            return None
        return tick.replace(fold=0)

    def ticks_between(self, after: datetime, until: datetime, *, limit: int) -> list[datetime]:
        """The ticks in ``(after, until]``, oldest first, at most ``limit`` of them."""
        ticks: list[datetime] = []
        iterator = self._iterator(after)
        while len(ticks) < limit:
            tick: datetime = iterator.get_next(datetime)
            if tick > until:
                break
            ticks.append(tick)
        return ticks

    def latest_between(self, after: datetime, until: datetime, *, limit: int) -> list[datetime]:
        """The latest ticks in ``(after, until]``, newest first, at most ``limit`` of them."""
        ticks: list[datetime] = []
        iterator = self._iterator(until + _JUST_AFTER)
        while len(ticks) < limit:
            tick: datetime = iterator.get_prev(datetime)
            if tick <= after:
                break
            ticks.append(tick.replace(fold=0))  # croniter marks ticks it walked back to
        return ticks


@dataclass(frozen=True)
class TickPlan:
    """What one sweep does with a schedule's due ticks.

    :param start: the ticks to start a run for, oldest first.
    :param last: the new "last tick handled": the latest due tick (``None``: no tick is due).
    :param skipped: missed ticks left without a run (counted up to :data:`MAX_COUNTED`).
    :param skipped_until: the latest skipped tick (``None`` when none was skipped).
    """

    start: tuple[datetime, ...] = ()
    last: datetime | None = None
    skipped: int = 0
    skipped_until: datetime | None = None


def plan_ticks(
    schedule: CronSchedule, last_tick: datetime, now: datetime, *, catchup: int, grace: timedelta
) -> TickPlan:
    """Decide which due ticks (those in ``(last_tick, now]``) one sweep starts.

    A tick at most ``grace`` old is on time: it starts. An older tick was missed (no worker swept
    while it was due): of those, only the ``catchup`` most recent start, and the rest are skipped.

    :param grace: how late a sweep may see a tick in normal operation (a few sweep intervals).
    """
    if schedule.next_after(last_tick) > now:
        return TickPlan()
    boundary = now - grace
    on_time_from = max(last_tick, boundary)
    # Bounded by grace: a sweep sees a handful of on-time ticks, whatever the schedule.
    on_time = schedule.ticks_between(on_time_from, now, limit=MAX_COUNTED)
    missed: list[datetime] = []
    if boundary > last_tick:
        missed = schedule.latest_between(last_tick, boundary, limit=catchup + MAX_COUNTED)
    caught_up = sorted(missed[:catchup])
    skipped = missed[catchup:]
    last = on_time[-1] if on_time else missed[0]
    return TickPlan(
        start=(*caught_up, *on_time),
        last=last,
        skipped=len(skipped),
        skipped_until=skipped[0] if skipped else None,
    )
