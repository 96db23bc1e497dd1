"""Dispatch: turn an event into one delivery per matching subscription and queue the attempts."""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .. import tracing
from .._input import parse_json
from .._threads import PerProcess
from .._time import utcnow
from ..config import Settings
from ..errors import ConfigurationError, EnqueueError, HarvestError, PayloadSchemaError, UnknownEventTypeError
from ..jobs.base import JobBackend, JobBackendError
from .catalog import EventCatalog
from .delivery import delivery_job
from .models import (
    DeliveryLog,
    DeliveryState,
    WebhookSubscription,
    new_id,
)
from .operational import OPERATIONAL_SUBSCRIPTION_ID
from .ordering import validate_ordering_key
from .outbox import OutboxMessage, SqlOutbox, TransactionTarget
from .payload import encode_payload
from .stores.base import OutboundWebhookHandler
from .tenants import validate_tenant
from .topics import validate_topic

log = logging.getLogger(__name__)

#: Takes over a delivery instead of the job backend (the seed's ``WebhookDelegateExt``).
Delegate = Callable[[DeliveryLog, WebhookSubscription], None]
#: Told about the deliveries a dispatch skipped (the plugin sends the signal).
SkipListener = Callable[[Sequence[DeliveryLog]], None]

# Delivery ids of relayed outbox messages are uuid5(namespace, "<message id>/<subscription id>"):
# relaying a message twice derives the same ids, so it cannot create a second delivery.
_OUTBOX_NAMESPACE = uuid.UUID("6f0d8a52-3c1e-4b8e-9a0f-5e2b7c1d4a90")


def _decoder(body: str) -> Callable[[], Any]:
    """The payload ``body`` encodes, decoded on the first call only: only the subscriptions with a
    filter ask for it, and a dispatch to those without one never decodes."""
    return functools.cache(lambda: json.loads(body))


def outbox_delivery_id(message_id: str, subscription_id: str) -> str:
    """Return the delivery id of an outbox message's delivery to one subscription."""
    return "msg_" + uuid.uuid5(_OUTBOX_NAMESPACE, f"{message_id}/{subscription_id}").hex


@dataclass(frozen=True)
class RelayReport:
    """What one relay pass did."""

    #: Messages turned into deliveries and marked relayed.
    relayed: int
    #: Messages whose relay failed; they stay in the outbox and are tried again.
    failed: int


class OutboundWebhookManager:
    """Writes delivery logs and hands them to the job backend.

    Reach it with :func:`flask_harvest.get_manager` (or ``plugin.manager``) inside an app context.
    """

    def __init__(
        self,
        store: OutboundWebhookHandler,
        backend: JobBackend,
        settings: Settings,
        *,
        outbox: SqlOutbox | None = None,
        delegate: Delegate | None = None,
        on_skipped: SkipListener | None = None,
        catalog: EventCatalog | None = None,
    ) -> None:
        self.store = store
        #: The event types payloads are checked against (see :meth:`check_event`).
        self.catalog = catalog if catalog is not None else EventCatalog()
        self.backend = backend
        self.settings = settings
        self.outbox = outbox
        self.delegate = delegate
        self._on_skipped = on_skipped
        self._relay_executor = PerProcess(
            lambda: ThreadPoolExecutor(max_workers=2, thread_name_prefix="harvest-relay")
        )

    # -- dispatch ------------------------------------------------------------------------------

    def dispatch(
        self, topic: str, payload: Any, *, ordering_key: str | None = None, tenant: str | None = None
    ) -> list[str]:
        """Send ``payload`` to every active subscription of ``topic`` of ``tenant``; return their
        delivery ids.

        Only the subscriptions of ``tenant`` are considered, and without a tenant only the
        untenanted ones (:mod:`~flask_harvest.webhooks.tenants`): an event never reaches another
        tenant's endpoint. Each delivery carries its subscription's tenant.

        With ``ordering_key``, each subscription receives the deliveries of that key one at a
        time, in dispatch order (see :doc:`/ordering`); without it, deliveries are unordered.

        The payload is serialised to JSON once; those bytes are stored and sent on every attempt.
        One delivery log per matching subscription is written in one round trip: ``PENDING`` for
        an active one, ``SKIPPED`` for a disabled or failed one (their ids are not returned). A
        subscription whose payload filter does not hold on the payload (as JSON decodes it) gets
        no delivery at all. Then
        the pending deliveries are queued in one round trip (the ``rq`` backend carries up to
        ``HARVEST_WORKER_CONCURRENCY`` / 4 of them per job).

        Logging and queueing are two steps, not one transaction: a crash between them leaves
        pending rows that the sweeper queues later (SQL store). To tie the event to your own
        transaction, use :meth:`dispatch_in_tx`.

        :raises InvalidFieldError: the topic is not a plain topic, the tenant not a tenant, the
            payload is not JSON, or the ordering key is not a key.
        :raises PayloadSchemaError: the payload does not match its event type's schema (with
            ``HARVEST_EVENT_VALIDATION = "refuse"``); nothing was written.
        :raises UnknownEventTypeError: the catalog is strict and has no type for the topic.
        :raises ConfigurationError: an ordering key was given to a store without ordered delivery.
        :raises EnqueueError: the jobs could not be queued; the deliveries whose jobs failed were
            dead-lettered (replayable) and the error names them.
        :raises StoreError: the store failed; nothing was queued.
        """
        validate_topic(topic, pattern=False)
        key = self._ordering_key(ordering_key)
        validate_tenant(tenant)
        body = encode_payload(payload)
        self.check_event(topic, body)
        with tracing.publish(topic) as span:
            ids = self._dispatch(topic, body, tracing.capture(), key, tenant)
            span.set("messaging.batch.message_count", len(ids))
            return ids

    def _ordering_key(self, ordering_key: object) -> str | None:
        key = validate_ordering_key(ordering_key)
        if key is not None and not self.store.capabilities.ordering:
            raise ConfigurationError(
                "ordered delivery (ordering_key) needs a store that keeps deliveries in line: use the "
                "SQL store or the in-memory store"
            )
        return key

    def _dispatch(
        self,
        topic: str,
        body: str,
        trace_context: str | None,
        ordering_key: str | None = None,
        tenant: str | None = None,
    ) -> list[str]:
        now = utcnow()
        payload = _decoder(body)
        # Fresh ids: the store may insert them without a duplicate check, in the transaction that
        # reads the subscriptions. A keyed delivery's place in line is numbered by the store.
        pairs = self.store.log_deliveries_for_topic(
            topic,
            lambda subscription: self._delivery(
                topic, body, payload, subscription, now, new_id("msg"), trace_context, ordering_key
            ),
            tenant=tenant,
        )
        deliveries = [delivery for _, delivery in pairs]
        pending = [d for d in deliveries if d.state is DeliveryState.PENDING]
        queued = self._needing_jobs(pending)
        try:
            self._hand_over(queued, {s.id: s for s, _ in pairs})
        except JobBackendError as exc:
            # Only the deliveries whose jobs failed: one waiting behind its key needed no job, and
            # dead-lettering it would block its key (or, under "skip", drop it from the line).
            ids = [d.id for d in queued]
            moved = self.store.dead_letter(ids, f"enqueue failed: {exc}", now=utcnow())
            log.error("harvest: enqueue failed (%s); dead-lettered %d deliveries", exc, len(moved))
            raise EnqueueError(ids, str(exc)) from exc
        # After the hand-over: a receiver of the signal that raises must not keep jobs unqueued.
        self._report_skipped(deliveries)
        return [d.id for d in pending]

    def dispatch_in_tx(
        self,
        conn: TransactionTarget,
        topic: str,
        payload: Any,
        *,
        ordering_key: str | None = None,
        tenant: str | None = None,
    ) -> str:
        """Write the event into the caller's transaction; return the outbox message id.

        ``ordering_key`` orders the event's deliveries as :meth:`dispatch` does; the order is the
        order in which the callers' transactions commit. The message keeps ``tenant``: its relay
        delivers to that tenant's subscriptions only, as :meth:`dispatch` does (without a tenant,
        to the untenanted ones).

        ``conn`` is a SQLAlchemy ``Connection``, an ORM ``Session`` or Flask-SQLAlchemy's
        ``db.session``, on the same database as the SQL store. The event is sent if and only if
        that transaction commits: nothing is committed or sent here. After a session commits, the
        message is relayed at once on a background thread; a message written on a bare connection
        (or whose process died before the relay) is relayed by the sweeper. Deliveries get ids
        derived from the message and the subscription, so a second relay never sends twice.

        :raises ConfigurationError: the store cannot share a transaction (the in-memory store).
        :raises InvalidFieldError: the topic is not a plain topic, the tenant not a tenant, the
            payload is not JSON, or the ordering key is not a key.
        :raises PayloadSchemaError: the payload does not match its event type's schema (with
            ``HARVEST_EVENT_VALIDATION = "refuse"``); nothing was written.
        :raises UnknownEventTypeError: the catalog is strict and has no type for the topic.
        """
        if self.outbox is None:
            raise ConfigurationError(
                "dispatch_in_tx needs a store that shares your database transaction: use the SQL "
                "store (Harvest(app, db)); the in-memory store cannot"
            )
        validate_topic(topic, pattern=False)
        key = self._ordering_key(ordering_key)
        validate_tenant(tenant)
        body = encode_payload(payload)
        self.check_event(topic, body)
        with tracing.publish(topic):
            return self.outbox.write(
                conn, topic, body, self._relay_soon, tracing.capture(), key, tenant=tenant
            )

    def check_event(self, topic: str, body: str) -> None:
        """Check an encoded payload against the event type of ``topic``, before anything is written.

        The JSON text is what is checked, not the Python value: it is what receivers get (a
        datetime is a string there).

        :raises PayloadSchemaError: it does not match, and ``HARVEST_EVENT_VALIDATION`` is ``refuse``
            (with ``warn``, the problem is logged and the event is sent).
        :raises UnknownEventTypeError: ``HARVEST_EVENT_CATALOG_STRICT`` is on and ``topic`` has no type.
        """
        if not len(self.catalog):
            if self.settings.event_catalog_strict:
                raise UnknownEventTypeError(topic)
            return
        event_type, problem = self.catalog.check(topic, parse_json(body, "payload"))
        if event_type is None and self.settings.event_catalog_strict:
            raise UnknownEventTypeError(topic)
        if problem is None:
            return
        if self.settings.event_validation == "refuse":
            raise PayloadSchemaError(topic, problem.path, problem.message)
        log.warning(
            "harvest: the payload of %r does not match its event type's schema %s; sent anyway "
            "(HARVEST_EVENT_VALIDATION is 'warn')",
            topic,
            problem,
        )

    # -- the outbox relay ----------------------------------------------------------------------

    def relay_outbox(self, message_ids: Sequence[str] | None = None, *, limit: int = 500) -> RelayReport:
        """Relay committed outbox messages (``message_ids``, or the oldest waiting) into deliveries.

        Messages are claimed first, so concurrent relays take disjoint ones. A delivery that
        already exists is not logged again; one that has no result yet is queued (again, with
        the same id); the message is marked relayed once all of its deliveries are logged and
        queued. A failure leaves it in the outbox for the next relay, its claim released.

        :raises Exception: what a delegate raised (any error that is not a :class:`HarvestError`),
            after the claims were released.
        """
        if self.outbox is None:
            return RelayReport(0, 0)
        messages = self.outbox.claim(
            now=utcnow(), lease_seconds=self.settings.webhooks_lease_seconds, limit=limit, ids=message_ids
        )
        if not messages:
            return RelayReport(0, 0)
        try:
            self._relay(messages)
        except BaseException as exc:
            # Released on every path: a message left claimed waits out its lease before any relay
            # may take it again. A foreign error's text may hold anything: only its type is stored.
            self.outbox.release(messages, str(exc) if isinstance(exc, HarvestError) else type(exc).__name__)
            if not isinstance(exc, HarvestError):
                raise
            log.warning("harvest: relay of %d outbox message(s) failed (%s); will retry", len(messages), exc)
            return RelayReport(0, len(messages))
        self.outbox.mark_relayed(messages, now=utcnow())
        return RelayReport(len(messages), 0)

    def _relay(self, messages: Sequence[OutboxMessage]) -> None:
        # Only the subscriptions of the batch's topics, from the topic index: one lookup per tenant
        # of the batch, so a message reaches its own tenant's subscriptions only.
        by_tenant: dict[str | None, list[OutboxMessage]] = {}
        for message in messages:
            by_tenant.setdefault(message.tenant, []).append(message)
        matched = {
            tenant: self.store.subscriptions_for_topics([m.topic for m in batch], tenant=tenant)
            for tenant, batch in by_tenant.items()
        }
        now = utcnow()
        built = (
            self._delivery(
                m.topic,
                m.payload,
                payload,
                s,
                now,
                outbox_delivery_id(m.id, s.id),
                m.trace_context,
                m.ordering_key,
                m.ordering_seq,
            )
            for m, payload in ((m, _decoder(m.payload)) for m in messages)
            for s in matched[m.tenant][m.topic]
        )
        deliveries = [delivery for delivery in built if delivery is not None]
        subscriptions = {
            s.id: s for by_topic in matched.values() for found in by_topic.values() for s in found
        }
        inserted = set(self.store.log_deliveries(deliveries))
        pending_ids = [d.id for d in deliveries if d.state is DeliveryState.PENDING]
        # Stored rows, not the ones built above: a delivery that already has a result is done.
        waiting = [
            d
            for d in self.store.get_deliveries(pending_ids)
            if d.state is DeliveryState.PENDING and d.attempt == 1 and d.last_error is None
        ]
        self._hand_over(self._needing_jobs(waiting), subscriptions)
        self._report_skipped([d for d in deliveries if d.id in inserted])

    def _relay_soon(self, message_ids: list[str]) -> None:
        """After a commit: relay these messages on a background thread (the sweeper backs it up)."""
        self._relay_executor.get().submit(self._relay_quietly, message_ids)

    def _relay_quietly(self, message_ids: list[str]) -> None:
        try:
            self.relay_outbox(message_ids)
        except Exception:  # the sweeper relays it later; a background thread has no caller
            log.exception("harvest: relay after commit failed; the sweeper will relay %s", message_ids)

    def close(self) -> None:
        """Wait for relays started after commits, and stop their thread."""
        executor = self._relay_executor.take()
        if executor is not None:
            executor.shutdown(wait=True)

    # -- shared steps --------------------------------------------------------------------------

    def _delivery(
        self,
        topic: str,
        body: str,
        payload: Callable[[], Any],
        subscription: WebhookSubscription,
        now: datetime,
        delivery_id: str,
        trace_context: str | None = None,
        ordering_key: str | None = None,
        ordering_seq: int | None = None,
    ) -> DeliveryLog | None:
        """The delivery of one event to one subscription of its topic, or ``None`` when the
        subscription's payload filter does not hold on the event's payload, or when it is the
        operational endpoint's (it is sent notifications only): the one place both dispatch and
        the outbox relay decide that."""
        # The operational endpoint takes only the notifications addressed to it, never a fan-out.
        if not subscription.wants(payload) or subscription.id == OPERATIONAL_SUBSCRIPTION_ID:
            return None
        active = subscription.is_active
        return DeliveryLog(
            id=delivery_id,
            subscription_id=subscription.id,
            topic=topic,
            payload=body,
            state=DeliveryState.PENDING if active else DeliveryState.SKIPPED,
            max_attempts=self.settings.webhooks_max_attempts,
            last_error=None if active else f"subscription is {subscription.status.value}",
            timestamp=now,
            next_attempt_at=now if active else None,
            created_at=now,
            trace_context=trace_context,
            ordering_key=ordering_key,
            ordering_seq=ordering_seq,
            tenant=subscription.tenant,
        )

    def _report_skipped(self, deliveries: Sequence[DeliveryLog]) -> None:
        skipped = [d for d in deliveries if d.state is DeliveryState.SKIPPED]
        if skipped and self._on_skipped is not None:
            self._on_skipped(skipped)

    def _needing_jobs(self, pending: list[DeliveryLog]) -> list[DeliveryLog]:
        """The deliveries of ``pending`` to hand over: all of them to a delegate; to the job
        backend, those not waiting behind an earlier delivery of their key."""
        if self.delegate is not None:
            return pending
        keyed = [d.id for d in pending if d.ordering_key is not None]
        # A delivery behind an earlier one of its key gets no job: it would claim nothing. The one
        # ahead queues it as it finishes; should they cross (it finished before this commit was
        # visible to it), the sweeper's scan of due heads queues it.
        waiting = self.store.waiting_in_line(keyed) if keyed else set()
        return [d for d in pending if d.id not in waiting]

    def hand_over_logged(self, deliveries: Sequence[DeliveryLog]) -> None:
        """Send deliveries already logged and due (a replay, a test event) the way a dispatch
        sends its own: to the delegate when there is one (it owns the app's deliveries, and the
        sweeper queues none for it), else as jobs.

        :raises JobBackendError: the jobs could not be queued (the rows stay due: the sweeper
            queues them later).
        """
        # The operational endpoint's notifications are the workers' to send even with a delegate
        # (as those an outcome logs are), so its test takes the road the real ones take.
        queued: list[DeliveryLog] = []
        delegated: list[DeliveryLog] = []
        for delivery in deliveries:
            by_workers = self.delegate is None or delivery.subscription_id == OPERATIONAL_SUBSCRIPTION_ID
            (queued if by_workers else delegated).append(delivery)
        if queued:
            self.backend.enqueue([delivery_job(d) for d in queued])
        if not delegated:
            return
        wanted = {d.subscription_id for d in delegated}
        found = {s.id: s for s in (self.store.get_subscription(i) for i in wanted) if s is not None}
        # A subscription deleted meanwhile has nobody to send to; its row stays as it is.
        self._hand_over([d for d in delegated if d.subscription_id in found], found)

    def _hand_over(
        self, deliveries: list[DeliveryLog], subscriptions: dict[str, WebhookSubscription]
    ) -> None:
        """Give each delivery to the delegate, or queue its job (:meth:`_needing_jobs` chose them)."""
        if self.delegate is not None:
            for delivery in deliveries:
                # A delegate error reaches the caller as it is, and the row is not dead-lettered.
                self.delegate(delivery, subscriptions[delivery.subscription_id])
            return
        self.backend.enqueue([delivery_job(d) for d in deliveries])
