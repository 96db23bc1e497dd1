"""Queue again what SQL says is due and the backend has no live job for: the sweeper's one way.

Each kind's sweeper step finds its due rows in SQL and names the job each row waits for; this asks
the backend which of those jobs exist and queues the rest. A job queued twice is harmless (the
claim in SQL decides who acts), a job never queued is a row that waits forever.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .base import JobBackend, JobRef

__all__ = ["requeue_missing"]


def requeue_missing(
    backend: JobBackend, refs: Sequence[JobRef], *, also: Mapping[JobRef, Sequence[JobRef]] | None = None
) -> list[JobRef]:
    """Queue the jobs among ``refs`` that the backend has no live job for, in one call; return them.

    :param also: for a ref, the other jobs that run the same row (a workflow run that went to sleep
        waits for a job scheduled at its wake time, not for one queued now): the ref is queued only
        when none of them is live either.
    :raises JobBackendError: the backend could not answer, or could not take the jobs.
    """
    others = also or {}
    live = backend.live_jobs([*refs, *(other for ref in refs for other in others.get(ref, ()))])
    missing = [ref for ref in refs if ref not in live and live.isdisjoint(others.get(ref, ()))]
    backend.enqueue(missing)
    return missing
