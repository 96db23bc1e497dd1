"""What the HTTP API, the CLI and the dashboard show of workflow queues: each declared queue's
limits and its runs now, in bounded counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._time import utcnow
from .queues import QueueSpec
from .service import WorkflowService

__all__ = ["COUNT_CAP", "QueueView", "queue_views"]

#: Each count reads at most this many index entries: a count equal to it means "at least".
COUNT_CAP = 10_000


@dataclass(frozen=True)
class QueueView:
    """A declared queue, and how many of its runs are running, waiting, and waiting and due."""

    spec: QueueSpec
    running: int
    waiting: int
    due: int
    cap: int

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.spec.as_dict(),
            "running": self.running,
            "waiting": self.waiting,
            "due": self.due,
            "count_cap": self.cap,
        }


def queue_views(service: WorkflowService, *, cap: int = COUNT_CAP) -> list[QueueView]:
    """Return every queue this process declares, by name, with its bounded counts."""
    now = utcnow()
    views = []
    for spec in service.runner.queues:
        counts = service.store.queue_counts(spec.name, now=now, cap=cap)
        views.append(QueueView(spec, counts.running, counts.waiting, counts.due, cap))
    return views
