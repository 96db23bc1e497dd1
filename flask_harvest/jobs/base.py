"""The contract every job backend fulfils."""

from __future__ import annotations

import abc
from collections.abc import Sequence

from ..errors import HarvestError
from ..webhooks.models import DeliveryLog


class JobBackendError(HarvestError):
    """The backend could not take a job (Redis is down, the backend was shut down)."""


JOB_PREFIX = "harvest-"


def job_id(delivery: DeliveryLog) -> str:
    """Return the job id of a delivery's next attempt.

    It changes with every attempt, retry and replay, so a job that is finishing never shares an id
    with the retry it scheduled, and the sweeper can ask whether the job a row waits for exists.
    """
    due = delivery.next_attempt_at
    due_ms = int(due.timestamp() * 1000) if due is not None else 0
    return f"{JOB_PREFIX}{delivery.id}-{delivery.attempt}-{due_ms}"


def delivery_id_of(identifier: str) -> str:
    """Return the delivery id in a job id made by :func:`job_id`."""
    return identifier.removeprefix(JOB_PREFIX).rsplit("-", 2)[0]


class JobBackend(abc.ABC):
    """Runs delivery attempts: now (:meth:`enqueue`) or later (:meth:`schedule`).

    A job carries only delivery ids; the attempt re-reads the row, and the claim decides who
    sends, so a duplicate job is harmless.
    """

    #: Whether jobs survive the web process that enqueued them.
    durable: bool = False

    @abc.abstractmethod
    def enqueue(self, deliveries: Sequence[DeliveryLog]) -> None:
        """Queue the deliveries (a job each, or a few per job), in one round trip where the backend
        allows.

        :raises JobBackendError: the jobs could not be queued.
        """

    @abc.abstractmethod
    def schedule(self, delivery: DeliveryLog) -> None:
        """Queue a job to run at ``delivery.next_attempt_at``.

        :raises JobBackendError: the job could not be queued.
        """

    @abc.abstractmethod
    def live_jobs(self, deliveries: Sequence[DeliveryLog]) -> set[str]:
        """Return the ids of the deliveries whose job is queued, scheduled or running."""

    def close(self) -> None:  # noqa: B027 (optional hook, nothing to do by default)
        """Release the backend's resources."""
