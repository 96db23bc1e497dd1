"""The worker process's RQ worker: each job in the Flask app's context, routed by kind of work."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import redis
from flask import Flask
from rq import Queue, SimpleWorker
from rq.job import Job
from rq.worker import WorkerStatus

from .._app import get_engine
from ..jobs.rq import BATCH_TASK, TASK, take_jobs
from ..jobs.tasks import running_kinds
from ..webhooks.delivery import WEBHOOK_JOB
from .pool import DeliveryPool

log = logging.getLogger(__name__)

# How often the worker tells RQ it is alive while it hands deliveries to its pool without
# dequeueing (RQ's own loop does it per job; its worker key lives ``worker_ttl``, 420 s, by default).
_HEARTBEAT_SECONDS = 10.0
# How long the thread that hears RQ's worker commands waits for one before it looks whether the
# worker is stopping: the most a stop waits for that thread (RQ 1.x's own listener used 0.2 s too;
# an idle wake costs one poll() call).
_LISTEN_SECONDS = 0.2
# How long that thread waits after Redis failed under it before it listens again.
_RELISTEN_SECONDS = 2.0


class _CommandListener:
    """Hears RQ's worker commands (:mod:`rq.command`: shut down, stop a job) on the worker's
    channel, on a thread that a stop ends within ``_LISTEN_SECONDS``.

    RQ's own listener, redis-py's ``PubSub.run_in_thread``, waits up to 60 s for each message,
    and RQ ends it by unsubscribing first: when that thread reads the unsubscribe reply before it
    is told to stop, it waits the 60 s for a subscription that never comes, and the redis-py
    versions whose ``stop()`` joins the thread hold the worker's exit that long. This one is told
    to stop first, sends no UNSUBSCRIBE (closing the connection ends the subscription) and never
    waits longer than ``_LISTEN_SECONDS``, on every redis-py and RQ version.
    """

    def __init__(
        self, connection: redis.Redis, channel: str, handler: Callable[[dict[str, Any]], object]
    ) -> None:
        self._pubsub = connection.pubsub()
        self._pubsub.subscribe(**{channel: handler})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="harvest-commands", daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                self._pubsub.get_message(ignore_subscribe_messages=True, timeout=_LISTEN_SECONDS)
            except Exception as exc:  # redis-py subscribes again when it reconnects
                log.warning("harvest: worker command channel failed (%s); listening again", exc)
                self._stop.wait(_RELISTEN_SECONDS)

    def stop(self) -> None:
        """End the thread (it may be running a command's handler: wait a while for it), then
        the subscription."""
        self._stop.set()
        self._thread.join(timeout=_LISTEN_SECONDS + _RELISTEN_SECONDS + 5)
        self._pubsub.close()


class HarvestWorker(SimpleWorker):
    """An RQ worker that runs each job inside the Flask app's context, in its own process.

    It never forks per job: a fork costs more than a delivery (see the deployment docs). Jobs run
    through the app engine's :class:`~flask_harvest.jobs.base.JobKinds`. With a ``pool``, webhook
    jobs go to the pool: the worker waits for a batch of free slots and takes the webhook jobs at
    the head of the queue that fit (:func:`~flask_harvest.jobs.rq.take_jobs`) without RQ running
    any of them; a webhook job that RQ dequeues (after waiting on an empty queue) takes those
    queued behind it the same way. The pool claims their rows in one statement, on one of its
    threads while this one goes on taking jobs, and keeps their attempts in flight. When it stops
    it lets the attempts in flight finish. It also runs ``periodic`` (the sweeper) every
    ``interval`` seconds on a background thread.
    """

    def __init__(
        self,
        *args: Any,
        app: Flask,
        pool: DeliveryPool | None = None,
        periodic: Callable[[], object] | None = None,
        interval: float = 5.0,
        on_stop: Callable[[], object] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.app = app
        self.pool = pool
        kinds = get_engine(app).jobs
        if pool is not None:
            # Every kind of outbound delivery goes to the pool, and so does a callback's fast path.
            for kind in sorted(pool.kinds):
                kinds = kinds.with_handler(
                    kind, partial(pool.submit_many, kind=kind), here=partial(pool.run_here, kind)
                )
        self._kinds = kinds
        self._periodic = periodic
        self._interval = interval
        self._on_stop = on_stop
        self._stopping = threading.Event()
        self._commands: _CommandListener | None = None

    def subscribe(self) -> None:
        # RQ calls it as the worker starts, and unsubscribe() as it ends (see _CommandListener).
        self._commands = _CommandListener(self.connection, self.pubsub_channel_name, self.handle_payload)

    def unsubscribe(self) -> None:
        if self._commands is not None:
            self._commands.stop()
            self._commands = None

    def request_stop(self, signum: Any, frame: Any) -> None:
        if self._on_stop is not None:
            self._on_stop()
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        if self.pool is not None:
            self._take_deliveries(self.pool)
            if self._stop_requested:
                return None  # RQ's loop ends the worker, as after a job
            self.pool.wait_for_slots()
        return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)

    def _take_deliveries(self, pool: DeliveryPool) -> None:
        """Hand the webhook jobs at the head of the queues straight to the pool, as many as it has
        free slots, until the head holds another kind of job or none.

        RQ runs no job for them: a batch costs one Redis round trip (:func:`take_jobs`) instead of
        RQ's job cycle (about 20 round trips and most of this thread's CPU when it ran a job per
        batch). As with the jobs a job takes behind it, a worker killed before its pool claims the
        rows leaves them due with no job, and the sweeper queues them again. While this loop runs
        the worker counts as busy, so a stop request lets it hand over what it took, then stops.
        """
        beat = time.monotonic()
        self.set_state(WorkerStatus.BUSY)
        while not self._stop_requested:
            pool.wait_for_slots()
            delivery_ids: list[str] = []
            for queue in self.queues:
                delivery_ids += take_jobs(queue, WEBHOOK_JOB, pool.free_slots() - len(delivery_ids))
            if not delivery_ids:
                return
            pool.submit_many(delivery_ids)
            if time.monotonic() - beat > _HEARTBEAT_SECONDS:
                beat = time.monotonic()
                self.heartbeat()
                if self.should_run_maintenance_tasks:
                    self.run_maintenance_tasks()  # type: ignore[no-untyped-call]

    def execute_job(self, job: Job, queue: Queue) -> Any:
        with self.app.app_context(), running_kinds(self._kinds):
            if self.pool is not None and _is_webhook_job(job):
                self._take_batch(self.pool, queue)
            return super().execute_job(job, queue)

    def _take_batch(self, pool: DeliveryPool, queue: Queue) -> None:
        """Start the webhook jobs queued behind this one that fit in the free slots (the job
        itself keeps one), without a round of RQ's bookkeeping each."""
        try:
            delivery_ids = take_jobs(queue, WEBHOOK_JOB, pool.free_slots() - 1)
            if delivery_ids:
                pool.submit_many(delivery_ids)
        except Exception:  # the rows stay PENDING, and the sweeper queues them again
            self.log.exception("harvest: could not start a batch of deliveries")

    def work(self, *args: Any, **kwargs: Any) -> bool:
        runner = get_engine(self.app).runner
        if self.pool is not None and self.pool.runner is runner:
            # A keyed delivery's outcome leases the next one of its key for this pool to start.
            runner.follow = self.pool.follow
        thread = None
        if self._periodic is not None:
            thread = threading.Thread(
                target=self._run_periodic, args=(self._periodic,), name="harvest-sweeper", daemon=True
            )
            thread.start()
        try:
            return bool(super().work(*args, **kwargs))
        finally:
            self._stopping.set()
            if runner.follow == getattr(self.pool, "follow", None):
                # Stopping: the attempts that finish now lease nothing more for this pool.
                runner.follow = None
            if self.pool is not None:
                self.pool.shutdown(wait=True)
            # The workflow runs handed over: those under way finish, those not begun go back to
            # the queue, and a queued run's thread claims no next one (else the interpreter's
            # exit would run every one still waiting for a thread, and a long queue behind them).
            workflows = get_engine(self.app).workflows
            if workflows is not None:
                workflows.runner.close()
            if thread is not None:
                thread.join(timeout=self._interval + 5)

    def _run_periodic(self, periodic: Callable[[], object]) -> None:
        while not self._stopping.wait(self._interval):
            try:
                with self.app.app_context():
                    periodic()
            except Exception:  # the sweeper must outlive a database or Redis outage
                self.log.exception("harvest sweeper failed; will try again in %s s", self._interval)


def _is_webhook_job(job: Job) -> bool:
    return job.func_name in (TASK, BATCH_TASK) and bool(job.args) and job.args[0] == WEBHOOK_JOB


__all__ = ["HarvestWorker"]
