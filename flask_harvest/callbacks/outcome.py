"""What is the completion callbacks' own in the outbound rules: their retry policy and their
dead-letter reason. Pure.

An attempt is judged by the one outbound rule, :func:`flask_harvest.outbound.attempt.judge`, under the
callback retry policy (:func:`callback_retry_policy`):

* 2xx: ``DELIVERED``.
* A permanent 4xx (400, 401, 403, 404, 410, 422, any 4xx but the transient ones) fails at once:
  retrying cannot fix it. 408, 421, 425 and 429 are transient, and so is 413 with ``Retry-After``.
* Refused by the SSRF guard at connect time: fails at once.
* Anything else (3xx, since redirects are never followed; 5xx; timeouts; connection errors):
  transient. With attempts left the row waits the policy's backoff (no jitter), floored by
  ``Retry-After`` (capped at :data:`RETRY_AFTER_CAP_SECONDS`); without, it fails.

A failure leaves the row dead-lettered (``FAILED`` in its table) with a dead-letter entry whose
reason is ``CallbackDeliveryExhausted``.
"""

from __future__ import annotations

from typing import Any

# The one lifecycle of every outbound delivery, importable from here as it was.
from ..outbound.attempt import DeliveryState as DeliveryState
from ..outbound.backoff import RetryPolicy

__all__ = [
    "DEFAULT_RETRY_POLICY",
    "RETRY_AFTER_CAP_SECONDS",
    "callback_retry_policy",
    "dead_letter_reason",
]

#: The longest a ``Retry-After`` can hold a delivery back (the engine's ceiling, 15 minutes).
RETRY_AFTER_CAP_SECONDS = 15 * 60
#: The dead-letter reason type of a completion callback that was not delivered.
EXHAUSTED = "CallbackDeliveryExhausted"


def callback_retry_policy(
    max_attempts: int = 10, initial_backoff_ms: int = 30_000, max_backoff_ms: int = 600_000
) -> RetryPolicy:
    """The completion callbacks' retry policy with these numbers.

    A row stores only the numbers (frozen at enqueue, so a later config change does not touch
    it); the rules that go with them, permanent 4xx and the ``Retry-After`` cap, are this kind's.
    """
    return RetryPolicy(
        max_attempts,
        initial_backoff_ms,
        max_backoff_ms,
        retry_after_cap_ms=RETRY_AFTER_CAP_SECONDS * 1000,
        permanent_4xx=True,
    )


#: 10 attempts, 30 s doubling up to 600 s.
DEFAULT_RETRY_POLICY = callback_retry_policy()


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
