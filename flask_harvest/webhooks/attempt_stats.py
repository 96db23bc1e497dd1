"""A subscription's recent health: the success rate and the p50 and p99 latency of its attempts.

Pure: the store reads a bounded sample (:meth:`~.stores.base.OutboundWebhookHandler.recent_attempts`),
this module folds it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["AttemptStats", "attempt_stats", "nearest_rank"]


@dataclass(frozen=True)
class AttemptStats:
    """Attempts in a window: how many, how many got a 2xx, and the latency percentiles (of the
    attempts that have a duration; ``None`` when none has)."""

    attempts: int
    succeeded: int
    p50_ms: int | None
    p99_ms: int | None

    @property
    def success_rate(self) -> float | None:
        """The share of attempts answered 2xx, 0 to 1; ``None`` without an attempt."""
        return self.succeeded / self.attempts if self.attempts else None


def nearest_rank(ordered: Sequence[int], fraction: float) -> int | None:
    """The nearest-rank percentile of ``ordered`` (ascending): the smallest value with at least
    ``fraction`` of the values at or below it; ``None`` for no values."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def attempt_stats(rows: Sequence[tuple[int | None, int | None]]) -> AttemptStats:
    """Fold ``(response_status, elapsed_ms)`` rows: a 2xx status is a success; an attempt that
    never got an answer (refused, timed out) has no status and counts as a failure."""
    succeeded = sum(1 for status, _ in rows if status is not None and 200 <= status <= 299)
    durations = sorted(elapsed for _, elapsed in rows if elapsed is not None)
    return AttemptStats(len(rows), succeeded, nearest_rank(durations, 0.5), nearest_rank(durations, 0.99))
