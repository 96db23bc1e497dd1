"""The ``local`` backend: jobs on threads inside this process. Not durable.

Jobs live in process memory: a process that exits or crashes loses its queue (rows stay in the
store as ``PENDING``; with a SQL store, the sweeper of the next process or of an RQ worker runs
them). It is the default so that a new app works without Redis; production uses ``rq``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from .._threads import PerProcess
from .._time import utcnow
from .base import JobBackend, JobBackendError, JobRef

log = logging.getLogger(__name__)


class LocalBackend(JobBackend):
    """A thread pool for jobs due now, and one timer thread for jobs due later and for sweeps.

    :param run: runs one job on a pool thread (the extension pushes the app context around it).
    :param workers: pool threads, i.e. jobs running at once.
    :param periodic: called every ``interval`` seconds on the timer thread (the sweeper).
    """

    durable = False
    # join() and close() wait for the jobs this backend runs: a job must not return early.
    allows_hand_off = False

    def __init__(
        self,
        run: Callable[[JobRef], object],
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
        self._timers: list[tuple[float, int, JobRef]] = []
        self._seq = itertools.count()
        self._waiting: Counter[JobRef] = Counter()  # jobs queued, scheduled or running
        self._busy = 0
        self._closed = False
        self._executor = PerProcess(
            lambda: ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="harvest-local")
        )
        self._timer = PerProcess(self._start_timer)

    def __repr__(self) -> str:
        return f"<LocalBackend workers={self._workers}>"

    def _start_timer(self) -> threading.Thread:
        thread = threading.Thread(target=self._tick, name="harvest-local-timer", daemon=True)
        thread.start()
        return thread

    def _check_open(self) -> None:
        if self._closed:
            raise JobBackendError("the local job backend was shut down")
        self._timer.get()

    def enqueue(self, refs: Sequence[JobRef]) -> None:
        with self._lock:
            self._check_open()
            for ref in refs:
                self._waiting[ref] += 1
                self._submit(ref)

    def _submit(self, ref: JobRef) -> None:
        self._executor.get().submit(self._work, ref)

    def schedule(self, ref: JobRef, *, at_front: bool = False) -> None:
        # Due jobs start on the executor as they come due: no queue for a backlog to form in.
        now = utcnow()
        delay = max(0.0, ((ref.due or now) - now).total_seconds())
        with self._lock:
            self._check_open()
            self._waiting[ref] += 1
            heapq.heappush(self._timers, (time.monotonic() + delay, next(self._seq), ref))
            self._lock.notify_all()

    def start_sweeping(self) -> None:
        # Scheduled workflows need sweeps before any job exists: they are what starts the first.
        with self._lock:
            self._check_open()

    def live_jobs(self, refs: Sequence[JobRef]) -> set[JobRef]:
        with self._lock:
            return {ref for ref in refs if ref in self._waiting}

    def join(self, timeout: float = 30.0) -> bool:
        """Wait until no job is queued or running (scheduled ones don't count).

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
        """Stop after the jobs that are running; queued and scheduled ones are dropped (their rows
        stay in the store for a sweeper).

        Waits up to ``timeout`` seconds, so no job holds a database connection after.
        """
        with self._lock:
            self._closed = True
            self._timers.clear()
            self._lock.notify_all()
        end = time.monotonic() + timeout
        # A sweep in progress on the timer thread finishes first: it may hold a connection.
        timer = self._timer.take()
        if timer is not None and timer is not threading.current_thread():
            timer.join(timeout)
        executor = self._executor.take()
        if executor is None:
            return
        executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            while self._busy and time.monotonic() < end:
                self._lock.wait(min(0.05, max(0.0, end - time.monotonic())))

    def _work(self, ref: JobRef) -> None:
        with self._lock:
            self._busy += 1
        try:
            self._run(ref)
        except Exception:
            log.exception("harvest: local job %s failed", ref.job_id)
        finally:
            with self._lock:
                self._busy -= 1
                self._waiting[ref] -= 1
                if self._waiting[ref] <= 0:
                    del self._waiting[ref]
                self._lock.notify_all()

    def _tick(self) -> None:
        next_sweep = time.monotonic() + self._interval
        while True:
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    _, _, ref = heapq.heappop(self._timers)
                    self._submit(ref)
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
