"""The ``rq`` backend: delivery jobs on Redis Queue, and the worker that runs them in app context."""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import redis
from flask import Flask
from rq import Queue, SimpleWorker
from rq.job import Job, JobStatus
from rq.utils import utcparse

from ..webhooks.models import DeliveryLog
from .base import JOB_PREFIX, JobBackend, JobBackendError, delivery_id_of, job_id
from .pool import DeliveryPool

_log = logging.getLogger("flask_harvest")
TASK = "flask_harvest.jobs.tasks.deliver_webhook"
# A STARTED job claims its row within milliseconds (the worker waits for a free attempt slot
# before it takes a job). One that started longer ago than this while its row is still PENDING
# belongs to a worker that was killed: the sweeper queues the delivery again.
_STARTED_GRACE_SECONDS = 10.0
# A job the sweeper may count on. Not SCHEDULED: the sweeper only asks about rows overdue by its
# grace period, and a scheduled job that overdue means no scheduler is moving it (the worker that
# held RQ's scheduler lock died), so queueing it again is what gets the retry sent.
_LIVE = {JobStatus.QUEUED, JobStatus.STARTED, JobStatus.DEFERRED}
# How long Redis keeps a failed job, and a batch's member list (which its job outlives only if
# nothing takes it).
_FAILURE_TTL = 24 * 3600
#: Several deliveries queued together (one dispatch's fan-out) travel as one job of this task.
BATCH_TASK = "flask_harvest.jobs.tasks.deliver_webhook_batch"
# Takes delivery jobs from the head of the queue KEYS[1] while they fit in ARGV[1] deliveries,
# atomically, and deletes what they leave in Redis: their job hashes (prefix ARGV[2]) and, for a
# batch job, its member list (prefix ARGV[4]) and its members' entries in the alias hash KEYS[2].
# Returns the job ids of the deliveries taken. It stops at the first job that is not a delivery
# job (prefix ARGV[3]) or does not fit, and leaves it at the head for RQ to run.
_TAKE_JOBS = """
local taken = {}
local room = tonumber(ARGV[1])
while room > 0 do
    local id = redis.call('LINDEX', KEYS[1], 0)
    if not id or string.sub(id, 1, #ARGV[3]) ~= ARGV[3] then break end
    local members = redis.call('GET', ARGV[4] .. id)
    local size = 1
    if members then
        size = 0
        for _ in string.gmatch(members, '%S+') do size = size + 1 end
    end
    if size > room then break end
    redis.call('LPOP', KEYS[1])
    redis.call('DEL', ARGV[2] .. id)
    if members then
        redis.call('DEL', ARGV[4] .. id)
        for member in string.gmatch(members, '%S+') do
            redis.call('HDEL', KEYS[2], member)
            taken[#taken + 1] = member
        end
    else
        taken[#taken + 1] = id
    end
    room = room - size
end
return taken
"""
_BATCH_PREFIX = "harvest:batch:"


def _alias_key(queue: Queue) -> str:
    """The hash that maps a batched delivery's own job id to the id of the batch job carrying it."""
    return f"harvest:batch-of:{queue.name}"


def take_delivery_jobs(queue: Queue, count: int) -> list[str]:
    """Take delivery jobs for up to ``count`` deliveries off the head of ``queue``; return the
    delivery ids.

    The jobs are removed from Redis without running: the caller claims and attempts their rows
    itself. That spares RQ's bookkeeping (about 60 Redis commands a job) for all but one job of a
    worker's batch. If the caller dies before claiming, the rows are still ``PENDING`` with no
    job, and the sweeper queues them again.
    """
    if count <= 0:
        return []
    taken = queue.connection.eval(
        _TAKE_JOBS,
        2,
        queue.key,
        _alias_key(queue),
        count,
        Job.redis_job_namespace_prefix,
        JOB_PREFIX,
        _BATCH_PREFIX,
    )
    return [delivery_id_of(job.decode() if isinstance(job, bytes) else job) for job in taken]


def forget_batch(queue: Queue, batch_id: str, members: Sequence[str]) -> None:
    """Delete what a batch job left in Redis besides its job hash (RQ deletes that)."""
    with queue.connection.pipeline() as pipe:
        pipe.delete(_BATCH_PREFIX + batch_id)
        if members:
            pipe.hdel(_alias_key(queue), *members)
        pipe.execute()


def _due_second(when: datetime | None) -> datetime:
    # RQ's scheduler keeps whole seconds and truncates; round up so the job is never early.
    if when is None:
        return datetime.now(timezone.utc)
    return datetime.fromtimestamp(math.ceil(when.timestamp()), timezone.utc)


class RqBackend(JobBackend):
    """Delivery jobs on an RQ queue; delayed retries through RQ's scheduler.

    Jobs keep no result (``result_ttl=0``): the outcome lives in SQL, and Redis stays small.

    :param connection: the Redis connection.
    :param queue_name: the queue the workers listen on.
    :param job_timeout: seconds after which RQ kills a job (longer than an attempt's deadline).
    """

    durable = True

    def __init__(
        self, connection: redis.Redis, queue_name: str, *, job_timeout: int, batch_size: int = 8
    ) -> None:
        self.connection = connection
        self.queue = Queue(queue_name, connection=connection)
        self.job_timeout = job_timeout
        self.batch_size = max(1, batch_size)

    def __repr__(self) -> str:
        return f"<RqBackend queue={self.queue.name!r}>"

    def _options(self, identifier: str, description: str) -> dict[str, Any]:
        return {
            "job_id": identifier,
            "timeout": self.job_timeout,
            "result_ttl": 0,
            "failure_ttl": _FAILURE_TTL,
            "description": description,
        }

    def _delivery_options(self, delivery: DeliveryLog) -> dict[str, Any]:
        return self._options(job_id(delivery), f"deliver {delivery.id}")

    def enqueue(self, deliveries: Sequence[DeliveryLog]) -> None:
        """Queue the deliveries, up to ``batch_size`` of them per job, in one transaction.

        A batch job carries its deliveries' own job ids (:func:`~flask_harvest.jobs.base.job_id`).
        Redis keeps the list beside it, for workers taking it without running it
        (:func:`take_delivery_jobs`), and an alias from each member to the batch, for the
        sweeper's question whether a delivery's job is alive (:meth:`live_jobs`).
        """
        if not deliveries:
            return
        jobs = []
        aliases: dict[str, str] = {}
        with self.connection.pipeline() as pipe:
            for start in range(0, len(deliveries), self.batch_size):
                chunk = deliveries[start : start + self.batch_size]
                if len(chunk) == 1:
                    jobs.append(
                        Queue.prepare_data(TASK, args=(chunk[0].id,), **self._delivery_options(chunk[0]))
                    )
                    continue
                batch_id = f"{JOB_PREFIX}batch-{uuid.uuid4().hex}"
                members = [job_id(d) for d in chunk]
                pipe.set(_BATCH_PREFIX + batch_id, " ".join(members), ex=_FAILURE_TTL)
                aliases.update(dict.fromkeys(members, batch_id))
                jobs.append(
                    Queue.prepare_data(
                        BATCH_TASK,
                        args=(batch_id, members),
                        **self._options(batch_id, f"deliver {len(chunk)} deliveries"),
                    )
                )
            if aliases:
                pipe.hset(_alias_key(self.queue), mapping=aliases)  # type: ignore[arg-type]
            try:
                self.queue.enqueue_many(jobs, pipeline=pipe)
                pipe.execute()
            except redis.RedisError as exc:
                raise JobBackendError(f"Redis refused the jobs ({type(exc).__name__})") from exc

    def schedule(self, delivery: DeliveryLog) -> None:
        try:
            self.queue.enqueue_at(
                _due_second(delivery.next_attempt_at),
                TASK,
                delivery.id,
                **_at_options(self._delivery_options(delivery)),
            )
        except redis.RedisError as exc:
            raise JobBackendError(f"Redis refused the retry job ({type(exc).__name__})") from exc

    def live_jobs(self, deliveries: Sequence[DeliveryLog]) -> set[str]:
        identifiers = [job_id(d) for d in deliveries]
        try:
            own = self._job_states(identifiers)
            found = self.connection.hmget(_alias_key(self.queue), identifiers) if identifiers else []
            aliases = [a.decode() if isinstance(a, bytes) else a for a in found]
            batch_ids = sorted({a for a in aliases if a is not None})
            batches = dict(zip(batch_ids, self._job_states(batch_ids), strict=True))
        except redis.RedisError as exc:
            raise JobBackendError(f"Redis did not answer ({type(exc).__name__})") from exc
        live = set()
        dead_aliases = []
        for delivery, identifier, alive, alias in zip(deliveries, identifiers, own, aliases, strict=True):
            if alive or (alias is not None and batches[alias]):
                live.add(delivery.id)
            elif alias is not None:
                dead_aliases.append(identifier)  # its batch job is gone: the entry is stale
        if dead_aliases:
            with contextlib.suppress(redis.RedisError):
                self.connection.hdel(_alias_key(self.queue), *dead_aliases)
        return live

    def _job_states(self, identifiers: Sequence[str]) -> list[bool]:
        """Return, for each job id, whether that job is alive (see :meth:`_alive`)."""
        if not identifiers:
            return []
        with self.connection.pipeline(transaction=False) as pipe:
            for identifier in identifiers:
                pipe.hmget(Job.key_for(identifier), "status", "started_at")
                pipe.lpos(self.queue.key, identifier)
            answers = pipe.execute()
        now = datetime.now(timezone.utc)
        return [
            self._alive(status, started, position is not None, now)
            for (status, started), position in zip(answers[::2], answers[1::2], strict=True)
        ]

    def _alive(self, status: bytes | None, started_at: bytes | None, in_queue: bool, now: datetime) -> bool:
        if status is None or status.decode() not in _LIVE:
            return False
        if status.decode() == JobStatus.QUEUED:
            # RQ moves a job out of the queue before it marks it started; a worker killed in
            # between leaves it "queued" but in no queue, and nothing would ever run it.
            return in_queue
        if status.decode() != JobStatus.STARTED or started_at is None:
            return True
        started = utcparse(started_at.decode()).replace(tzinfo=timezone.utc)
        return (now - started).total_seconds() < _STARTED_GRACE_SECONDS

    def close(self) -> None:
        self.connection.close()


def _at_options(options: dict[str, Any]) -> dict[str, Any]:
    # enqueue_at spells the job timeout ``job_timeout``, prepare_data spells it ``timeout``.
    renamed = dict(options)
    renamed["job_timeout"] = renamed.pop("timeout")
    return renamed


class HarvestWorker(SimpleWorker):
    """An RQ worker that runs each job inside the Flask app's context, in its own process.

    It never forks per job: a fork costs more than a delivery (see the deployment docs). With a
    ``pool``, the worker waits for a batch of free slots, takes a delivery job, and with it the
    delivery jobs queued behind it that fit (:func:`take_delivery_jobs`); it claims their rows in
    one statement and runs the attempts on the pool, so the process keeps many attempts in flight.
    When it stops it lets the attempts in flight finish. It also runs ``periodic`` (the sweeper) every
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
        with self.app.app_context(), self.pool.active() if self.pool else contextlib.nullcontext():
            if self.pool is not None and job.func_name in (TASK, BATCH_TASK):
                self._take_batch(queue)
            return super().execute_job(job, queue)

    def _take_batch(self, queue: Queue) -> None:
        """Start the delivery jobs queued behind this one that fit in the free slots (the job
        itself keeps one), without a round of RQ's bookkeeping each."""
        assert self.pool is not None
        try:
            delivery_ids = take_delivery_jobs(queue, self.pool.free_slots() - 1)
            if delivery_ids:
                self.pool.deliver_many(delivery_ids)
        except Exception:  # the rows stay PENDING, and the sweeper queues them again
            self.log.exception("harvest: could not start a batch of deliveries")

    def work(self, *args: Any, **kwargs: Any) -> bool:
        thread = None
        if self._periodic is not None:
            thread = threading.Thread(target=self._run_periodic, name="harvest-sweeper", daemon=True)
            thread.start()
        try:
            return bool(super().work(*args, **kwargs))
        finally:
            self._stopping.set()
            if self.pool is not None:
                self.pool.shutdown(wait=True)
            if thread is not None:
                thread.join(timeout=self._interval + 5)

    def _run_periodic(self) -> None:
        assert self._periodic is not None
        while not self._stopping.wait(self._interval):
            try:
                with self.app.app_context():
                    self._periodic()
            except Exception:  # the sweeper must outlive a database or Redis outage
                self.log.exception("harvest sweeper failed; will try again in %s s", self._interval)


def run_worker(
    app: Flask,
    make_worker: Callable[[Callable[[], object]], HarvestWorker],
    *,
    burst: bool,
    recover: Callable[[], object],
    max_delay: float = 30.0,
) -> None:
    """Run workers from ``make_worker`` until stopped, starting a fresh one whenever Redis drops.

    RQ's worker quits when Redis goes away under it (a restart, a failover). Instead of leaving
    that to a process manager, wait with a growing delay, run ``recover`` (a sweep: Redis may
    have come back empty) and work again. A burst run ends when its queue is empty, a normal one
    when SIGINT or SIGTERM asks it to.
    """
    stop = threading.Event()
    delay = 1.0
    while not stop.is_set():
        try:
            make_worker(stop.set).work(burst=burst, with_scheduler=True)  # connects to Redis
            if burst:
                return
            reason = "the worker loop ended"
        except redis.RedisError as exc:
            reason = f"Redis failed ({type(exc).__name__})"
        if stop.is_set():
            return
        _log.warning("harvest: %s; starting a new worker in %.0f s", reason, delay)
        if stop.wait(delay):
            return
        delay = min(delay * 2, max_delay)
        try:
            with app.app_context():
                recover()
            delay = 1.0
        except Exception:  # Redis or the database is still down: wait longer, try again
            _log.warning("harvest: recovery sweep failed; retrying", exc_info=True)


def job_timeout_for(deadline_seconds: float, connect_timeout: float) -> int:
    """Return an RQ job timeout comfortably longer than one attempt can take."""
    return int(deadline_seconds + connect_timeout) + 30


__all__ = [
    "HarvestWorker",
    "RqBackend",
    "forget_batch",
    "job_timeout_for",
    "run_worker",
    "take_delivery_jobs",
]
