"""The job seam: a small reference to a unit of work, the backends that carry it, and the kinds of
work they carry.

A job carries only a :class:`JobRef`; whoever runs it re-reads the row it names, and a claim in SQL
decides who acts, so a duplicate or stale job is harmless. The seam knows nothing of webhooks or
workflows: each feature registers its *kind* of work in :class:`JobKinds`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from ..errors import HarvestError


class JobBackendError(HarvestError):
    """The backend could not take a job (Redis is down, the backend was shut down)."""


JOB_PREFIX = "harvest-"


@dataclass(frozen=True)
class JobRef:
    """What a job carries: which row to work on, and which attempt of it the job is for.

    :param kind: the kind of work (``"webhook"``, ``"workflow"``), a registered :class:`JobKinds` name.
    :param id: the row's id.
    :param attempt: the attempt the job is for; with ``due``, it makes each attempt's job id new.
    :param due: when the job should run; ``None`` for now.
    """

    kind: str
    id: str
    attempt: int = 0
    due: datetime | None = None

    @property
    def job_id(self) -> str:
        """The job's id. It changes with every attempt, retry and replay, so a finishing job never
        shares an id with the retry it scheduled, and the sweeper can ask whether the job a row
        waits for exists."""
        due_ms = int(self.due.timestamp() * 1000) if self.due is not None else 0
        return f"{JOB_PREFIX}{self.kind}-{self.id}-{self.attempt}-{due_ms}"


def kind_prefix(kind: str) -> str:
    """Return the prefix of the job ids of one kind of work."""
    return f"{JOB_PREFIX}{kind}-"


def row_id_of(job_id: str, kind: str) -> str:
    """Return the row id in a job id of ``kind`` made by :attr:`JobRef.job_id`."""
    return job_id.removeprefix(kind_prefix(kind)).rsplit("-", 2)[0]


#: Runs a batch of one kind's rows, by id, on the calling thread.
RunJobs = Callable[[Sequence[str]], object]
#: How many rows a job of a kind carries: a number, or a callable asked each time.
Take = int | Callable[[], int]


class JobKinds:
    """The kinds of work the seam carries, each with the function that runs its rows."""

    def __init__(
        self,
        handlers: Mapping[str, RunJobs] | None = None,
        takes: Mapping[str, Take] | None = None,
        here: Mapping[str, RunJobs] | None = None,
    ) -> None:
        self._handlers: dict[str, RunJobs] = dict(handlers or {})
        self._takes: dict[str, Take] = dict(takes or {})
        self._here: dict[str, RunJobs] = dict(here or {})

    def __repr__(self) -> str:
        return f"<JobKinds {sorted(self._handlers)}>"

    def __contains__(self, kind: object) -> bool:
        return kind in self._handlers

    def register(self, kind: str, run: RunJobs, *, take: Take = 1) -> None:
        """Add a kind of work.

        :param take: the rows a worker running one job of this kind runs with it: it takes the jobs
            of the same kind queued behind it, up to ``take`` rows in all, off the queue (a backend
            that can, such as RQ's) and hands them to ``run`` together; a callable is asked each
            time (how many the runner has room for).
        :raises ValueError: the kind is registered already, or its name has a ``-`` (job ids use it).
        """
        if kind in self._handlers:
            raise ValueError(f"the job kind {kind!r} is registered already")
        if not kind or "-" in kind:
            raise ValueError(f"a job kind is a non-empty name without '-', not {kind!r}")
        self._handlers[kind] = run
        self._takes[kind] = take

    def take(self, kind: str) -> int:
        """Return how many rows of ``kind`` a worker runs per job now (see :meth:`register`)."""
        take = self._takes.get(kind, 1)
        return max(1, take() if callable(take) else take)

    def with_handler(self, kind: str, run: RunJobs, *, here: RunJobs | None = None) -> JobKinds:
        """Return a copy whose ``kind`` is run by ``run`` (a worker routes deliveries to its pool).

        :param here: runs the rows on the calling thread instead (:meth:`run_here`); default: ``run``.
        """
        handlers = {**self._handlers, kind: run}
        inline = {name: fn for name, fn in self._here.items() if name != kind}
        if here is not None:
            inline[kind] = here
        return JobKinds(handlers, self._takes, inline)

    def run(self, kind: str, ids: Sequence[str]) -> None:
        """Run the rows ``ids`` of ``kind``.

        :raises JobBackendError: no such kind is registered (a job from another app or version).
        """
        try:
            handler = self._handlers[kind]
        except KeyError:
            raise JobBackendError(f"no job kind {kind!r} is registered in this app") from None
        handler(ids)

    def run_here(self, kind: str, ids: Sequence[str]) -> None:
        """Run the rows ``ids`` of ``kind`` starting on the calling thread: a thread that has just
        made the work (a run that ended, with callbacks to send) saves the queue's round trip.

        :raises JobBackendError: no such kind is registered.
        """
        handler = self._here.get(kind)
        if handler is None:
            self.run(kind, ids)
        else:
            handler(ids)


class JobBackend(abc.ABC):
    """Carries jobs to whoever runs them: now (:meth:`enqueue`) or later (:meth:`schedule`)."""

    #: Whether jobs survive the web process that enqueued them.
    durable: bool = False
    #: Whether a job may hand its rows to threads of its kind's own and return before they are
    #: done. ``False`` where the backend counts a job as running until it returns (:meth:`join`
    #: waits for it; its own threads are the concurrency): a kind then runs its rows to the end.
    #: ``True`` where a worker process outlives its jobs and goes on taking more meanwhile.
    allows_hand_off: bool = False

    @abc.abstractmethod
    def enqueue(self, refs: Sequence[JobRef]) -> None:
        """Queue the jobs now (a job each, or a few of one kind per job), in one round trip where
        the backend allows.

        :raises JobBackendError: the jobs could not be queued.
        """

    @abc.abstractmethod
    def schedule(self, ref: JobRef, *, at_front: bool = False) -> None:
        """Queue a job to run at ``ref.due``.

        :param at_front: when due, the job goes to the head of the queue, before the jobs queued
            meanwhile: for work given back only to wait for its turn, which must not then wait
            behind a backlog as well. A backend whose jobs have no order ignores it.
        :raises JobBackendError: the job could not be queued.
        """

    @abc.abstractmethod
    def live_jobs(self, refs: Sequence[JobRef]) -> set[JobRef]:
        """Return those of ``refs`` whose job is queued, scheduled or running.

        :raises JobBackendError: the backend could not answer.
        """

    def live_workers(self, *, limit: int) -> dict[str, int] | None:
        """Return how many worker processes are alive on each queue, counting at most ``limit`` on
        each; ``None`` when the backend has no worker processes (its jobs run in this process).

        :raises JobBackendError: the backend could not answer.
        """
        return None

    def set_job_timeout(self, kind: str, seconds: int | None) -> None:  # noqa: B027 (optional hook)
        """Give the jobs of ``kind`` their own time limit (``None``: none at all) instead of the
        backend's default. A backend that never kills a job ignores it."""

    def start_sweeping(self) -> None:  # noqa: B027 (optional hook)
        """Start the periodic sweep now, where the backend runs it in this process (the local
        one starts it with its first job otherwise); elsewhere the workers sweep."""

    def join(self, timeout: float = 30.0) -> bool:
        """Wait until the jobs this process queued and runs itself are done; return whether they
        were within ``timeout`` seconds. A backend whose jobs run elsewhere has none to wait for."""
        return True

    def close(self) -> None:  # noqa: B027 (optional hook, nothing to do by default)
        """Release the backend's resources."""
