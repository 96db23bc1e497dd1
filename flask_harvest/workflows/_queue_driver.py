"""How jobs drive queued runs: the runner's side of workflow queues.

A queued run is never claimed by its own id. A job for one (its start's, a wake-up's, the
sweeper's) is a claim attempt on the run's queue: it takes the best eligible due run of that queue,
which may be another run; a job whose run is not eligible does nothing, and its run waits. What
frees a slot gives the queue another attempt once it has committed: a queued run's end (a terminal
hook, :meth:`QueueDriver.on_terminal`), its sleep (:meth:`QueueDriver.nudge`), and, as the
backstop for an attempt lost with a worker or with Redis, the sweeper's due scan, which queues a
job for every due run that has none. A rate limit that held runs back schedules the next attempt
for when its window frees a start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from functools import partial

from sqlalchemy import Connection

from ..jobs.base import JobBackend, JobRef
from ..jobs.requeue import requeue_missing
from .hooks import after_commit
from .models import Execution
from .queues import QueueSpec, QueueTable
from .store import SqlWorkflowStore

__all__ = ["QueueDriver"]

logger = logging.getLogger(__name__)

#: The queued run the current thread runs and, once it ends or sleeps, claims the next one after:
#: its end needs no other claim attempt.
_CONTINUING: ContextVar[str | None] = ContextVar("harvest_queue_continuing", default=None)

#: Queues a job: ``schedule(execution_id, due)`` (``None``: now).
Schedule = Callable[[str, "datetime | None"], None]
#: The most claim attempts one sweep gives one queue.
_SWEEP_ATTEMPTS = 100


class QueueDriver:
    """Claims queued runs for the runner and gives queues their next claim attempts."""

    def __init__(
        self,
        store: SqlWorkflowStore,
        queues: QueueTable,
        *,
        clock: Callable[[], datetime],
        lease_seconds: float,
        schedule: Schedule,
        alone: bool = False,
    ) -> None:
        self.store = store
        # Claims mark their runs as run alone: the runner runs one run at a time.
        self.alone = alone
        self.queues = queues
        self.clock = clock
        self.lease_seconds = lease_seconds
        self.schedule = schedule
        self._warned: set[str] = set()

    def spec(self, queue_name: str) -> QueueSpec:
        """The queue's limits; a queue this process does not know is run without queue-wide
        limits (its runs' key limits still hold), so its runs are never stuck behind a missing
        declaration."""
        spec = self.queues.get(queue_name)
        if spec is not None:
            return spec
        if queue_name not in self._warned:
            self._warned.add(queue_name)
            logger.warning(
                "workflow queue %r is not declared in this process: its runs are claimed without "
                "its concurrency and rate limits; declare it in every worker",
                queue_name,
            )
        return QueueSpec(queue_name)

    def after_miss(self, execution_id: str, now: datetime) -> Execution | None:
        """For a job whose run was not claimed by its id: see :meth:`after_misses`."""
        claimed = self.after_misses([execution_id], now)
        return claimed[0] if claimed else None

    def after_misses(self, execution_ids: Sequence[str], now: datetime) -> list[Execution]:
        """For jobs whose runs were not claimed by their ids: each queued, due, waiting run's job
        claims the best eligible run of its queue (one claim per job, a queue's claims in one
        transaction); a run not due yet gets its job again for its due time. Returns the runs
        claimed, at most one per job."""
        waiting: dict[str, list[str]] = {}
        for row in self.store.pending_rows(execution_ids):
            if row.next_run_at is not None and row.next_run_at > now:
                # A job that fired before the row's wake time (a backend that runs scheduled jobs
                # early, or clocks that differ between hosts) would otherwise leave it to the sweeper.
                self.schedule(row.execution_id, row.next_run_at)
            elif row.queue_name is not None:
                waiting.setdefault(row.queue_name, []).append(row.execution_id)
        claimed: list[Execution] = []
        for queue_name, ids in waiting.items():
            result = self.store.claim_queued(
                self.spec(queue_name),
                count=len(ids),
                clock=self.clock,
                lease_seconds=self.lease_seconds,
                alone=self.alone,
            )
            claimed.extend(result.claimed)
            if result.retry_at is not None:
                self.schedule(ids[0], result.retry_at)
        return claimed

    @contextmanager
    def continuing(self, execution_id: str) -> Iterator[None]:
        """Mark ``execution_id`` as run by this thread, which claims its queue's next run after it."""
        token = _CONTINUING.set(execution_id)
        try:
            yield
        finally:
            _CONTINUING.reset(token)

    def claim_next(self, queue_name: str) -> Execution | None:
        """Claim the best eligible due run of a queue for this thread, or ``None``; a rate limit
        that held runs back schedules the queue's next attempt."""
        result = self.store.claim_queued(
            self.spec(queue_name),
            count=1,
            clock=self.clock,
            lease_seconds=self.lease_seconds,
            alone=self.alone,
        )
        if result.retry_at is not None:
            waiting = self.store.waiting(queue_name, now=self.clock(), limit=1)
            if waiting:
                self.schedule(waiting[0], result.retry_at)
        return result.claimed[0] if result.claimed else None

    def released(self, execution: Execution) -> None:
        """A run stopped without ending (a sleep): give its queue an attempt, unless this thread
        claims the next run itself."""
        if execution.queue_name is not None and _CONTINUING.get() != execution.execution_id:
            self.nudge(execution.queue_name)

    def nudge(self, queue_name: str) -> None:
        """Give a queue a claim attempt: queue the job of its best due waiting run."""
        try:
            waiting = self.store.waiting(queue_name, now=self.clock(), limit=1)
        except Exception:
            logger.warning(
                "could not look at workflow queue %r; the sweeper covers it", queue_name, exc_info=True
            )
            return
        if waiting:
            self.schedule(waiting[0], None)

    def sweep(self, backend: JobBackend, job: Callable[[str], JobRef], *, now: datetime) -> int:
        """The backstop of lost claim attempts: for each queue with runs due at ``now``, queue a job
        for as many of its best waiting runs as it has free slots (and none it has a live job for).

        :param job: the job of a run, due now.

        :returns: how many jobs were queued.
        """
        queued = 0
        for queue_name in self.store.due_queues(now=now):
            spec = self.spec(queue_name)
            counts = self.store.queue_counts(queue_name, now=now, cap=_SWEEP_ATTEMPTS)
            room = _SWEEP_ATTEMPTS if spec.concurrency is None else spec.concurrency - counts.running
            room = min(room, counts.due, _SWEEP_ATTEMPTS)
            if room <= 0:
                continue
            ids = self.store.waiting(queue_name, now=now, limit=room)
            queued += len(requeue_missing(backend, [job(i) for i in ids]))
        return queued

    def on_terminal(self, conn: Connection, execution: Execution) -> None:
        """The terminal hook: a queued run's end frees its slot, so its queue gets an attempt once
        the end has committed."""
        if execution.queue_name is not None and _CONTINUING.get() != execution.execution_id:
            after_commit(conn, partial(self.nudge, execution.queue_name))
