"""The one sweeper: SQL is the source of truth, so rebuild the job queue from it.

Each kind of work adds a *step* (webhook deliveries: free expired leases and requeue due rows with
no job; the outbox: relay what no relay took). The worker runs :meth:`Sweeper.sweep` periodically
(the local backend on its timer), and ``flask harvest sweep`` once. Running it more often, or in
several processes at once, is harmless: a claim in SQL decides who acts.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .errors import HarvestError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepReport:
    """What one sweep (or one of its steps) did: every step returns one, and a sweep adds them up."""

    #: Rows whose expired lease was released.
    released: int = 0
    #: Rows queued again because no job was waiting for them.
    requeued: int = 0
    #: Outbox messages relayed by this sweep (their after-commit relay never ran or failed).
    relayed: int = 0
    #: Outbox messages whose relay failed; they are tried again at the next sweep.
    relay_failed: int = 0
    #: Workflow executions ended ``TimedOut`` because their deadline passed.
    timed_out: int = 0
    #: Workflow executions failed as poison pills (their workers kept dying).
    poisoned: int = 0
    #: Workflow executions ended ``Cancelled`` because their worker died after a cancel was
    #: requested (also counted in ``released``): their code does not run again.
    cancelled: int = 0
    #: Completion-trigger fires rows deleted by the retention horizon.
    fires_purged: int = 0
    #: Workflow runs started by their schedules (one per cron tick).
    scheduled: int = 0
    #: Cross-shard completion-trigger targets started from the outbox by this sweep.
    trigger_starts: int = 0
    #: Cross-shard completion-trigger starts left in the outbox (a target shard is down).
    trigger_starts_waiting: int = 0
    #: Completion-trigger definitions written to or deleted from shards to match shard 0.
    triggers_repaired: int = 0

    def __add__(self, other: SweepReport) -> SweepReport:
        return SweepReport(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)}
        )


#: One kind of work's part of a sweep.
SweepStep = Callable[[], SweepReport]


class SweepError(HarvestError):
    """One or more steps of a sweep failed; the others ran.

    :param failed: the names of the steps that failed, in order.
    :param report: what the steps that did not fail did.
    """

    def __init__(self, failed: Sequence[str], reasons: Sequence[str], report: SweepReport) -> None:
        super().__init__(
            "sweep step(s) failed: " + "; ".join(f"{n} ({r})" for n, r in zip(failed, reasons, strict=True))
        )
        self.failed = tuple(failed)
        self.report = report


class Sweeper:
    """Runs every registered step; one step's failure never keeps the others from running."""

    def __init__(self) -> None:
        self._steps: list[tuple[str, SweepStep]] = []

    def __repr__(self) -> str:
        return f"<Sweeper steps={[name for name, _ in self._steps]}>"

    def add_step(self, name: str, step: SweepStep) -> None:
        """Run ``step`` in every sweep, after the steps added before it."""
        self._steps.append((name, step))

    def sweep(self) -> SweepReport:
        """Run one sweep and return what it did.

        :raises SweepError: a step failed (the store or the backend is down, or a bug), after the
            other steps ran; its cause is the first step's error.
        """
        total = SweepReport()
        failed: list[tuple[str, Exception]] = []
        for name, step in self._steps:
            try:
                total += step()
            except HarvestError as exc:
                log.error("harvest: sweep step %r failed (%s); the other steps go on", name, exc)
                failed.append((name, exc))
            except Exception as exc:  # a bug (here or in a delegate): the other kinds of work go on
                log.exception("harvest: sweep step %r failed; the other steps go on", name)
                failed.append((name, exc))
        if failed:
            # A foreign error's text may hold anything (a URL, a credential): only its type is shown.
            reasons = [str(exc) if isinstance(exc, HarvestError) else type(exc).__name__ for _, exc in failed]
            raise SweepError([name for name, _ in failed], reasons, total) from failed[0][1]
        return total
