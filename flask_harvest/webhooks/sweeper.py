"""The webhook steps of the sweeper (:class:`flask_harvest.sweeper.Sweeper`).

Deliveries: free those whose lease expired (the worker died mid-attempt) and queue again those
that are due but have no live job (Redis lost its data, an enqueue was lost, a process died
between logging and queueing). The outbox: relay committed messages whose after-commit relay never
ran, and purge relayed ones past their retention.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from .._time import utcnow
from ..errors import HarvestError
from ..jobs.base import JobBackend
from ..jobs.requeue import requeue_missing
from ..sweeper import SweepReport
from .delivery import delivery_job
from .manager import OutboundWebhookManager
from .stores.base import OutboundWebhookHandler

log = logging.getLogger(__name__)


def sweep(
    store: OutboundWebhookHandler,
    backend: JobBackend,
    *,
    grace_seconds: float = 2.0,
    batch: int = 1000,
    requeue: bool = True,
) -> SweepReport:
    """Free expired delivery leases and requeue due deliveries without a job; return what it did.

    :param grace_seconds: leave alone rows that became due less than this long ago; their job
        is most likely on its way (the scheduler moves due jobs about once a second).
    :param batch: the most rows looked at in one sweep.
    :param requeue: queue due deliveries that have no job; off when a delegate owns delivery.
    """
    now = utcnow()
    released = store.release_expired_leases(now=now)
    if not requeue:
        return SweepReport(released=len(released))
    due_ids = store.due_deliveries(now=now - timedelta(seconds=grace_seconds), limit=batch)
    candidates = store.get_schedules(sorted(set(due_ids) | set(released)))
    orphans = requeue_missing(backend, [delivery_job(d) for d in candidates])
    if released or orphans:
        log.warning(
            "harvest: sweep released %d expired lease(s) and requeued %d delivery(ies)",
            len(released),
            len(orphans),
        )
    return SweepReport(released=len(released), requeued=len(orphans))


def relay_outbox(manager: OutboundWebhookManager, retention_seconds: float) -> SweepReport:
    """Relay outbox messages whose relay never ran, then purge relayed ones past ``retention_seconds``."""
    outbox = manager.outbox
    if outbox is None:
        return SweepReport()
    try:
        relay = manager.relay_outbox()
        outbox.purge_relayed_before(utcnow() - timedelta(seconds=retention_seconds))
    except HarvestError as exc:
        # The outbox table may be missing (a deploy whose migration has not run yet): that is no
        # reason to report the whole sweep as failed, and the delivery step runs regardless.
        log.error("harvest: outbox relay failed (%s); sweeping deliveries anyway", exc)
        return SweepReport()
    return SweepReport(relayed=relay.relayed, relay_failed=relay.failed)
