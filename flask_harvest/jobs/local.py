"""The ``local`` backend: delivery attempts on threads inside this process. Not durable.

Jobs live in process memory: a process that exits or crashes loses its queue (rows stay in the
store as ``PENDING``; with a SQL store, the sweeper of the next process or of an RQ worker sends
them). It is the default so that a new app works without Redis, as the seed's
``jobs.backend = "local"``; production uses ``rq``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

from ..webhooks.models import DeliveryLog
from .base import JobBackend, JobBackendError

log = logging.getLogger("flask_harvest")


class LocalBackend(JobBackend):
    """A pool of daemon threads fed by a queue, plus one timer thread for retries and sweeps.

    :param run: called with a delivery id on a pool thread (it pushes the app context).
    :param workers: number of pool threads, i.e. attempts in flight at once.
    :param periodic: called every ``interval`` seconds on the timer thread (the sweeper).
    """

    durable = False

    def __init__(
        self,
        run: Callable[[str], object],
        *,
        workers: int,
        periodic: Callable[[], object] | None = None,
        interval: float = 5.0,
    ) -> None:
        self._run = run
        self._workers = workers
        self._periodic = periodic
        self._interval = interval
        self._lock = threading.Condition()
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._timers: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._waiting: Counter[str] = Counter()  # jobs queued, scheduled or running, per delivery
        self._busy = 0
        self._pid: int | None = None
        self._closed = False
        self._threads: list[threading.Thread] = []

    def __repr__(self) -> str:
        return f"<LocalBackend workers={self._workers}>"

    def _start(self) -> None:
        # Lazily, and again in a forked child (e.g. gunicorn with --preload): threads don't fork.
        if self._pid == os.getpid():
            return
        if self._closed:
            raise JobBackendError("the local job backend was shut down")
        self._pid = os.getpid()
        self._threads = [
            threading.Thread(target=self._work, name=f"harvest-local-{number}", daemon=True)
            for number in range(self._workers)
        ]
        self._threads.append(threading.Thread(target=self._tick, name="harvest-local-timer", daemon=True))
        for thread in self._threads:
            thread.start()

    def enqueue(self, deliveries: Sequence[DeliveryLog]) -> None:
        with self._lock:
            self._start()
            for delivery in deliveries:
                self._waiting[delivery.id] += 1
                self._queue.put(delivery.id)

    def schedule(self, delivery: DeliveryLog) -> None:
        due = delivery.next_attempt_at or datetime.now(timezone.utc)
        delay = max(0.0, (due - datetime.now(timezone.utc)).total_seconds())
        with self._lock:
            self._start()
            self._waiting[delivery.id] += 1
            heapq.heappush(self._timers, (time.monotonic() + delay, next(self._seq), delivery.id))
            self._lock.notify_all()

    def live_jobs(self, deliveries: Sequence[DeliveryLog]) -> set[str]:
        with self._lock:
            return {d.id for d in deliveries if d.id in self._waiting}

    def join(self, timeout: float = 30.0) -> bool:
        """Wait until no attempt is queued or running (scheduled retries don't count).

        Returns whether that happened within ``timeout`` seconds. For tests and scripts.
        """
        end = time.monotonic() + timeout
        with self._lock:
            while self._busy or sum(self._waiting.values()) > len(self._timers):
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(min(remaining, 0.05))
            return True

    def close(self, timeout: float = 30.0) -> None:
        """Stop the threads after the attempts they are making; queued jobs are dropped.

        Waits up to ``timeout`` seconds in all, so no attempt holds a database connection after.
        """
        with self._lock:
            self._closed = True
            while not self._queue.empty():  # drop what is queued: the rows stay PENDING
                self._queue.get_nowait()
            for _ in range(self._workers):
                self._queue.put(None)
            self._lock.notify_all()
            threads = self._threads if self._pid == os.getpid() else []
        end = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, end - time.monotonic()))

    def _work(self) -> None:
        while True:
            delivery_id = self._queue.get()
            if delivery_id is None:
                return
            with self._lock:
                self._busy += 1
            try:
                self._run(delivery_id)
            except Exception:
                log.exception("harvest: local delivery job %s failed", delivery_id)
            finally:
                with self._lock:
                    self._busy -= 1
                    self._waiting[delivery_id] -= 1
                    if self._waiting[delivery_id] <= 0:
                        del self._waiting[delivery_id]
                    self._lock.notify_all()

    def _tick(self) -> None:
        next_sweep = time.monotonic() + self._interval
        while True:
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    _, _, delivery_id = heapq.heappop(self._timers)
                    self._queue.put(delivery_id)
                wake = min(next_sweep, self._timers[0][0] if self._timers else next_sweep)
                self._lock.wait(max(0.0, wake - now))
                if self._closed:
                    return
            if self._periodic is not None and time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + self._interval
                try:
                    self._periodic()
                except Exception:
                    log.exception("harvest: sweep failed; will try again in %s s", self._interval)
