"""The rate limit's pure core: GCRA arithmetic in integer microseconds."""

from __future__ import annotations

import math
import uuid

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flask_harvest.outbound.limiters import LocalRateLimiter, RedisRateLimiter
from flask_harvest.outbound.rate import MAX_BURST, MICROS, Bucket, RateLimit, expires_in, take

limits = st.builds(
    RateLimit,
    per_second=st.floats(min_value=0.5, max_value=2000, allow_nan=False),
    burst=st.integers(min_value=1, max_value=50),
)
# Gaps between requests, in microseconds: many at once, some spread out.
gaps = st.lists(st.one_of(st.just(0), st.integers(0, 2_000), st.integers(0, 3 * MICROS)), max_size=300)


def _admitted(limit: RateLimit, gaps: list[int]) -> list[int]:
    bucket: Bucket | None = None
    now = 10**15
    times = []
    for gap in gaps:
        now += gap
        bucket, wait = take(bucket, now, limit)
        if wait == 0:
            times.append(now)
    return times


def test_a_burst_goes_at_once_then_one_per_interval() -> None:
    limit = RateLimit(per_second=10, burst=3)
    now = 1_000_000
    bucket = None
    waits = []
    for _ in range(5):
        bucket, wait = take(bucket, now, limit)
        waits.append(wait)
    assert waits[:3] == [0, 0, 0]
    # Not admitted: told their turns, one interval apart, and nothing counted.
    assert waits[3:] == [100_000, 200_000]
    assert bucket is not None and bucket.tat == now + 300_000
    # At its turn the first waiting request is admitted.
    _, wait = take(bucket, now + 100_000, limit)
    assert wait == 0


@settings(max_examples=300)
@given(limits, gaps)
def test_no_window_admits_more_than_burst_plus_rate_times_its_length(
    limit: RateLimit, gaps: list[int]
) -> None:
    times = _admitted(limit, gaps)
    for first in range(len(times)):
        for last in range(first, len(times)):
            window = (times[last] - times[first]) / MICROS
            assert last - first + 1 <= limit.burst + window * limit.per_second + 1e-9


@given(limits, st.integers(1, 200))
def test_requests_asking_at_their_turns_are_all_admitted_at_the_limits_pace(
    limit: RateLimit, count: int
) -> None:
    # A backlog asks at once; each asks again at the turn it was told: all go, at the rate.
    now = 5 * MICROS
    bucket: Bucket | None = None
    turns = []
    for _ in range(count):
        bucket, wait = take(bucket, now, limit)
        turns.append(now + wait)
    admitted = sum(1 for turn in turns if turn == now)
    assert admitted == min(count, limit.burst)
    for turn in sorted(t for t in turns if t > now):
        bucket, wait = take(bucket, turn, limit)
        assert wait == 0
    span = (max(turns) - now) / MICROS
    assert span <= max(0, count - limit.burst) / limit.per_second + 1e-3


@given(limits, gaps, st.integers(0, 10 * MICROS))
def test_an_expired_bucket_answers_as_a_new_one(limit: RateLimit, gaps: list[int], later: int) -> None:
    bucket: Bucket | None = None
    now = 10**12
    for gap in gaps:
        now += gap
        bucket, _ = take(bucket, now, limit)
    if bucket is None:
        return
    after = now + expires_in(bucket, now, limit) + later
    assert take(bucket, after, limit)[1] == take(None, after, limit)[1] == 0
    # And so does every request after it.
    old, new = bucket, None
    for gap in gaps[:20]:
        after += gap
        old, old_wait = take(old, after, limit)
        new, new_wait = take(new, after, limit)
        assert old_wait == new_wait


@given(limits, gaps)
def test_a_request_held_back_counts_nothing(limit: RateLimit, gaps: list[int]) -> None:
    bucket: Bucket | None = None
    now = 10**12
    for gap in gaps:
        now += gap
        after, wait = take(bucket, now, limit)
        if wait > 0:
            assert bucket is not None and after.tat == bucket.tat
            assert after.offer == now + wait
        bucket = after


def test_the_interval_rounds_up_so_the_rate_is_never_exceeded() -> None:
    assert RateLimit(per_second=3, burst=1).interval == 333_334
    assert RateLimit(per_second=100_000, burst=1).interval == 10
    assert RateLimit(per_second=0.001, burst=1).interval == 1_000 * MICROS


@pytest.mark.parametrize(
    ("per_second", "burst"),
    [
        (0, 1),
        (-1, 1),
        (math.nan, 1),
        (math.inf, 1),
        (1e9, 1),
        (0.0001, 1),
        (True, 1),
        ("10", 1),
        (10, 0),
        (10, -3),
        (10, 1.5),
        (10, True),
        (10, MAX_BURST + 1),
        (10, "5"),
    ],
)
def test_bad_limits_are_refused_with_the_reason(per_second: object, burst: object) -> None:
    with pytest.raises(ValueError, match=r"per_second|burst"):
        RateLimit(per_second=per_second, burst=burst)  # type: ignore[arg-type]


@given(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, MAX_BURST + 10))
def test_any_number_is_a_limit_or_refused(per_second: float, burst: int) -> None:
    try:
        limit = RateLimit(per_second=per_second, burst=burst)
    except ValueError:
        return
    assert limit.interval >= 10 and 1 <= limit.burst <= MAX_BURST


# -- the edges run the same arithmetic ---------------------------------------------------------


@pytest.mark.redis
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limits, gaps)
def test_the_redis_script_answers_as_the_pure_core(  # with and without a horizon
    redis_conn: redis.Redis, limit: RateLimit, gaps: list[int]
) -> None:
    limiter = RedisRateLimiter(redis_conn, "harvest:test-rate:")
    endpoint, other = f"sub_{uuid.uuid4().hex}", f"sub_{uuid.uuid4().hex}"
    bucket: Bucket | None = None
    horizon_bucket: Bucket | None = None
    horizon = MICROS // 2
    now = 1_700_000_000 * MICROS
    try:
        for gap in gaps:
            now += gap
            bucket, wait = take(bucket, now, limit)
            assert limiter.take(endpoint, limit, now) == wait
            assert (
                limiter.take(other, limit, now, horizon=horizon)
                == take(horizon_bucket, now, limit, horizon)[1]
            )
            horizon_bucket = take(horizon_bucket, now, limit, horizon)[0]
        ttl = redis_conn.pttl(limiter.key(endpoint))
        if bucket is not None:
            assert ttl <= expires_in(bucket, now, limit) // 1000 + 1  # -2 once expired
    finally:
        redis_conn.delete(limiter.key(endpoint), limiter.key(other))


@pytest.mark.redis
def test_the_redis_limiter_uses_redis_s_clock_and_shares_one_bucket(redis_conn: redis.Redis) -> None:
    one, two = (RedisRateLimiter(redis_conn, "harvest:test-rate:") for _ in range(2))
    limit = RateLimit(per_second=1, burst=2)
    endpoint = f"sub_{uuid.uuid4().hex}"
    try:
        assert one.acquire(endpoint, limit) == 0
        assert two.acquire(endpoint, limit) == 0
        # The third request waits about one interval, whichever process asks.
        assert 0.5 < one.acquire(endpoint, limit) <= 1.0
    finally:
        redis_conn.delete(one.key(endpoint))


def test_the_local_limiter_counts_per_endpoint() -> None:
    limiter = LocalRateLimiter()
    limit = RateLimit(per_second=1, burst=1)
    assert limiter.acquire("a", limit) == 0
    assert limiter.acquire("b", limit) == 0
    assert 0.5 < limiter.acquire("a", limit) <= 1.0


@given(limits, st.integers(1, 300), st.integers(0, 3 * MICROS))
def test_turns_beyond_the_horizon_are_not_handed_out(limit: RateLimit, count: int, horizon: int) -> None:
    now = 7 * MICROS
    bucket: Bucket | None = None
    handed = []
    for _ in range(count):
        before = bucket
        bucket, wait = take(bucket, now, limit, horizon)
        if wait > horizon:
            # Told to come back at the end of the line, which did not grow.
            assert before is not None and bucket == before
            assert (
                wait
                == max(
                    before.offer + limit.interval, before.tat + limit.interval - limit.burst * limit.interval
                )
                - now
            )
        elif wait > 0:
            handed.append(wait)
    assert all(wait <= horizon for wait in handed)
    assert handed == sorted(handed)
