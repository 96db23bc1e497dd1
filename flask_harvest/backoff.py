"""Retry delays: exponential backoff with full jitter, and ``Retry-After`` parsing. Pure."""

from __future__ import annotations

import random
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime


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
