"""The job seam: how delivery attempts reach a worker.

Two backends implement :class:`~flask_harvest.jobs.base.JobBackend`: ``rq`` (Redis Queue, durable
across web-process restarts) and ``local`` (threads in this process, not durable).
"""

from .base import JobBackend, JobBackendError

__all__ = ["JobBackend", "JobBackendError"]
