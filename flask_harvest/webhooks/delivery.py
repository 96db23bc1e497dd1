"""One delivery attempt: claim, sign, POST, classify, record, schedule the next.

No database transaction is open during the POST: the claim and the record are two short
transactions, and the lease between them is what keeps other workers away.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

from .. import tracing
from .._threads import GroupCommit
from .._time import utcnow
from .._version import __version__
from ..config import Settings
from ..errors import HarvestError, InvalidStateError
from ..jobs.base import JobBackend, JobBackendError, JobRef
from ..outbound.admission import Ticket
from ..outbound.attempt import ResultObserver
from ..outbound.limiters import LocalRateLimiter, RateLimiter
from ..outbound.signing import sign_headers
from ..outbound.transport import Transport
from . import outcome
from .models import (
    AttemptResult,
    Claim,
    DeliveryLog,
    DeliveryState,
    WebhookSubscriptionStatus,
    reserved_header,
)
from .stores.base import DeliverySchedule, LeaseTerms, OutboundWebhookHandler, Outcome, Recorded

log = logging.getLogger(__name__)
USER_AGENT = f"flask-harvest/{__version__}"
#: The job seam's kind for webhook deliveries.
WEBHOOK_JOB = "webhook"
# The most outcomes one statement records: attempts that end while a record is being written
# are written together by the next one.
_RECORD_BATCH = 64


def delivery_job(delivery: DeliveryLog | DeliverySchedule) -> JobRef:
    """Return the job reference of a delivery's next attempt."""
    return JobRef(WEBHOOK_JOB, delivery.id, delivery.attempt, delivery.next_attempt_at)


#: Called after an attempt is recorded: (claim, result, subscription status change or None).
AttemptListener = Callable[[Claim, AttemptResult, WebhookSubscriptionStatus | None], None]
#: Called when a claimed delivery must wait for its subscription's rate limit: (claim, seconds).
RateListener = Callable[[Claim, float], None]


class DeliveryRunner:
    """Makes delivery attempts for one app."""

    def __init__(
        self,
        store: OutboundWebhookHandler,
        settings: Settings,
        transport: Transport,
        backend: JobBackend,
        listener: AttemptListener | None = None,
        rng: random.Random | None = None,
        *,
        limiter: RateLimiter | None = None,
        rate_listener: RateListener | None = None,
        hold_watch: RateListener | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.transport = transport
        self.backend = backend
        self.listener = listener
        #: Keeps the subscriptions' rate-limit buckets (in Redis with the rq backend).
        self.limiter: RateLimiter = limiter or LocalRateLimiter()
        self.rate_listener = rate_listener
        #: Told of each hold too: tells the operational endpoint of long ones
        #: (:class:`~flask_harvest.webhooks.rate_holds.HoldWatch`); ``None`` without one.
        self.hold_watch = hold_watch
        #: Starts claims at once (a worker sets its pool's :meth:`follow
        #: <flask_harvest.worker.pool.DeliveryPool.follow>`): when set, the outcome of a keyed
        #: delivery leases the next delivery of its key in the same transaction and hands it here
        #: instead of queueing a job for it. ``None``: the next delivery is queued.
        self.follow: Callable[[Sequence[Claim]], object] | None = None
        self._rng = rng or random.SystemRandom()
        self._tenant_policy = settings.tenant_ssrf_policy
        # Attempts ending at once on many threads share one statement and one commit.
        self._records: GroupCommit[Outcome, Recorded] = GroupCommit(
            store.finish_attempts, limit=_RECORD_BATCH
        )

    @property
    def lease_seconds(self) -> float:
        """How long a claimed delivery stays leased."""
        return self.settings.webhooks_lease_seconds

    @property
    def deadline_seconds(self) -> float:
        """The longest one attempt takes."""
        return self.settings.webhooks_deadline_seconds

    @staticmethod
    def ticket(claim: Claim) -> Ticket:
        """What the worker's admission needs of a claimed delivery: its subscription is its
        endpoint, whose failure count says whether it is failing."""
        subscription = claim.subscription
        limit = subscription.rate_limit if subscription is not None else None
        return Ticket(
            endpoint=claim.delivery.subscription_id,
            sendable=subscription is not None,
            failing=subscription is not None and subscription.consecutive_failures > 0,
            label=claim.delivery.id,
            per_second=limit.per_second if limit is not None else None,
        )

    def rate_wait(self, claim: Claim, horizon: float | None = None) -> float:
        """Ask the subscription's rate limit whether ``claim`` may be sent now: ``0`` if it may
        (it is counted), else the seconds until its turn (one further than ``horizon`` seconds is
        not handed out: the caller waits in place only that long). No limit: ``0``, with no
        round trip."""
        subscription = claim.subscription
        if subscription is None or subscription.rate_limit is None:
            return 0.0
        wait = self.limiter.acquire(subscription.id, subscription.rate_limit, horizon)
        if wait > 0:
            self.held_back(claim, wait)
        return wait

    def held_back(self, claim: Claim, seconds: float) -> None:
        """``claim`` is held ``seconds`` until its rate limit's turn: tell the listeners (the
        metrics and signals, and the watch that tells the operational endpoint of long holds)."""
        if self.rate_listener is not None:
            self.rate_listener(claim, seconds)
        if self.hold_watch is not None:
            self.hold_watch(claim, seconds)

    def run(self, delivery_id: str) -> DeliveryState | None:
        """Make one attempt of ``delivery_id`` on this thread; return the state it ended in.

        Returns ``None`` when there was nothing to do: the delivery is not due, already finished,
        or leased to another worker (duplicate jobs end here).
        """
        claim = self.claim(delivery_id)
        if claim is None:
            return None
        wait = self.rate_wait(claim)
        if wait > 0:
            # Its turn comes later: back to the queue, due then, no attempt used, keeping its place.
            self.defer(claim, wait, keep_place=True)
            return DeliveryState.PENDING
        return self.attempt(claim)

    def run_many(self, delivery_ids: Sequence[str]) -> None:
        """Make one attempt of each of ``delivery_ids`` in turn, on this thread (a job's rows)."""
        for delivery_id in delivery_ids:
            self.run(delivery_id)

    def claim(self, delivery_id: str) -> Claim | None:
        """Lease ``delivery_id`` to this worker if it is due; ``None`` if there is nothing to do."""
        claim = self.store.claim_delivery(
            delivery_id,
            now=utcnow(),
            lease_seconds=self.settings.webhooks_lease_seconds,
            max_attempts=self.settings.webhooks_max_attempts,
        )
        if claim is None:
            log.debug("harvest: delivery %s is not claimable; nothing to do", delivery_id)
        return claim

    def claim_many(self, delivery_ids: Sequence[str]) -> list[Claim]:
        """Lease the due ones among ``delivery_ids`` to this worker, in one round trip."""
        return self.store.claim_deliveries(
            delivery_ids,
            now=utcnow(),
            lease_seconds=self.settings.webhooks_lease_seconds,
            max_attempts=self.settings.webhooks_max_attempts,
        )

    def attempt(self, claim: Claim, observe: ResultObserver | None = None) -> DeliveryState | None:
        """Send a claimed delivery (unless it must be skipped), record the outcome, plan a retry.

        :param observe: called with what the transport returned, before the outcome is recorded
            (the worker's pool adapts its per-endpoint limit to it); not called when nothing was sent.
        """
        delivery = claim.delivery
        with tracing.process(
            delivery.topic,
            delivery.id,
            delivery.attempt,
            delivery.trace_context,
            {"harvest.subscription.id": delivery.subscription_id},
        ) as span:
            result = outcome.before_sending(claim, self.settings, utcnow()) or self._send(claim, observe)
            recorded, changed = self._record(claim, result)
            span.set("harvest.state", result.state.value)
        if not recorded:
            return None
        self._log(claim, result, changed)
        if self.listener is not None:
            self.listener(claim, result, changed)
        return result.state

    def defer(self, claim: Claim, seconds: float, *, keep_place: bool = False) -> None:
        """Give a claimed delivery back, unsent and without using an attempt, due in ``seconds``.

        Used when its subscription already has as many attempts in flight as it may, or must
        wait for its rate limit.

        :param keep_place: when due, its job goes to the head of the queue (it waited for its
            rate limit's turn only, and must not then wait behind other subscriptions' backlog).
        """
        delivery = claim.delivery
        result = AttemptResult(
            state=DeliveryState.PENDING,
            attempt_number=delivery.attempt,
            next_attempt_at=utcnow() + timedelta(seconds=seconds),
            last_error=delivery.last_error,
            timestamp=delivery.timestamp,
        )
        self._record(claim, result, keep_place=keep_place)

    def _record(
        self, claim: Claim, result: AttemptResult, *, keep_place: bool = False
    ) -> tuple[bool, WebhookSubscriptionStatus | None]:
        """Write ``result``; return whether we still held the lease, and any status change."""
        key = claim.delivery.ordering_key
        # Where a pool starts claims at once, the next delivery of the key is leased with this
        # outcome: the chain goes on with no job, no queue and no claim of its own.
        terms = (
            LeaseTerms(self.settings.webhooks_lease_seconds, self.settings.webhooks_max_attempts)
            if key is not None and self.follow is not None
            else None
        )
        recorded = self._records.submit(Outcome(claim.delivery.id, claim.lease_token, result, key, terms))
        if not recorded.held:
            # Our lease expired during a very slow attempt and another worker took over.
            log.warning(
                "harvest: lost the lease on delivery %s; its new holder records it", claim.delivery.id
            )
            return False, None
        if result.state is DeliveryState.PENDING:
            self._schedule_retry(claim, result, at_front=keep_place)
        if recorded.following:
            self._follow(recorded.following)
        if recorded.released:
            self._queue_released(claim, recorded.released)
        if recorded.notices:
            self._queue_notices(recorded.notices)
        return True, recorded.changed

    def _follow(self, claims: Sequence[Claim]) -> None:
        """Start the next deliveries of keys, leased with an outcome, through :attr:`follow`."""
        follow = self.follow
        try:
            if follow is None:  # unset since the outcome was sent: nothing will start them
                raise InvalidStateError("no pool to start the next deliveries of their keys")
            follow(claims)
        except Exception:
            # Given back due now, unsent: the sweeper queues them (or their leases run out).
            log.exception("harvest: could not start the next deliveries of their keys; giving them back")
            for following in claims:
                with contextlib.suppress(HarvestError):
                    self.defer(following, 0.0)

    def _queue_released(self, claim: Claim, released: Sequence[DeliverySchedule]) -> None:
        """Queue the next deliveries of a key that the recorded outcome released."""
        now = utcnow()
        try:
            self.backend.enqueue(
                [delivery_job(s) for s in released if s.next_attempt_at is None or s.next_attempt_at <= now]
            )
            for later in (s for s in released if s.next_attempt_at is not None and s.next_attempt_at > now):
                self.backend.schedule(delivery_job(later))
        except JobBackendError as exc:
            # The next delivery is PENDING, due and at the head of its line: the sweeper queues it.
            log.warning(
                "harvest: could not queue the delivery after %s in its key's line (%s); the sweeper will",
                claim.delivery.id,
                exc,
            )

    def _send(self, claim: Claim, observe: ResultObserver | None = None) -> AttemptResult:
        delivery, subscription = claim.delivery, claim.subscription
        if subscription is None:  # before_sending skips these; reaching here is a bug, not a send
            raise InvalidStateError(f"delivery {delivery.id} has no subscription to send to")
        body = delivery.payload.encode("utf-8")
        # A fresh timestamp on every attempt: receivers reject stale ones. The id never changes.
        timestamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            **sign_headers(
                # During a rotation's grace period, both secrets sign: receivers switch at leisure.
                subscription.signing_secrets(utcnow()),
                delivery.id,
                timestamp,
                body,
                signature_header=self.settings.webhooks_signature_header,
            ),
        }
        if subscription.headers:
            # Validated when set; checked again here because the signature header may have been
            # configured differently since: a custom header never replaces one of ours.
            signature_header = self.settings.webhooks_signature_header
            headers.update(
                (name, value)
                for name, value in subscription.headers.items()
                if not reserved_header(name, signature_header)
            )
        started_at = utcnow()
        # A tenant's endpoint is held to the tenant policy at every connection, as when it was set.
        tenanted = delivery.tenant is not None or subscription.tenant is not None
        policy = self._tenant_policy if tenanted else None
        response = self.transport.post_or_error(subscription.target_url, body, headers, policy=policy)
        if observe is not None:
            observe(response)
        return outcome.after_response(
            claim,
            response,
            settings=self.settings,
            started_at=started_at,
            now=utcnow(),
            request_headers=headers,
            rng=self._rng,
        )

    def _queue_notices(self, notices: Sequence[DeliveryLog]) -> None:
        """Queue the operational notifications an outcome logged (committed with it)."""
        try:
            self.backend.enqueue([delivery_job(notice) for notice in notices])
        except JobBackendError as exc:
            # The rows are PENDING and due: the sweeper enqueues them when the backend is back.
            log.warning(
                "harvest: could not queue %d operational notification(s) (%s); the sweeper will",
                len(notices),
                exc,
            )

    def _schedule_retry(self, claim: Claim, result: AttemptResult, *, at_front: bool = False) -> None:
        retry = claim.delivery.replace(
            attempt=result.attempt_number, next_attempt_at=result.next_attempt_at, state=result.state
        )
        try:
            self.backend.schedule(delivery_job(retry), at_front=at_front)
        except JobBackendError as exc:
            # The row is PENDING with its due time: the sweeper enqueues it when the backend is back.
            log.warning("harvest: could not schedule retry of %s (%s); the sweeper will", retry.id, exc)

    @staticmethod
    def _log(claim: Claim, result: AttemptResult, changed: WebhookSubscriptionStatus | None) -> None:
        delivery = claim.delivery
        extra = {
            "delivery_id": delivery.id,
            "subscription_id": delivery.subscription_id,
            "topic": delivery.topic,
            "attempt": delivery.attempt,
            "state": result.state.value,
        }
        level = logging.INFO if result.state is DeliveryState.DELIVERED else logging.WARNING
        log.log(
            level,
            "harvest: delivery %s to %s attempt %d: %s%s",
            delivery.id,
            delivery.subscription_id,
            delivery.attempt,
            result.state.value,
            f" ({result.last_error})" if result.last_error else "",
            extra={"harvest": extra},
        )
        if changed is not None:
            log.warning("harvest: subscription %s is now %s", delivery.subscription_id, changed.value)
