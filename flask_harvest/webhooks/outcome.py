"""The outcome rules: what an attempt's result means for the delivery and its subscription. Pure.

* 2xx: delivered; the subscription's failure count goes back to zero.
* 410 Gone: the receiver asked us to stop; the subscription is disabled and the delivery
  dead-lettered at once.
* Refused by the SSRF policy (the URL, or an address its host resolved to): a counted failure,
  dead-lettered at once, since retrying cannot change the policy's answer. ``last_error`` names
  the reason; the subscription stays as it is, so an operator can fix the policy and replay.
* Any other status (3xx included: redirects are never followed), a timeout or a connection error:
  a counted failure. With attempts left the delivery waits ``full jitter`` (floored by
  ``Retry-After``); without, it is dead-lettered.

A result carries where its transitions are notified (:func:`.operational.context`): a dead
letter, or a subscription turned off, is told to the operational endpoint when one is configured,
unless the delivery is one of that endpoint's own.

The delivery's new state is the one outbound rule's (:func:`flask_harvest.outbound.attempt.judge`, under
:attr:`Settings.webhook_retry_policy <flask_harvest.config.Settings.webhook_retry_policy>`); this
module adds what it does to the subscription.
"""

from __future__ import annotations

import random
from datetime import datetime

from .._input import text_problem
from ..config import Settings
from ..outbound.attempt import HttpResponse, TransportError, judge
from . import operational
from .models import (
    AttemptResult,
    Claim,
    DeliveryAttempt,
    DeliveryState,
    SubscriptionEffect,
)


def before_sending(claim: Claim, settings: Settings, now: datetime) -> AttemptResult | None:
    """Return the result of a claimed delivery that must not be sent, or ``None`` to send it.

    A delivery whose subscription was removed is skipped (there is nowhere to send it). One whose
    subscription became disabled or failed after the dispatch accepted it is dead-lettered, so it
    stays visible and can be replayed once the endpoint is back. An attempt number past the
    current limit (the limit was lowered while the delivery waited) dead-letters it too, and so
    does one whose payload no attempt could send (text that cannot be encoded, which dispatch
    refuses but a row written another way may hold): retrying it would fail forever. None of
    these makes a request.
    """
    delivery, subscription = claim.delivery, claim.subscription
    state = DeliveryState.DLQ
    if subscription is None:
        state, reason = DeliveryState.SKIPPED, "subscription was removed"
    elif not subscription.is_active:
        reason = f"subscription is {subscription.status.value}; not sent"
    elif text_problem(delivery.payload, nul=True) is not None:
        reason = f"the payload cannot be sent: it {text_problem(delivery.payload, nul=True)}"
    elif delivery.attempt > settings.webhooks_max_attempts:
        reason = f"attempt limit is {settings.webhooks_max_attempts}; attempt {delivery.attempt} was not made"
    else:
        return None
    return AttemptResult(
        state=state,
        attempt_number=delivery.attempt,
        next_attempt_at=None,
        last_error=reason,
        timestamp=now,
        operational=operational.context(claim, settings) if state is DeliveryState.DLQ else None,
    )


def after_response(
    claim: Claim,
    result: HttpResponse | TransportError,
    *,
    settings: Settings,
    started_at: datetime,
    now: datetime,
    request_headers: dict[str, str],
    rng: random.Random | None = None,
) -> AttemptResult:
    """Return what to record for an attempt that was sent and answered (or failed in transit)."""
    delivery = claim.delivery
    verdict = judge(result, attempt=delivery.attempt, policy=settings.webhook_retry_policy, now=now, rng=rng)
    attempt = DeliveryAttempt(
        delivery_id=delivery.id,
        attempt=delivery.attempt,
        started_at=started_at,
        response_status=verdict.status,
        response_body=result.body if isinstance(result, HttpResponse) else None,
        elapsed_ms=result.elapsed_ms,
        error=verdict.error,
    )
    if verdict.state is DeliveryState.DELIVERED:
        effect = SubscriptionEffect.RESET_FAILURES
    elif verdict.status == 410:  # the receiver asked us to stop
        effect = SubscriptionEffect.DISABLE
    else:
        effect = SubscriptionEffect.COUNT_FAILURE
    # A success changes nothing that is notified: its context would never be read.
    notify = None if effect is SubscriptionEffect.RESET_FAILURES else operational.context(claim, settings)
    # A retry's row counts the attempt it waits for.
    number = delivery.attempt + 1 if verdict.state is DeliveryState.PENDING else delivery.attempt
    return AttemptResult(
        state=verdict.state,
        attempt_number=number,
        next_attempt_at=verdict.next_attempt_at,
        last_error=verdict.error,
        timestamp=now,
        request_headers=request_headers,
        attempt=attempt,
        effect=effect,
        failure_threshold=settings.webhooks_failure_threshold,
        operational=notify,
    )
