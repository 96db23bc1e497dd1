"""Adaptive per-endpoint concurrency: how many attempts one endpoint may have in flight. Pure.

Each endpoint's limit follows AIMD (additive increase, multiplicative decrease), as TCP's
congestion window does, driven by what each attempt came to (:class:`Signal`), how long it took
and when it ended:

* a success (or an answer that is an error but not an overload) grows the limit while the
  endpoint uses it: by one per success until the first cut
  (slow start, so a fast endpoint reaches its ceiling within a few round trips), then by one per
  limit's worth of successes (one per round trip);
* a 429, 503 or 504, or a refused connection, cuts it at once to 0.7 of itself (TCP CUBIC's
  factor: halving, as Reno does, kept bench S15's receiver at 68% of its capacity, 0.7 at
  80%), and so does a success whose latency has risen well above the endpoint's usual one (see
  :attr:`AdmissionPolicy.latency_tolerance`); one cut per episode: an attempt sent before the
  last cut, or answered within one round trip of it, was sent under the old limit;
* a timeout cuts it the same way, but not below the starting limit (4);
* the limit always stays within ``[floor, ceiling]``; ``floor == ceiling`` is a fixed cap.

No Flask, SQL, Redis or HTTP here: the worker's pool feeds events in and reads :attr:`limit`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from .attempt import FailureKind, HttpResponse, TransportError

#: Statuses by which a receiver (or its proxy) says it has too much to do.
OVERLOAD_STATUSES = frozenset({429, 503, 504})
#: The limit a new endpoint starts at (within the floor and the ceiling): small, so an endpoint
#: that never answers holds few slots before its first timeout, and slow start doubles it each
#: round trip.
INITIAL_LIMIT = 4


class Signal(str, enum.Enum):
    """What one attempt says about its endpoint's load."""

    #: A 2xx answer: room to grow, if its latency stayed flat.
    SUCCESS = "success"
    #: 429, 503, 504 or a refused/reset connection: the receiver has too much; cut at once.
    OVERLOAD = "overload"
    #: No answer in time: stuck or just slow; cut, but not below the starting limit.
    TIMEOUT = "timeout"
    #: Any other failure (a 4xx or 5xx, TLS, a malformed answer): not about load; for the limit
    #: it counts as a prompt answer, as a success does.
    FAILURE = "failure"


def signal_of(result: HttpResponse | TransportError) -> Signal:
    """Classify what the transport returned for one attempt."""
    if isinstance(result, HttpResponse):
        if 200 <= result.status < 300:
            return Signal.SUCCESS
        return Signal.OVERLOAD if result.status in OVERLOAD_STATUSES else Signal.FAILURE
    if result.kind in (FailureKind.TIMEOUT, FailureKind.DEADLINE):
        return Signal.TIMEOUT
    # A full accept queue refuses or resets connections: that is load too.
    return Signal.OVERLOAD if result.kind is FailureKind.CONNECT else Signal.FAILURE


@dataclass(frozen=True)
class AdmissionPolicy:
    """The bounds and tuning of every endpoint's limit in one worker process.

    :param floor: the least an endpoint's limit drops to (at least 1).
    :param ceiling: the most it grows to; the caller passes at most its worker's slots.
    :param latency_tolerance: a success counts as "latency rising" when both it and the recent
        average exceed this many times the endpoint's usual (lowest recent) latency...
    :param latency_slack: ...and exceed it by at least this many seconds, so the jitter of a
        fast endpoint (1 ms becoming 3 ms) is not mistaken for queueing.
    :param decrease: the factor an overload signal multiplies the limit by.
    :param window: seconds of each of the two windows whose lowest latency is the usual one;
        an endpoint that became slower for good is judged by its new latency after two of them.
    """

    floor: int = 1
    ceiling: int = 32
    latency_tolerance: float = 3.0
    latency_slack: float = 0.1
    decrease: float = 0.7
    window: float = 30.0

    def __post_init__(self) -> None:
        if not 1 <= self.floor <= self.ceiling:
            raise ValueError(f"need 1 <= floor <= ceiling, got floor={self.floor} ceiling={self.ceiling}")
        if not (math.isfinite(self.latency_tolerance) and self.latency_tolerance >= 1):
            raise ValueError("latency_tolerance must be a finite number of at least 1")
        if not (math.isfinite(self.latency_slack) and self.latency_slack >= 0):
            raise ValueError("latency_slack must be a finite number of at least 0")
        if not 0 < self.decrease < 1:
            raise ValueError("decrease must be between 0 and 1")
        if not (math.isfinite(self.window) and self.window > 0):
            raise ValueError("window must be a positive number of seconds")

    @property
    def fixed(self) -> bool:
        """Whether the limit never moves (``floor == ceiling``)."""
        return self.floor == self.ceiling


@dataclass(frozen=True)
class Ticket:
    """What admission needs to know of one claimed delivery, whatever its kind.

    :param endpoint: the key of the endpoint whose limit it counts against (a webhook's
        subscription, a completion callback's scheme, host and port).
    :param sendable: whether it can be sent at all (a webhook whose subscription was removed
        cannot: it never waits for a turn).
    :param failing: its row says the endpoint's last attempt failed (used until this process has
        seen an attempt of the endpoint).
    :param label: its id, for logs.
    :param per_second: its endpoint's rate limit, deliveries per second, if it has one: its
        runner says when it may go (a delivery must pass both); ``None`` costs nothing more.
    """

    endpoint: str
    sendable: bool
    failing: bool
    label: str
    per_second: float | None = None

    @property
    def rate_limited(self) -> bool:
        """Whether its endpoint has a rate limit too."""
        return self.per_second is not None


# How much each new success weighs in the recent-latency average.
_EWMA_WEIGHT = 0.2


class EndpointLimit:
    """One endpoint's allowed in-flight attempts, moved by :meth:`record`."""

    def __init__(self, policy: AdmissionPolicy, now: float) -> None:
        self.policy = policy
        self._start = min(max(INITIAL_LIMIT, policy.floor), policy.ceiling)
        self._limit = self._start
        # Slow start until the first cut, as TCP does before its first loss.
        self._threshold = policy.ceiling
        self._credit = 0  # successes towards the next additive step
        self._cut_at = -math.inf  # when the limit was last cut
        self._recent: float | None = None  # average latency of recent successes
        self._window_start = now
        self._window_min = math.inf  # lowest success latency in this window...
        self._previous_min = math.inf  # ...and in the one before

    @property
    def limit(self) -> int:
        """Attempts the endpoint may have in flight now: within ``[floor, ceiling]``."""
        return self._limit

    @property
    def usual_latency(self) -> float | None:
        """The endpoint's lowest success latency over the last one or two windows, in seconds."""
        usual = min(self._window_min, self._previous_min)
        return None if math.isinf(usual) else usual

    def record(self, signal: Signal, latency: float, now: float, *, saturated: bool = True) -> None:
        """Take one attempt's outcome: ``latency`` seconds long, ended at ``now``.

        :param saturated: the endpoint had as many attempts in flight or waiting as its limit, so
            the limit was what held it back; only then does a success grow it (a limit that grew
            while unused would protect nothing when the endpoint turns slow).
        """
        if self.policy.fixed:
            return
        latency = max(0.0, latency)
        if signal in (Signal.SUCCESS, Signal.FAILURE):
            # A prompt error answer shows capacity as much as a success does (the limit is
            # about load; the retry schedule deals with errors), and holding an erroring
            # endpoint at its starting limit let its first deliveries use up every attempt
            # before the others were tried once.
            rising = self._observe_latency(latency, now)
            if rising:
                self._cut(latency, now)
            elif saturated:
                self._grow()
        elif signal is Signal.OVERLOAD:
            self._cut(latency, now)
        elif signal is Signal.TIMEOUT:
            # A timeout is ambiguous (a stuck receiver, or a slow one answering around the
            # timeout), so it cuts as an overload answer does but not below the starting limit:
            # any endpoint not yet heard from gets that many, so going lower protects nothing
            # more. An endpoint that never answers keeps the starting limit it never grew from.
            self._cut(latency, now, least=min(self._start, self._limit))

    def _grow(self) -> None:
        if self._limit < self._threshold:
            self._limit += 1
        else:
            # One per round trip: a whole limit's worth of successes adds one.
            self._credit += 1
            if self._credit < self._limit:
                return
            self._credit = 0
            self._limit += 1
        self._limit = min(self.policy.ceiling, self._limit)

    def _cut(self, latency: float, now: float, *, least: int | None = None) -> None:
        # One cut per episode, as TCP cuts once per round trip: an attempt sent before the last
        # cut went out under the old limit, and for about one round trip after a cut the
        # receiver still holds the attempts sent before it, so its refusals then are old news.
        if now - latency < self._cut_at or now < self._cut_at + (self._recent or 0.0):
            return
        least = self.policy.floor if least is None else least
        self._limit = max(least, math.floor(self._limit * self.policy.decrease))
        self._threshold = self._limit
        self._credit = 0
        self._cut_at = now

    def _observe_latency(self, latency: float, now: float) -> bool:
        """Fold a success's latency in; return whether latency is rising."""
        elapsed = now - self._window_start
        if elapsed >= self.policy.window:
            # After a silence of two windows or more the last window is no longer recent either:
            # keeping its minimum would judge today's latency by an old one, for a whole window.
            self._previous_min = self._window_min if elapsed < 2 * self.policy.window else math.inf
            self._window_min = math.inf
            self._window_start = now
        usual = self.usual_latency
        self._window_min = min(self._window_min, latency)
        recent = latency if self._recent is None else self._recent
        self._recent = recent + _EWMA_WEIGHT * (latency - recent)
        if usual is None:
            return False
        bound = max(usual * self.policy.latency_tolerance, usual + self.policy.latency_slack)
        return latency > bound and self._recent > bound
