"""Rate limits per endpoint: how many deliveries per second, with what burst. Pure.

A :class:`RateLimit` is a token bucket, computed as GCRA (the generic cell rate algorithm): the
bucket is one number, the *theoretical arrival time* (``tat``), the moment the bucket would be
full again if nothing else were sent. A request at ``now`` is admitted when admitting it keeps
``tat`` within ``burst`` intervals of ``now``; it then moves ``tat`` on by one interval
(``1 / per_second``). Over any window of ``w`` seconds at most ``burst + w * per_second``
requests are admitted, however they arrive.

A request that is not admitted changes nothing of the bucket, so deliveries held back take no
capacity from the ones admitted. It is told how long to wait, and waiting requests are given
turns one interval apart (``offer``, the latest turn handed out), so a backlog comes back spread
at the limit's pace instead of all at once at the next free token. A turn is a hint, not a
reservation: when it comes the request asks again.

Times are integer microseconds, so the Redis script that runs the same arithmetic
(:mod:`flask_harvest.outbound.limiters`) and this module agree to the microsecond (Lua numbers
are doubles: microseconds since the epoch stay exact until the year 2255).

No Flask, SQL, Redis or HTTP here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MAX_BURST", "MAX_PER_SECOND", "MIN_PER_SECOND", "Bucket", "RateLimit", "expires_in", "take"]

#: Microseconds in a second.
MICROS = 1_000_000
#: The highest rate a limit may have (deliveries per second).
MAX_PER_SECOND = 100_000.0
#: The lowest: one delivery per 1,000 seconds.
MIN_PER_SECOND = 0.001
#: The largest burst a limit may have.
MAX_BURST = 100_000


@dataclass(frozen=True)
class RateLimit:
    """At most ``per_second`` deliveries per second on average, and ``burst`` at once.

    :raises ValueError: ``per_second`` is not a finite number within ``[MIN_PER_SECOND,
        MAX_PER_SECOND]`` or ``burst`` not an integer within ``[1, MAX_BURST]``.
    """

    per_second: float
    burst: int

    def __post_init__(self) -> None:
        per_second = self.per_second
        if isinstance(per_second, bool) or not isinstance(per_second, (int, float)):
            raise ValueError("per_second must be a number")
        if not (math.isfinite(per_second) and MIN_PER_SECOND <= per_second <= MAX_PER_SECOND):
            raise ValueError(f"per_second must be a number from {MIN_PER_SECOND:g} to {MAX_PER_SECOND:g}")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int):
            raise ValueError("burst must be a whole number")
        if not 1 <= self.burst <= MAX_BURST:
            raise ValueError(f"burst must be a whole number from 1 to {MAX_BURST}")
        object.__setattr__(self, "per_second", float(per_second))

    @property
    def interval(self) -> int:
        """Microseconds between two admissions at the steady rate; rounded up, so the rate
        admitted never exceeds ``per_second``."""
        return max(1, math.ceil(MICROS / self.per_second))

    def to_dict(self) -> dict[str, float | int]:
        """The limit as JSON-ready data."""
        return {"per_second": self.per_second, "burst": self.burst}


@dataclass(frozen=True)
class Bucket:
    """One endpoint's bucket: ``tat`` (when it is full again) and ``offer`` (the latest turn
    handed to a waiting request), both in microseconds on the caller's clock."""

    tat: int
    offer: int


def take(bucket: Bucket | None, now: int, limit: RateLimit, horizon: int | None = None) -> tuple[Bucket, int]:
    """Ask to send one request at ``now`` (microseconds) under ``limit``.

    Returns the bucket after the request and how many microseconds the request must wait: ``0``
    when it is admitted (and counted), else until its turn (and nothing is counted).
    ``bucket`` is ``None`` for an endpoint not seen yet (or forgotten: an expired bucket is full).

    :param horizon: a turn further than this many microseconds away is not handed out: the wait
        is until the end of the line, and the line does not grow. A caller that waits only that
        long in place (and sends longer waits back to a queue) keeps the line to the requests
        that will really ask at their turns; otherwise every return of a queued request would
        add a turn, and the line would run ahead of the requests that keep it.
    """
    interval = limit.interval
    capacity = limit.burst * interval
    tat, offer = (now, now - interval) if bucket is None else (bucket.tat, bucket.offer)
    # A turn handed out an interval or more ago is spent: the queue of waiting requests is empty.
    offer = max(offer, now - interval)
    start = max(tat, now)
    if start + interval - now <= capacity:
        return Bucket(start + interval, offer), 0
    # The first moment a request would be admitted, if none came before it; waiting requests
    # get turns one interval apart from there.
    turn = max(offer + interval, start + interval - capacity)
    if horizon is not None and turn - now > horizon:
        return Bucket(tat, offer), turn - now
    return Bucket(tat, turn), turn - now


def expires_in(bucket: Bucket, now: int, limit: RateLimit) -> int:
    """Microseconds after which ``bucket`` says nothing any more (it is full and no turn is
    pending): it can be forgotten then, and ``take(None, ...)`` answers as it would."""
    return max(0, max(bucket.tat, bucket.offer + limit.interval) - now)
