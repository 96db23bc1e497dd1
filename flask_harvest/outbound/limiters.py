"""Where rate-limit buckets live: in Redis for every worker process, or in this process.

:func:`~flask_harvest.outbound.rate.take` is the arithmetic; a limiter keeps one bucket per
endpoint and runs it atomically. :class:`RedisRateLimiter` runs it in one Lua script, on Redis's
clock, so every worker process (on any machine) shares one bucket per endpoint.
:class:`LocalRateLimiter` keeps the buckets in memory: exact for the ``local`` job backend, whose
deliveries all run in one process.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

import redis

from .rate import MICROS, Bucket, RateLimit, expires_in, take

log = logging.getLogger(__name__)

__all__ = ["LocalRateLimiter", "RateLimiter", "RedisRateLimiter"]

# How long a request waits when Redis cannot say: the limit holds (nothing is sent unmetered),
# and the delivery comes round again soon.
UNAVAILABLE_WAIT_SECONDS = 1.0

# take() of flask_harvest.outbound.rate, line for line, on the bucket hash KEYS[1]. ARGV: the
# interval and the burst (microseconds, count), "now" in microseconds or "" for Redis's own
# clock (the tests compare the two with a given "now"), and the horizon in microseconds or "".
# Returns the wait in microseconds. The key expires when the bucket is full again and no turn is
# pending (expires_in).
_TAKE = """
local interval = tonumber(ARGV[1])
local capacity = interval * tonumber(ARGV[2])
local now
if ARGV[3] ~= '' then
    now = tonumber(ARGV[3])
else
    local clock = redis.call('TIME')
    now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
end
local stored = redis.call('HMGET', KEYS[1], 'tat', 'offer')
local tat = tonumber(stored[1])
local offer = tonumber(stored[2])
if not tat then
    tat = now
    offer = now - interval
end
offer = math.max(offer, now - interval)
local start = math.max(tat, now)
local wait = 0
if start + interval - now <= capacity then
    tat = start + interval
else
    local turn = math.max(offer + interval, start + interval - capacity)
    if ARGV[4] == '' or turn - now <= tonumber(ARGV[4]) then
        offer = turn
    end
    wait = turn - now
end
redis.call('HSET', KEYS[1], 'tat', string.format('%.0f', tat), 'offer', string.format('%.0f', offer))
local ttl = math.max(tat, offer + interval) - now
redis.call('PEXPIRE', KEYS[1], math.floor(ttl / 1000) + 1)
return wait
"""


def _micros(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * MICROS)


class RateLimiter(Protocol):
    """Keeps one bucket per endpoint."""

    def acquire(self, endpoint: str, limit: RateLimit, horizon: float | None = None) -> float:
        """Ask to send one request to ``endpoint`` now: return ``0`` if it may go (it is counted),
        else the seconds until its turn (nothing is counted); a turn further than ``horizon``
        seconds away is not handed out (:func:`~flask_harvest.outbound.rate.take`)."""


class LocalRateLimiter:
    """Buckets in this process's memory, on the monotonic clock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[Bucket, int]] = {}  # endpoint -> (bucket, expires at)

    def acquire(self, endpoint: str, limit: RateLimit, horizon: float | None = None) -> float:
        now = time.monotonic_ns() // 1000
        with self._lock:
            found = self._buckets.get(endpoint)
            bucket, wait = take(found[0] if found else None, now, limit, _micros(horizon))
            self._buckets[endpoint] = (bucket, now + expires_in(bucket, now, limit))
            if len(self._buckets) > 1_000:  # stay bounded whatever the endpoints
                self._buckets = {key: kept for key, kept in self._buckets.items() if kept[1] > now}
        return wait / MICROS


class RedisRateLimiter:
    """Buckets in Redis (one hash per endpoint, expiring once full), shared by every process.

    :param connection: the Redis connection (the ``rq`` backend's).
    :param prefix: what the keys start with (the queue's name keeps two apps on one Redis apart).
    """

    def __init__(self, connection: redis.Redis, prefix: str) -> None:
        self._script = connection.register_script(_TAKE)
        self._prefix = prefix

    def key(self, endpoint: str) -> str:
        """The Redis key of ``endpoint``'s bucket."""
        return f"{self._prefix}{endpoint}"

    def acquire(self, endpoint: str, limit: RateLimit, horizon: float | None = None) -> float:
        try:
            return self.take(endpoint, limit, horizon=_micros(horizon)) / MICROS
        except redis.RedisError as exc:
            log.warning(
                "harvest: could not reach the rate limit of %s (%s); it waits %.0f s",
                endpoint,
                type(exc).__name__,
                UNAVAILABLE_WAIT_SECONDS,
            )
            return UNAVAILABLE_WAIT_SECONDS

    def take(
        self, endpoint: str, limit: RateLimit, now: int | None = None, horizon: int | None = None
    ) -> int:
        """Run the bucket's script: the wait in microseconds (``now``: a given clock, for tests;
        ``horizon`` in microseconds)."""
        args = [limit.interval, limit.burst, "" if now is None else now, "" if horizon is None else horizon]
        return int(self._script(keys=[self.key(endpoint)], args=args))
