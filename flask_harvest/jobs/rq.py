"""The ``rq`` backend: jobs on Redis Queue. Everything that knows RQ's internal Redis layout (job
hashes, queue lists, the script that takes jobs without running them) lives in this module, tested
against the RQ versions ``setup.cfg`` allows."""

from __future__ import annotations

import contextlib
import itertools
import math
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.utils import utcparse
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from .._time import utcnow
from .base import JobBackend, JobBackendError, JobRef, kind_prefix, row_id_of

#: The task of a job that carries one row; its arguments are the kind and the row id.
TASK = "flask_harvest.jobs.tasks.run_job"
#: The task of a job that carries several rows of one kind (one dispatch's fan-out).
BATCH_TASK = "flask_harvest.jobs.tasks.run_batch"
# A STARTED job claims its row within milliseconds (the worker waits for a free slot before it
# takes a job). One that started longer ago than this while its row is still due belongs to a
# worker that was killed: the sweeper queues the row again.
_STARTED_GRACE_SECONDS = 10.0
# A job the sweeper may count on. Not SCHEDULED: the sweeper only asks about rows overdue by its
# grace period, and a scheduled job that overdue means no scheduler is moving it (the worker that
# held RQ's scheduler lock died), so queueing it again is what gets the retry sent.
_LIVE = {JobStatus.QUEUED, JobStatus.STARTED, JobStatus.DEFERRED}
# How long Redis keeps a failed job, and a batch's member list (which its job outlives only if
# nothing takes it).
_FAILURE_TTL = 24 * 3600
# Takes jobs of one kind from the head of the queue KEYS[1] while they fit in ARGV[1] rows,
# atomically, and deletes what they leave in Redis: their job hashes (prefix ARGV[2]) and, for a
# batch job, its member list (prefix ARGV[4]) and its members' entries in the alias hash KEYS[2].
# Returns the job ids of the rows taken. It stops at the first job that is not of the kind
# (prefix ARGV[3]) or does not fit, and leaves it at the head for RQ to run.
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
# RQ's spelling of "no job timeout".
_NO_TIMEOUT = -1


def _alias_key(queue: Queue) -> str:
    """The hash that maps a batched row's own job id to the id of the batch job carrying it."""
    return f"harvest:batch-of:{queue.name}"


def take_jobs(queue: Queue, kind: str, count: int) -> list[str]:
    """Take jobs of ``kind`` for up to ``count`` rows off the head of ``queue``; return the row ids.

    The jobs are removed from Redis without running: the caller claims and runs their rows itself.
    That spares RQ's bookkeeping (about 60 Redis commands a job) for all but one job of a worker's
    batch. If the caller dies before claiming, the rows are still due with no job, and the sweeper
    queues them again.
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
        kind_prefix(kind),
        _BATCH_PREFIX,
    )
    return [row_id_of(job.decode() if isinstance(job, bytes) else job, kind) for job in taken]


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
        return utcnow()
    return datetime.fromtimestamp(math.ceil(when.timestamp()), timezone.utc)


class RqBackend(JobBackend):
    """Jobs on an RQ queue; delayed ones through RQ's scheduler.

    Jobs keep no result (``result_ttl=0``): the outcome lives in SQL, and Redis stays small.

    :param connection: the Redis connection.
    :param queue_name: the queue the workers listen on.
    :param job_timeout: seconds after which RQ kills a job (longer than an attempt's deadline),
        unless its kind has a limit of its own (:meth:`set_job_timeout`).
    :param batch_size: rows of one kind carried by one job when several are queued together.
    """

    durable = True
    # A worker keeps the runner's threads going between jobs (see flask_harvest.worker).
    allows_hand_off = True

    def __init__(
        self, connection: redis.Redis, queue_name: str, *, job_timeout: int, batch_size: int = 8
    ) -> None:
        self.connection = connection
        self.queue = Queue(queue_name, connection=connection)
        self.job_timeout = job_timeout
        self.batch_size = max(1, batch_size)
        self._kind_timeouts: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"<RqBackend queue={self.queue.name!r}>"

    def set_job_timeout(self, kind: str, seconds: int | None) -> None:
        """Give the jobs of ``kind`` their own RQ timeout; ``None`` for none (RQ's ``-1``).

        A workflow job may legitimately run for a long time: its lease and heartbeat, not RQ's
        ``SIGALRM``, tell a live run from a dead one.
        """
        self._kind_timeouts[kind] = _NO_TIMEOUT if seconds is None else int(seconds)

    def timeout_for(self, kind: str) -> int:
        """The RQ job timeout of ``kind``'s jobs, in seconds (``-1``: none)."""
        return self._kind_timeouts.get(kind, self.job_timeout)

    def _options(self, identifier: str, description: str, kind: str) -> dict[str, Any]:
        return {
            "job_id": identifier,
            "timeout": self.timeout_for(kind),
            "result_ttl": 0,
            "failure_ttl": _FAILURE_TTL,
            "description": description,
        }

    def _ref_options(self, ref: JobRef) -> dict[str, Any]:
        return self._options(ref.job_id, f"{ref.kind} {ref.id}", ref.kind)

    def take(self, kind: str, count: int) -> list[str]:
        """Take jobs of ``kind`` for up to ``count`` rows off this backend's queue (:func:`take_jobs`)."""
        return take_jobs(self.queue, kind, count)

    def enqueue(self, refs: Sequence[JobRef]) -> None:
        """Queue the jobs, up to ``batch_size`` rows of one kind per job, in one transaction.

        A batch job carries its rows' own job ids (:attr:`JobRef.job_id`). Redis keeps the list
        beside it, for workers taking it without running it (:func:`take_jobs`), and an alias from
        each member to the batch, for the sweeper's question whether a row's job is alive
        (:meth:`live_jobs`).
        """
        if not refs:
            return
        jobs = []
        aliases: dict[str, str] = {}
        by_kind: dict[str, list[JobRef]] = {}
        for ref in refs:
            by_kind.setdefault(ref.kind, []).append(ref)
        with self.connection.pipeline() as pipe:
            for kind, same_kind in by_kind.items():
                for start in range(0, len(same_kind), self.batch_size):
                    chunk = same_kind[start : start + self.batch_size]
                    if len(chunk) == 1:
                        options = self._ref_options(chunk[0])
                        jobs.append(Queue.prepare_data(TASK, args=(kind, chunk[0].id), **options))
                        continue
                    batch_id = f"{kind_prefix(kind)}batch_{uuid.uuid4().hex}"
                    members = [ref.job_id for ref in chunk]
                    pipe.set(_BATCH_PREFIX + batch_id, " ".join(members), ex=_FAILURE_TTL)
                    aliases.update(dict.fromkeys(members, batch_id))
                    options = self._options(batch_id, f"{kind} x{len(chunk)}", kind)
                    jobs.append(Queue.prepare_data(BATCH_TASK, args=(kind, batch_id, members), **options))
            if aliases:
                pipe.hset(_alias_key(self.queue), mapping=aliases)  # type: ignore[arg-type]
            try:
                self.queue.enqueue_many(jobs, pipeline=pipe)
                pipe.execute()
            except redis.RedisError as exc:
                raise JobBackendError(f"Redis refused the jobs ({type(exc).__name__})") from exc

    def schedule(self, ref: JobRef, *, at_front: bool = False) -> None:
        options = self._ref_options(ref)
        # enqueue_at spells the job timeout ``job_timeout``, prepare_data spells it ``timeout``.
        options["job_timeout"] = options.pop("timeout")
        try:
            # With at_front, RQ's scheduler pushes the job to the head of the queue when it is due.
            self.queue.enqueue_at(_due_second(ref.due), TASK, ref.kind, ref.id, at_front=at_front, **options)
        except redis.RedisError as exc:
            raise JobBackendError(f"Redis refused the delayed job ({type(exc).__name__})") from exc

    def live_jobs(self, refs: Sequence[JobRef]) -> set[JobRef]:
        identifiers = [ref.job_id for ref in refs]
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
        for ref, identifier, alive, alias in zip(refs, identifiers, own, aliases, strict=True):
            if alive or (alias is not None and batches[alias]):
                live.add(ref)
            elif alias is not None:
                dead_aliases.append(identifier)  # its batch job is gone: the entry is stale
        if dead_aliases:
            with contextlib.suppress(redis.RedisError):
                self.connection.hdel(_alias_key(self.queue), *dead_aliases)
        return live

    def live_workers(self, *, limit: int) -> dict[str, int]:
        # RQ's registry of the queue's workers keeps a killed worker's entry until someone cleans
        # it; the worker's own key expires worker_ttl after its last heartbeat, so only the
        # entries whose key still exists are alive. At most ``limit`` entries are read.
        try:
            keys = list(
                itertools.islice(self.connection.sscan_iter(WORKERS_BY_QUEUE_KEY % self.queue.name), limit)
            )
            # EXISTS with several keys answers how many of them exist, in one round trip.
            alive = int(self.connection.exists(*keys)) if keys else 0
        except redis.RedisError as exc:
            raise JobBackendError(f"Redis did not answer ({type(exc).__name__})") from exc
        return {self.queue.name: alive}

    def _job_states(self, identifiers: Sequence[str]) -> list[bool]:
        """Return, for each job id, whether that job is alive (see :meth:`_alive`)."""
        if not identifiers:
            return []
        with self.connection.pipeline(transaction=False) as pipe:
            for identifier in identifiers:
                pipe.hmget(Job.key_for(identifier), "status", "started_at")
                pipe.lpos(self.queue.key, identifier)
            answers = pipe.execute()
        now = utcnow()
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


def job_timeout_for(deadline_seconds: float, connect_timeout: float) -> int:
    """Return an RQ job timeout comfortably longer than one attempt can take."""
    return int(deadline_seconds + connect_timeout) + 30


__all__ = ["BATCH_TASK", "TASK", "RqBackend", "forget_batch", "job_timeout_for", "take_jobs"]
