"""Backoff ceilings, full jitter, the Retry-After floor and Retry-After parsing."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from flask_harvest.callbacks import callback_retry_policy
from flask_harvest.config import Settings
from flask_harvest.outbound.attempt import DeliveryState, HttpResponse, Verdict, judge
from flask_harvest.outbound.backoff import (
    RetryPolicy,
    backoff_ceiling_ms,
    full_jitter_ms,
    parse_retry_after,
    retry_delay_ms,
)

INITIAL_MS = 1000  # the seed's default base
MAX_MS = 3_600_000  # the seed's default cap: 1 h
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)  # a Thursday

attempts = st.integers(min_value=1, max_value=200)
initials = st.integers(min_value=1, max_value=60_000)
caps = st.integers(min_value=1, max_value=24 * 3_600_000)
seeds = st.integers(min_value=0, max_value=2**32)


# -- ceilings ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "ceiling"), [(1, 1000), (2, 2000), (3, 4000), (4, 8000), (5, 16_000), (12, 2_048_000)]
)
def test_ceiling_doubles_from_the_base(attempt: int, ceiling: int) -> None:
    assert backoff_ceiling_ms(attempt, INITIAL_MS, MAX_MS) == ceiling


@pytest.mark.parametrize("attempt", [13, 14, 64, 65, 1000, 10**6])
def test_ceiling_is_capped_at_one_hour(attempt: int) -> None:
    assert backoff_ceiling_ms(attempt, INITIAL_MS, MAX_MS) == MAX_MS


def test_ceiling_cap_below_the_base() -> None:
    assert backoff_ceiling_ms(1, 5000, 3000) == 3000


@pytest.mark.parametrize("attempt", [0, -1, -100])
def test_attempt_counts_from_one(attempt: int) -> None:
    with pytest.raises(ValueError, match="from 1"):
        backoff_ceiling_ms(attempt, INITIAL_MS, MAX_MS)
    with pytest.raises(ValueError, match="from 1"):
        full_jitter_ms(attempt, INITIAL_MS, MAX_MS)


@given(attempt=attempts, initial=initials, cap=caps)
def test_ceiling_is_monotonic_and_bounded(attempt: int, initial: int, cap: int) -> None:
    ceiling = backoff_ceiling_ms(attempt, initial, cap)
    assert 0 < ceiling <= cap
    assert ceiling <= initial * 2 ** (attempt - 1)
    assert backoff_ceiling_ms(attempt + 1, initial, cap) >= ceiling


# -- full jitter ------------------------------------------------------------------------------------


@given(attempt=attempts, initial=initials, cap=caps, seed=seeds)
def test_full_jitter_is_within_zero_and_the_ceiling(attempt: int, initial: int, cap: int, seed: int) -> None:
    delay = full_jitter_ms(attempt, initial, cap, random.Random(seed))
    assert isinstance(delay, int)
    assert 0 <= delay <= backoff_ceiling_ms(attempt, initial, cap)


def test_full_jitter_without_rng_is_within_the_ceiling() -> None:
    for _ in range(200):
        assert 0 <= full_jitter_ms(4, INITIAL_MS, MAX_MS) <= 8000


def test_full_jitter_covers_the_whole_window() -> None:
    rng = random.Random(1234)
    delays = [full_jitter_ms(4, INITIAL_MS, MAX_MS, rng) for _ in range(500)]
    assert all(0 <= d <= 8000 for d in delays)
    assert len(set(delays)) > 300  # not constant, not a handful of values
    assert min(delays) < 800  # reaches the bottom tenth
    assert max(delays) > 7200  # and the top tenth
    mean = sum(delays) / len(delays)
    assert 3000 < mean < 5000  # centred on half the ceiling


def test_full_jitter_is_reproducible_with_a_seed() -> None:
    first = [full_jitter_ms(3, INITIAL_MS, MAX_MS, random.Random(7)) for _ in range(5)]
    second = [full_jitter_ms(3, INITIAL_MS, MAX_MS, random.Random(7)) for _ in range(5)]
    assert first == second


# -- Retry-After floor ------------------------------------------------------------------------------


@given(
    attempt=attempts,
    initial=initials,
    cap=caps,
    hint=st.floats(min_value=0, max_value=10**7, allow_nan=False),
    seed=seeds,
)
def test_retry_after_floors_the_delay_but_never_past_the_cap(
    attempt: int, initial: int, cap: int, hint: float, seed: int
) -> None:
    delay = retry_delay_ms(attempt, initial, cap, hint, random.Random(seed))
    assert isinstance(delay, int)
    assert delay <= cap
    # 1 ms of slack for the float seconds -> int milliseconds conversion.
    assert delay >= min(cap, hint * 1000) - 1


@given(attempt=attempts, initial=initials, cap=caps, seed=seeds)
def test_without_retry_after_the_delay_is_full_jitter(
    attempt: int, initial: int, cap: int, seed: int
) -> None:
    delay = retry_delay_ms(attempt, initial, cap, None, random.Random(seed))
    assert delay == full_jitter_ms(attempt, initial, cap, random.Random(seed))


def test_a_short_retry_after_changes_nothing() -> None:
    jitter = full_jitter_ms(5, INITIAL_MS, MAX_MS, random.Random(99))
    assert retry_delay_ms(5, INITIAL_MS, MAX_MS, 0.0, random.Random(99)) == jitter
    assert retry_delay_ms(5, INITIAL_MS, MAX_MS, jitter / 1000 / 2, random.Random(99)) == jitter


def test_a_long_retry_after_raises_the_delay() -> None:
    assert retry_delay_ms(1, INITIAL_MS, MAX_MS, 120, random.Random(0)) == 120_000
    assert retry_delay_ms(1, INITIAL_MS, MAX_MS, 7200, random.Random(0)) == MAX_MS


def test_an_absurd_retry_after_is_capped() -> None:
    # A receiver may send any digits; the delay must still be the cap, not an error.
    seconds = parse_retry_after("9" * 400, NOW)
    assert seconds is not None
    assert retry_delay_ms(1, INITIAL_MS, MAX_MS, seconds, random.Random(0)) == MAX_MS


# -- parse_retry_after ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"), [("120", 120.0), ("0", 0.0), (" 30 ", 30.0), ("86400", 86400.0)]
)
def test_delta_seconds(value: str, seconds: float) -> None:
    assert parse_retry_after(value, NOW) == seconds


@pytest.mark.parametrize(
    "value",
    [
        "Thu, 01 Jan 2026 00:02:00 GMT",  # RFC 7231 IMF-fixdate
        "Thursday, 01-Jan-26 00:02:00 GMT",  # obsolete RFC 850
        "Thu Jan  1 00:02:00 2026",  # obsolete asctime
    ],
)
def test_http_date_in_the_future(value: str) -> None:
    assert parse_retry_after(value, NOW) == 120.0


@pytest.mark.parametrize(
    "value",
    [
        "Sun, 06 Nov 1994 08:49:37 GMT",
        "Sunday, 06-Nov-94 08:49:37 GMT",
        "Sun Nov  6 08:49:37 1994",
        "Wed, 31 Dec 2025 23:59:59 GMT",  # one second ago
    ],
)
def test_http_date_in_the_past_means_zero(value: str) -> None:
    assert parse_retry_after(value, NOW) == 0.0


def test_http_date_now_means_zero() -> None:
    assert parse_retry_after("Thu, 01 Jan 2026 00:00:00 GMT", NOW) == 0.0


@pytest.mark.parametrize(
    "value",
    [
        "",
        "   ",
        "soon",
        "-5",
        "1.5",
        "12 34",
        "0x10",
        "\u00b2",  # a superscript two: str.isdigit() says yes, int() says no
        "Thu, 32 Jan 2026 00:00:00 GMT",
        "Thu, 01 Foo 2026 00:00:00 GMT",
    ],
)
def test_garbage_is_none(value: str) -> None:
    assert parse_retry_after(value, NOW) is None


def test_none_is_none() -> None:
    assert parse_retry_after(None, NOW) is None


@given(st.text(max_size=60))
@example("\u00b2")
@example("\u0661\u0662")  # Arabic-Indic digits
@example("9" * 5000)  # past int()'s default digit limit
@example("Fri, 31 Dec 9999 23:59:59 GMT")
@example("Fri, 31 Dec 99999 23:59:59 GMT")
def test_parse_never_raises_and_is_never_negative(value: str) -> None:
    seconds = parse_retry_after(value, NOW)
    assert seconds is None or seconds >= 0


# -- one retry policy type, two instances ----------------------------------------------------------


def test_webhooks_and_callbacks_are_two_instances_of_one_retry_policy_judged_by_one_rule() -> None:
    webhook = Settings().webhook_retry_policy
    callback = callback_retry_policy()
    assert type(webhook) is type(callback) is RetryPolicy
    assert (callback.max_attempts, callback.initial_backoff_ms, callback.max_backoff_ms) == (
        10,
        30_000,
        600_000,
    )

    def verdict(policy: RetryPolicy, status: int, retry_after: str | None = None) -> Verdict:
        answer = HttpResponse(status, retry_after, "", 5)
        return judge(answer, attempt=1, policy=policy, now=NOW, rng=random.Random(0))

    # The data differ, the rule is one: a 404 retries a webhook and dead-letters a callback...
    assert verdict(webhook, 404).state is DeliveryState.PENDING
    assert verdict(callback, 404).state is DeliveryState.DLQ
    # ...a 410 ends both, and a day's Retry-After is capped by each policy's own ceiling.
    assert verdict(webhook, 410).state is verdict(callback, 410).state is DeliveryState.DLQ
    day = str(24 * 3600)
    assert verdict(webhook, 503, day).next_attempt_at == NOW + timedelta(milliseconds=MAX_MS)
    assert verdict(callback, 503, day).next_attempt_at == NOW + timedelta(minutes=15)
    assert verdict(webhook, 500).error == verdict(callback, 500).error == "server returned status: 500"
