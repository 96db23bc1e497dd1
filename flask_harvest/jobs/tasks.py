"""Job functions: importable, module-level, taking a kind and row ids only (RQ pickles the reference).

They run the rows through the :class:`~flask_harvest.jobs.base.JobKinds` of the worker running the
job (:func:`running_kinds`), which is how a worker process routes each kind of work.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import ParamSpec, TypeVar

from rq import Queue, get_current_job

from .base import JobBackendError, JobKinds, row_id_of
from .rq import forget_batch, take_jobs

_kinds: ContextVar[JobKinds | None] = ContextVar("harvest_job_kinds", default=None)
_P = ParamSpec("_P")
_R = TypeVar("_R")


@contextmanager
def running_kinds(kinds: JobKinds) -> Iterator[None]:
    """Run the jobs started in this context with ``kinds`` (the worker wraps each job in it)."""
    token = _kinds.set(kinds)
    try:
        yield
    finally:
        _kinds.reset(token)


def run_here(kind: str, row_ids: Sequence[str]) -> bool:
    """Run rows of ``kind`` from this thread if it runs a worker's job (see :meth:`JobKinds.run_here`:
    under a worker's pool, with its admission); return ``False`` (nothing run) anywhere else."""
    kinds = _kinds.get()
    if kinds is None:
        return False
    kinds.run_here(kind, row_ids)
    return True


def carrying_job_context(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Return ``fn`` bound to this thread's job context, to be run on another thread.

    A pool's threads do not inherit a ``ContextVar``: without this, what a job hands to one (the
    workflow runner's threads) would not know it runs in a worker. Outside a job, ``fn`` itself.
    """
    kinds = _kinds.get()
    if kinds is None:
        return fn

    @functools.wraps(fn)
    def bound(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with running_kinds(kinds):
            return fn(*args, **kwargs)

    return bound


def _current_kinds() -> JobKinds:
    kinds = _kinds.get()
    if kinds is None:
        raise JobBackendError(
            "harvest jobs run in `flask harvest worker` (HarvestWorker), not another worker"
        )
    return kinds


def run_job(kind: str, row_id: str) -> None:
    """Run one row of ``kind``, with the rows of the jobs of that kind queued behind it if the kind
    takes several (:meth:`~flask_harvest.jobs.base.JobKinds.register`'s ``take``).

    The jobs taken leave Redis without running; if this worker dies before it claims their rows,
    they are due with no job, and the sweeper queues them again.
    """
    kinds = _current_kinds()
    row_ids = [row_id]
    job = get_current_job()
    if job is not None and kinds.take(kind) > 1:
        row_ids += take_jobs(Queue(job.origin, connection=job.connection), kind, kinds.take(kind) - 1)
    kinds.run(kind, row_ids)


def run_batch(kind: str, batch_id: str, member_job_ids: list[str]) -> None:
    """Run the rows of a batch job (see :meth:`flask_harvest.jobs.rq.RqBackend.enqueue`).

    ``member_job_ids`` are the rows' own job ids; the row ids are read from them.
    """
    kinds = _current_kinds()
    job = get_current_job()
    if job is not None:
        forget_batch(Queue(job.origin, connection=job.connection), batch_id, member_job_ids)
    kinds.run(kind, [row_id_of(member, kind) for member in member_job_ids])
