"""Telling the operational endpoint when a subscription's rate limit holds its deliveries back long.

The delivery runner tells :class:`HoldWatch` of every delivery its rate limit holds
(:meth:`~flask_harvest.webhooks.delivery.DeliveryRunner.held_back`). The watch counts the holds
in episodes (:mod:`flask_harvest.outbound.holds`), shared by every worker process through Redis
with the ``rq`` backend, and once an episode spans ``HARVEST_OPERATIONAL_RATE_LIMIT_HOLD_SECONDS``
it logs one ``harvest.subscription.rate_limited`` notification and queues it: an ordinary delivery
to the reserved subscription, signed and retried like the others.

A hold is not a transition of a row, so there is no transaction to write the notification in:
if the episode is counted but the row cannot be written (the database is down at that moment),
that episode goes untold and a warning is logged. A notification is never made twice for one
episode.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import redis

from .._time import utcnow
from ..config import Settings
from ..errors import StoreError
from ..jobs.base import JobBackend, JobBackendError
from ..outbound.hold_episodes import HoldEpisodes
from ..outbound.rate import MICROS
from . import operational
from .delivery import delivery_job
from .models import Claim
from .stores.base import OutboundWebhookHandler

log = logging.getLogger(__name__)

__all__ = ["HoldWatch"]


def _at(micros: int) -> datetime:
    return datetime.fromtimestamp(micros / MICROS, timezone.utc)


class HoldWatch:
    """Counts rate-limit holds per subscription and tells the operational endpoint of long ones.

    :param episodes: where the episodes live (Redis for the ``rq`` backend, else this process).
    """

    def __init__(
        self, store: OutboundWebhookHandler, backend: JobBackend, settings: Settings, episodes: HoldEpisodes
    ) -> None:
        self.store = store
        self.backend = backend
        self.settings = settings
        self.episodes = episodes

    @staticmethod
    def wanted(settings: Settings) -> bool:
        """Whether these settings ask for the watch: an operational endpoint and a threshold."""
        return operational.enabled(settings) and settings.operational_rate_limit_hold_seconds > 0

    def __call__(self, claim: Claim, seconds: float) -> None:
        """``claim`` is held ``seconds`` by its subscription's rate limit."""
        subscription = claim.subscription
        if subscription is None or claim.delivery.subscription_id == operational.OPERATIONAL_SUBSCRIPTION_ID:
            return  # the endpoint's own deliveries never notify (no loop)
        threshold = self.settings.operational_rate_limit_hold_seconds
        try:
            # The gap is the threshold too: a backlog that drains and comes back within it is
            # the same episode, so one flapping around its limit is told at most once a period.
            episode = self.episodes.note(subscription.id, seconds, threshold=threshold, gap=threshold)
        except redis.RedisError as exc:
            log.warning("harvest: could not count the rate-limit hold of %s (%s)", subscription.id, exc)
            return
        if episode is None:
            return
        notice = operational.held_notice(
            claim,
            self.settings,
            held_since=_at(episode.since),
            held_until=_at(episode.until),
            now=utcnow(),
        )
        if notice is None:
            return
        try:
            self.store.log_deliveries([notice])
        except StoreError as exc:
            log.warning(
                "harvest: could not log the rate-limit notification of %s (%s); this episode goes untold",
                subscription.id,
                exc,
            )
            return
        log.warning(
            "harvest: subscription %s has been held back by its rate limit for %.0f s or more",
            subscription.id,
            episode.span / MICROS,
        )
        try:
            self.backend.enqueue([delivery_job(notice)])
        except JobBackendError as exc:
            # The row is PENDING and due: the sweeper queues it when the backend is back.
            log.warning("harvest: could not queue the rate-limit notification (%s); the sweeper will", exc)
