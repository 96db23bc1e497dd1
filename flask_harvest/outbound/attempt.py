"""One outbound attempt, for webhooks and completion callbacks alike: what it came to (a response,
or a failure in transit), the one lifecycle of a delivery, and the outcome rule that judges an
attempt under a :class:`~flask_harvest.outbound.backoff.RetryPolicy`. Pure.

The transport (:mod:`flask_harvest.outbound.transport`) produces the results and :func:`judge` decides what
they mean; each feature adds only its own consequences (a webhook subscription's failure count, a
callback's dead-letter reason). Keeping this here keeps the rules free of the HTTP client.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from .backoff import RetryPolicy, parse_retry_after


class FailureKind(str, enum.Enum):
    """Why an attempt got no HTTP response."""

    CONNECT = "connect"
    TIMEOUT = "timeout"
    DEADLINE = "deadline"
    TLS = "tls"
    PROTOCOL = "protocol"
    #: Refused by the SSRF policy, before a request was sent; retrying cannot help.
    SSRF = "ssrf"


@dataclass(frozen=True)
class HttpResponse:
    """What the receiver answered: status, the headers we act on, the start of the body."""

    status: int
    retry_after: str | None
    body: str
    elapsed_ms: int


class TransportError(Exception):
    """The attempt got no HTTP response. The message names the kind, never the URL or a secret."""

    def __init__(self, kind: FailureKind, message: str, elapsed_ms: int) -> None:
        super().__init__(message)
        self.kind = kind
        self.elapsed_ms = elapsed_ms


#: Told what the transport returned for an attempt, before its outcome is recorded (the worker's
#: pool adapts the endpoint's limit to it).
ResultObserver = Callable[[HttpResponse | TransportError], None]


class DeliveryState(str, enum.Enum):
    """Where an outbound delivery (a webhook or a completion callback) is in its life.

    The values are the webhook tables' spelling; the completion-callback tables keep their own
    (``PENDING``, ``INFLIGHT``, ``DELIVERED``, ``FAILED``) as data, see
    :mod:`flask_harvest.callbacks.store`.
    """

    #: Waiting for an attempt (first, retry, replay or redrive) at ``next_attempt_at``.
    PENDING = "pending"
    #: Claimed by a worker, whose lease runs until ``lease_expires_at``.
    INFLIGHT = "inflight"
    #: The receiver answered 2xx.
    DELIVERED = "delivered"
    #: Dead-lettered (a callback's ``FAILED``): attempts exhausted or a permanent failure; kept,
    #: and sent again with the same id by a replay or redrive.
    DLQ = "dlq"
    #: Not sent: the webhook subscription was disabled, failed or removed (webhooks only).
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Verdict:
    """What an attempt that was sent comes to: ``DELIVERED``, ``PENDING`` (a retry at
    ``next_attempt_at``) or ``DLQ``, with the status and error to record."""

    state: DeliveryState
    status: int | None
    error: str | None
    next_attempt_at: datetime | None = None


def judge(
    result: HttpResponse | TransportError,
    *,
    attempt: int,
    policy: RetryPolicy,
    now: datetime,
    rng: random.Random | None = None,
) -> Verdict:
    """The one outcome rule of an outbound attempt number ``attempt`` (1-based) that got ``result``.

    * 2xx: delivered.
    * 410 Gone, a status the policy holds permanent (:meth:`RetryPolicy.is_permanent`), or a
      refusal by the SSRF guard (retrying cannot change the policy's answer): dead at once.
    * Anything else (3xx, since redirects are never followed; 5xx; timeouts; connection errors):
      with attempts left, a retry after the policy's delay, floored by ``Retry-After``; else dead.
    """
    if isinstance(result, HttpResponse):
        status: int | None = result.status
        if 200 <= result.status < 300:
            return Verdict(DeliveryState.DELIVERED, result.status, None)
        error = f"server returned status: {result.status}"
        permanent = result.status == 410 or policy.is_permanent(result.status, result.retry_after)
        retry_after = parse_retry_after(result.retry_after, now)
    else:
        status, error, retry_after = None, str(result), None
        permanent = result.kind is FailureKind.SSRF
    if permanent or attempt >= policy.max_attempts:
        return Verdict(DeliveryState.DLQ, status, error)
    delay_ms = policy.delay_ms(attempt, retry_after, rng)
    return Verdict(DeliveryState.PENDING, status, error, now + timedelta(milliseconds=delay_ms))
