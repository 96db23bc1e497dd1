"""The sweeper: SQL is the source of truth, so rebuild the job queue from it.

It frees deliveries whose lease expired (the worker died mid-attempt) and queues again those that
are due but have no live job (Redis lost its data, an enqueue was lost, a process died between
logging and queueing). Running it more often, or in several processes at once, is harmless: the
claim decides who sends.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from datetime import timedelta

from ..jobs.base import JobBackend
from .manager import RelayReport
from .models import utcnow
from .stores.base import OutboundWebhookHandler

log = logging.getLogger("flask_harvest")


@dataclass(frozen=True)
class SweepReport:
    """What one sweep did."""

    #: Deliveries whose expired lease was released.
    released: int
    #: Deliveries queued again because no job was waiting for them.
    requeued: int
    #: Outbox messages relayed by this sweep (their after-commit relay never ran or failed).
    relayed: int = 0
    #: Outbox messages whose relay failed; they are tried again at the next sweep.
    relay_failed: int = 0

    def with_relay(self, relay: RelayReport) -> SweepReport:
        """Return this report with the outbox relay's counts added."""
        return dataclasses.replace(self, relayed=relay.relayed, relay_failed=relay.failed)


def sweep(
    store: OutboundWebhookHandler,
    backend: JobBackend,
    *,
    grace_seconds: float = 2.0,
    batch: int = 1000,
    requeue: bool = True,
) -> SweepReport:
    """Run one sweep and return what it did.

    :param grace_seconds: leave alone rows that became due less than this long ago; their job
        is most likely on its way (the scheduler moves due jobs about once a second).
    :param batch: the most rows looked at in one sweep.
    :param requeue: queue due deliveries that have no job; off when a delegate owns delivery.
    """
    now = utcnow()
    released = store.release_expired_leases(now=now)
    if not requeue:
        return SweepReport(released=len(released), requeued=0)
    due_ids = store.due_deliveries(now=now - timedelta(seconds=grace_seconds), limit=batch)
    candidates = store.get_deliveries(sorted(set(due_ids) | set(released)))
    live = backend.live_jobs(candidates)
    orphans = [d for d in candidates if d.id not in live]
    backend.enqueue(orphans)
    if released or orphans:
        log.warning(
            "harvest: sweep released %d expired lease(s) and requeued %d delivery(ies)",
            len(released),
            len(orphans),
        )
    return SweepReport(released=len(released), requeued=len(orphans))
