"""Attempts in flight inside one worker process, with a cap per subscription.

RQ hands a worker one job at a time. A delivery job only claims its row (a few milliseconds) and
passes the attempt to this pool, so one process keeps many slow receivers in flight at once. The
cap per subscription keeps a slow or dead endpoint from taking every slot: past it, a delivery is
given back unsent (no attempt used) and comes round again later, while other endpoints' deliveries
go ahead.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar

from ..webhooks.delivery import DeliveryRunner
from ..webhooks.models import Claim, DeliveryState

log = logging.getLogger("flask_harvest")
_current: ContextVar[DeliveryPool | None] = ContextVar("harvest_delivery_pool", default=None)


def current_pool() -> DeliveryPool | None:
    """Return the pool of the worker running the current job, if it has one."""
    return _current.get()


class DeliveryPool:
    """A bounded thread pool for delivery attempts.

    :param runner: makes the attempts.
    :param size: attempts in flight at once in this process.
    :param per_subscription: attempts in flight at once for one subscription in this process.
    :param context: wraps each attempt (the worker pushes the Flask app context with it).
    """

    def __init__(
        self,
        runner: DeliveryRunner,
        *,
        size: int,
        per_subscription: int,
        context: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        self.runner = runner
        self.size = size
        self.per_subscription = per_subscription
        self._context = context
        self._cond = threading.Condition()
        self._busy = 0
        self._by_subscription: Counter[str] = Counter()
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="harvest-attempt")

    @contextmanager
    def active(self) -> Iterator[None]:
        """Make this the pool that delivery jobs in this context hand their attempts to."""
        token = _current.set(self)
        try:
            yield
        finally:
            _current.reset(token)

    def wait_for_slot(self) -> None:
        """Block until an attempt slot is free (the worker calls it before taking the next job)."""
        with self._cond:
            while self._busy >= self.size:
                self._cond.wait()

    def deliver(self, delivery_id: str) -> DeliveryState | None:
        """Claim ``delivery_id`` and start its attempt on the pool; return at once.

        Waits for a free slot *before* claiming, so a claim's lease never ticks while it queues;
        the worker waits for one before it even takes the job (:meth:`wait_for_slot`), so a job
        is never left half-started by a killed worker for long.
        Returns ``PENDING`` if the delivery was deferred for its subscription's cap, ``INFLIGHT``
        if its attempt started, ``None`` if there was nothing to do.
        """
        with self._cond:
            while self._busy >= self.size:
                self._cond.wait()
            self._busy += 1
        claim = None
        try:
            claim = self.runner.claim(delivery_id)
        finally:
            if claim is None:
                self._release(None)
        if claim is None:
            return None
        subscription_id = claim.delivery.subscription_id
        with self._cond:
            crowded = self._by_subscription[subscription_id] >= self.per_subscription
            if not crowded:
                self._by_subscription[subscription_id] += 1
        if crowded:
            self._release(None)
            self.runner.defer(claim, self._defer_seconds(claim))
            return DeliveryState.PENDING
        self._executor.submit(self._attempt, claim)
        return DeliveryState.INFLIGHT

    def _defer_seconds(self, claim: Claim) -> float:
        # A failing endpoint frees its slots about once per deadline; a healthy busy one within a
        # second. Jitter keeps deferred deliveries from coming back together.
        failing = claim.subscription is not None and claim.subscription.consecutive_failures > 0
        base = self.runner.settings.webhooks_deadline_seconds if failing else 1.0
        return base * random.uniform(0.5, 1.5)  # noqa: S311 (spreading load, not security)

    def _attempt(self, claim: Claim) -> None:
        try:
            if self._context is None:
                self.runner.attempt(claim)
            else:
                with self._context():
                    self.runner.attempt(claim)
        except Exception:
            # The lease runs out and the sweeper hands the delivery to another attempt.
            log.exception("harvest: attempt of delivery %s failed", claim.delivery.id)
        finally:
            self._release(claim.delivery.subscription_id)

    def _release(self, subscription_id: str | None) -> None:
        with self._cond:
            self._busy -= 1
            if subscription_id is not None:
                self._by_subscription[subscription_id] -= 1
                if self._by_subscription[subscription_id] <= 0:
                    del self._by_subscription[subscription_id]
            self._cond.notify()

    def shutdown(self, wait: bool = True) -> None:
        """Stop taking attempts; with ``wait``, let those in flight finish (at most one deadline)."""
        self._executor.shutdown(wait=wait)
