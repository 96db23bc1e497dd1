"""What a completion-callback attempt's result means: delivered, retry when, or failed. Pure.

* 2xx: ``DELIVERED``.
* A permanent 4xx (400, 401, 403, 404, 410, 422, any 4xx but the transient ones) fails at once:
  retrying cannot fix it. 408, 421, 425 and 429 are transient, and so is 413 with ``Retry-After``.
* Refused by the SSRF guard at connect time: fails at once (as for webhooks, retrying cannot change
  the policy's answer).
* Anything else (3xx, since redirects are never followed; 5xx; timeouts; connection errors):
  transient. With attempts left the row waits the policy's backoff (``backoff.py``), floored by
  ``Retry-After`` (capped at :data:`RETRY_AFTER_CAP_SECONDS`); without, it fails.

A failure leaves the row ``FAILED`` with a dead-letter entry whose reason is
``CallbackDeliveryExhausted``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..attempt import FailureKind, HttpResponse, TransportError
from ..backoff import backoff_ceiling_ms, parse_retry_after

__all__ = [
    "RETRY_AFTER_CAP_SECONDS",
    "TRANSIENT_4XX",
    "AttemptOutcome",
    "DeliveryState",
    "RetryPolicy",
    "classify",
    "dead_letter_reason",
]

#: The longest a ``Retry-After`` can hold a delivery back (the engine's ceiling, 15 minutes).
RETRY_AFTER_CAP_SECONDS = 15 * 60
#: The 4xx statuses that are worth retrying.
TRANSIENT_4XX = frozenset({408, 421, 425, 429})
#: The dead-letter reason type of a completion callback that was not delivered.
EXHAUSTED = "CallbackDeliveryExhausted"


class DeliveryState(str, enum.Enum):
    PENDING = "PENDING"
    INFLIGHT = "INFLIGHT"
    DELIVERED = "DELIVERED"
    FAILED = "FAILED"


@dataclass(frozen=True)
class RetryPolicy:
    """Frozen into each delivery row when it is enqueued; later config changes do not touch it."""

    max_attempts: int = 10
    initial_backoff_ms: int = 30_000
    max_backoff_ms: int = 600_000

    def delay_ms(self, attempt: int) -> int:
        """The wait after failed attempt ``attempt`` (1-based): ``initial x 2^(attempt-1)``, capped."""
        return backoff_ceiling_ms(attempt, self.initial_backoff_ms, self.max_backoff_ms)


@dataclass(frozen=True)
class AttemptOutcome:
    """What to record for one attempt."""

    state: DeliveryState
    last_status: int | None
    last_error: str | None
    next_attempt_at: datetime | None = None

    @property
    def dead_lettered(self) -> bool:
        return self.state is DeliveryState.FAILED


def is_permanent(status: int, retry_after: str | None) -> bool:
    """Whether a non-2xx status fails the delivery at once."""
    if not 400 <= status < 500 or status in TRANSIENT_4XX:
        return False
    return not (status == 413 and retry_after is not None)


def classify(
    result: HttpResponse | TransportError, *, attempt: int, policy: RetryPolicy, now: datetime
) -> AttemptOutcome:
    """Return the outcome of attempt number ``attempt`` (1-based) that got ``result``."""
    if isinstance(result, HttpResponse):
        status: int | None = result.status
        if 200 <= result.status < 300:
            return AttemptOutcome(DeliveryState.DELIVERED, result.status, None)
        error = f"receiver answered {result.status}"
        permanent = is_permanent(result.status, result.retry_after)
        retry_after = parse_retry_after(result.retry_after, now)
    else:
        status, error, retry_after = None, str(result), None
        permanent = result.kind is FailureKind.SSRF
    if permanent or attempt >= policy.max_attempts:
        return AttemptOutcome(DeliveryState.FAILED, status, error)
    delay_ms = policy.delay_ms(attempt)
    if retry_after is not None:
        delay_ms = max(delay_ms, int(min(retry_after, RETRY_AFTER_CAP_SECONDS) * 1000))
    return AttemptOutcome(DeliveryState.PENDING, status, error, now + timedelta(milliseconds=delay_ms))


def dead_letter_reason(
    delivery_id: str, attempts: int, last_status: int | None, target: str
) -> dict[str, Any]:
    """The typed reason of a callback's dead-letter entry (its JSON form)."""
    return {
        "type": EXHAUSTED,
        "delivery_id": delivery_id,
        "attempts": attempts,
        "last_status": last_status,
        "target": target,
    }
