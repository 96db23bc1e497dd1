"""The worker process's RQ worker: each job in the Flask app's context, routed by kind of work."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from flask import Flask
from rq import Queue, SimpleWorker
from rq.job import Job

from .._app import get_engine
from ..jobs.rq import BATCH_TASK, TASK, take_jobs
from ..jobs.tasks import running_kinds
from ..webhooks.delivery import WEBHOOK_JOB
from .pool import DeliveryPool


class HarvestWorker(SimpleWorker):
    """An RQ worker that runs each job inside the Flask app's context, in its own process.

    It never forks per job: a fork costs more than a delivery (see the deployment docs). Jobs run
    through the app engine's :class:`~flask_harvest.jobs.base.JobKinds`. With a ``pool``, webhook
    jobs go to the pool: the worker waits for a batch of free slots, takes a webhook job, and with
    it the webhook jobs queued behind it that fit (:func:`~flask_harvest.jobs.rq.take_jobs`); the
    pool claims their rows in one statement, on one of its threads while this one goes on taking
    jobs, and keeps their attempts in flight. When it stops it lets the attempts in flight finish.
    It also runs ``periodic`` (the sweeper) every ``interval`` seconds on a background thread.
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
        self._kinds = kinds.with_handler(WEBHOOK_JOB, pool.submit_many) if pool is not None else kinds
        self._periodic = periodic
        self._interval = interval
        self._on_stop = on_stop
        self._stopping = threading.Event()

    def request_stop(self, signum: Any, frame: Any) -> None:
        if self._on_stop is not None:
            self._on_stop()
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        if self.pool is not None:
            self.pool.wait_for_slots()
        return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)

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
            if self.pool is not None:
                self.pool.shutdown(wait=True)
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
