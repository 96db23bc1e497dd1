"""Where the rate-limit hold episodes live: in Redis for every worker process, or in this process.

:func:`~flask_harvest.outbound.holds.note_hold` is the arithmetic; a keeper holds one episode per
endpoint and runs it atomically, so that an episode is told once however many processes hold its
deliveries. :class:`RedisHoldEpisodes` runs it in one Lua script on Redis's clock (the ``rq``
backend's workers share it); :class:`LocalHoldEpisodes` keeps the episodes in memory, exact for the
``local`` backend, whose deliveries all run in one process.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

import redis

from .holds import HoldEpisode, expires_in, note_hold
from .rate import MICROS

__all__ = ["HoldEpisodes", "LocalHoldEpisodes", "RedisHoldEpisodes"]

# note_hold() of flask_harvest.outbound.holds, line for line, on the hash KEYS[1]. ARGV: the wait,
# the threshold and the gap (microseconds), and "now" in microseconds or "" for Redis's clock.
# Returns {tell, since, until}. The key expires when the episode is over (expires_in).
_NOTE = """
local wait = tonumber(ARGV[1])
local threshold = tonumber(ARGV[2])
local gap = tonumber(ARGV[3])
local now
if ARGV[4] ~= '' then
    now = tonumber(ARGV[4])
else
    local clock = redis.call('TIME')
    now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
end
local stored = redis.call('HMGET', KEYS[1], 'since', 'until', 'told')
local since = tonumber(stored[1])
local till = tonumber(stored[2])
local told = stored[3] == '1'
if not since or now > till + gap then
    since = now
    till = now
    told = false
end
till = math.max(till, now + math.max(0, wait))
local tell = (not told) and till - since >= threshold
if tell then
    told = true
end
redis.call('HSET', KEYS[1], 'since', string.format('%.0f', since), 'until', string.format('%.0f', till),
    'told', told and '1' or '0')
redis.call('PEXPIRE', KEYS[1], math.floor((till + gap - now) / 1000) + 1)
return {tell and 1 or 0, string.format('%.0f', since), string.format('%.0f', till)}
"""


class HoldEpisodes(Protocol):
    """Keeps one hold episode per endpoint."""

    def note(self, endpoint: str, wait: float, *, threshold: float, gap: float) -> HoldEpisode | None:
        """Count a hold of ``endpoint`` whose turn is ``wait`` seconds away; return its episode
        when this hold makes it long (once per episode), else ``None``. Times in seconds."""


class LocalHoldEpisodes:
    """Episodes in this process's memory, on the wall clock (the episode's times are reported)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._episodes: dict[str, HoldEpisode] = {}

    def note(self, endpoint: str, wait: float, *, threshold: float, gap: float) -> HoldEpisode | None:
        now = time.time_ns() // 1000
        gap_us = int(gap * MICROS)
        with self._lock:
            episode, tell = note_hold(
                self._episodes.get(endpoint),
                now,
                int(wait * MICROS),
                threshold=int(threshold * MICROS),
                gap=gap_us,
            )
            self._episodes[endpoint] = episode
            if len(self._episodes) > 1_000:  # stay bounded whatever the endpoints
                self._episodes = {
                    key: kept for key, kept in self._episodes.items() if expires_in(kept, now, gap_us) > 0
                }
        return episode if tell else None


class RedisHoldEpisodes:
    """Episodes in Redis (one hash per endpoint, expiring when the episode is over), shared by
    every process.

    :param connection: the Redis connection.
    :param prefix: what the keys start with (the queue's name keeps two apps on one Redis apart).
    """

    def __init__(self, connection: redis.Redis, prefix: str) -> None:
        self._script = connection.register_script(_NOTE)
        self._prefix = prefix

    def key(self, endpoint: str) -> str:
        """The Redis key of ``endpoint``'s episode."""
        return f"{self._prefix}{endpoint}"

    def note(self, endpoint: str, wait: float, *, threshold: float, gap: float) -> HoldEpisode | None:
        tell, since, until = self.run(
            endpoint, int(wait * MICROS), threshold=int(threshold * MICROS), gap=int(gap * MICROS)
        )
        return HoldEpisode(since, until, True) if tell else None

    def run(
        self, endpoint: str, wait: int, *, threshold: int, gap: int, now: int | None = None
    ) -> tuple[bool, int, int]:
        """Run the episode's script (microseconds; ``now``: a given clock, for tests): whether to
        tell, and the episode's ``since`` and ``until``.

        :raises redis.RedisError: Redis could not be reached.
        """
        args = [wait, threshold, gap, "" if now is None else now]
        tell, since, until = self._script(keys=[self.key(endpoint)], args=args)
        return bool(int(tell)), int(since), int(until)
