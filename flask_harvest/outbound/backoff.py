"""Retry delays: exponential backoff with full jitter, ``Retry-After`` parsing, and the one
:class:`RetryPolicy` type of outbound deliveries. Pure."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

#: The 4xx statuses worth retrying under a policy whose other 4xx are permanent.
TRANSIENT_4XX = frozenset({408, 421, 425, 429})


def backoff_ceiling_ms(attempt: int, initial_ms: int, max_ms: int) -> int:
    """Return the largest delay before retry number ``attempt`` (1 after the first failure).

    The ceiling doubles each attempt from ``initial_ms`` and never exceeds ``max_ms``.
    """
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    # Cap the exponent: 2**64 ms is already far past any sensible max_ms.
    return min(max_ms, initial_ms * (1 << min(attempt - 1, 64)))


def full_jitter_ms(attempt: int, initial_ms: int, max_ms: int, rng: random.Random | None = None) -> int:
    """Return a delay uniform in ``[0, backoff_ceiling_ms(attempt, ...)]`` (AWS "full jitter").

    Spreading retries over the whole window stops deliveries that failed together from retrying
    together.
    """
    ceiling = backoff_ceiling_ms(attempt, initial_ms, max_ms)
    # Not for cryptography: jitter only spreads load.
    return (rng or random).randint(0, ceiling)


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Return the seconds a ``Retry-After`` header asks to wait, or ``None`` if it is absent or bad.

    Accepts delta-seconds (``120``) and an HTTP-date (``Wed, 21 Oct 2026 07:28:00 GMT``); a date in
    the past means zero.
    """
    if value is None:
        return None
    value = value.strip()
    # isdigit() alone also accepts non-ASCII digits such as '²', which int() rejects; float() of the
    # text turns an absurdly long number into inf instead of raising OverflowError.
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - now).total_seconds())


def retry_delay_ms(
    attempt: int,
    initial_ms: int,
    max_ms: int,
    retry_after_seconds: float | None = None,
    rng: random.Random | None = None,
) -> int:
    """Return the delay before retry ``attempt``: full jitter, floored by ``Retry-After``.

    A ``Retry-After`` hint raises the delay to at least what it asks, but never past ``max_ms``; a
    hint shorter than the jittered delay changes nothing.
    """
    delay = full_jitter_ms(attempt, initial_ms, max_ms, rng)
    if retry_after_seconds is not None:
        delay = max(delay, int(min(max_ms, retry_after_seconds * 1000)))
    return delay


@dataclass(frozen=True)
class RetryPolicy:
    """How an outbound delivery is retried: data, one type for webhooks and completion callbacks.

    :param max_attempts: attempts in all; the last failure dead-letters the delivery.
    :param initial_backoff_ms: the first retry's delay (its ceiling, with ``jitter``)...
    :param max_backoff_ms: ...doubling each attempt up to this.
    :param jitter: spread each delay uniformly over ``[0, ceiling]`` (full jitter), so that
        deliveries that failed together do not retry together.
    :param retry_after_cap_ms: the most a ``Retry-After`` hint may hold a delivery back;
        ``None``: ``max_backoff_ms``. A hint shorter than the delay changes nothing.
    :param permanent_4xx: a 4xx other than :data:`TRANSIENT_4XX` (and 413 with ``Retry-After``)
        dead-letters at once, since retrying cannot fix it.
    """

    max_attempts: int
    initial_backoff_ms: int
    max_backoff_ms: int
    jitter: bool = False
    retry_after_cap_ms: int | None = None
    permanent_4xx: bool = False

    def delay_ms(
        self, attempt: int, retry_after_seconds: float | None = None, rng: random.Random | None = None
    ) -> int:
        """The wait after failed attempt ``attempt`` (1-based), floored by a capped ``Retry-After``."""
        if self.jitter:
            delay = full_jitter_ms(attempt, self.initial_backoff_ms, self.max_backoff_ms, rng)
        else:
            delay = backoff_ceiling_ms(attempt, self.initial_backoff_ms, self.max_backoff_ms)
        if retry_after_seconds is not None:
            cap = self.max_backoff_ms if self.retry_after_cap_ms is None else self.retry_after_cap_ms
            delay = max(delay, int(min(cap, retry_after_seconds * 1000)))
        return delay

    def is_permanent(self, status: int, retry_after: str | None) -> bool:
        """Whether a non-2xx ``status`` (with its ``Retry-After``, if any) ends the delivery at once."""
        if not self.permanent_4xx or not 400 <= status < 500 or status in TRANSIENT_4XX:
            return False
        return not (status == 413 and retry_after is not None)
