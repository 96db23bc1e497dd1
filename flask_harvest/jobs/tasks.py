"""Job functions: importable, module-level, taking a kind and row ids only (RQ pickles the reference).

They run the rows through the :class:`~flask_harvest.jobs.base.JobKinds` of the worker running the
job (:func:`running_kinds`), which is how a worker process routes each kind of work.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from rq import Queue, get_current_job

from .base import JobBackendError, JobKinds, row_id_of
from .rq import forget_batch

_kinds: ContextVar[JobKinds | None] = ContextVar("harvest_job_kinds", default=None)


@contextmanager
def running_kinds(kinds: JobKinds) -> Iterator[None]:
    """Run the jobs started in this context with ``kinds`` (the worker wraps each job in it)."""
    token = _kinds.set(kinds)
    try:
        yield
    finally:
        _kinds.reset(token)


def in_worker_job() -> bool:
    """Whether this thread is running a job in ``flask harvest worker`` right now."""
    return _kinds.get() is not None


def _current_kinds() -> JobKinds:
    kinds = _kinds.get()
    if kinds is None:
        raise JobBackendError(
            "harvest jobs run in `flask harvest worker` (HarvestWorker), not another worker"
        )
    return kinds


def run_job(kind: str, row_id: str) -> None:
    """Run one row of ``kind``."""
    _current_kinds().run(kind, [row_id])


def run_batch(kind: str, batch_id: str, member_job_ids: list[str]) -> None:
    """Run the rows of a batch job (see :meth:`flask_harvest.jobs.rq.RqBackend.enqueue`).

    ``member_job_ids`` are the rows' own job ids; the row ids are read from them.
    """
    kinds = _current_kinds()
    job = get_current_job()
    if job is not None:
        forget_batch(Queue(job.origin, connection=job.connection), batch_id, member_job_ids)
    kinds.run(kind, [row_id_of(member, kind) for member in member_job_ids])
