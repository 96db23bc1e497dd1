"""Cross-shard target starts: the outbox beside the fires ledger, and its drain.

A target whose deterministic ``workflow_id`` routes to another shard than the source's cannot be
started in the source's terminal transaction (a transaction is on one database). Instead that
transaction writes a ``harvest_completion_trigger_outbox`` row beside the ledger row, and then:

- once it has committed, :meth:`TriggerOutbox.deliver` tries the start at once on the target shard;
- the sweeper's ``completion-triggers-outbox`` step (:meth:`TriggerOutbox.enforce_completion_triggers_outbox`)
  starts what that attempt did not (a worker killed after the commit, a target shard that was down).

A row is deleted in the transaction that took it (on PostgreSQL with ``FOR UPDATE SKIP LOCKED``, so
two drainers never take one row at once), after its target started. Delivery is at least once; the
target's deterministic ``workflow_id`` with :attr:`~flask_harvest.workflows.IdReusePolicy.REJECT_DUPLICATE`
makes a repeated start load the run the first one made, so there is exactly one target run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from sqlalchemy import Connection

from .._shard_set import ShardSet
from ..errors import HarvestError, StoreError
from ..workflows.errors import WorkflowIdReusedError
from ..workflows.hooks import after_commit
from ..workflows.models import Execution, IdReusePolicy, JsonValue
from .firing import FireEvent, FireOutcome
from .store import OutboxStart, SqlTriggerStore

__all__ = ["OutboxDrain", "TriggerOutbox"]

logger = logging.getLogger(__name__)

#: Rows one drain takes from one shard at a time.
BATCH = 100


class OutsideStarter(Protocol):
    """Starts (or loads) a run in a transaction of its own: the runner's ``start``."""

    def __call__(
        self,
        name: str,
        input: JsonValue,
        *,
        workflow_id: str,
        policy: IdReusePolicy,
        trigger_depth: int,
        queue: str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        priority: int | None = None,
        max_input_bytes: int | None = None,
    ) -> tuple[Execution, bool]: ...


@dataclass(frozen=True)
class OutboxDrain:
    """What draining did: targets started (or found started), and rows left for a later drain."""

    started: int = 0
    left: int = 0

    def __add__(self, other: OutboxDrain) -> OutboxDrain:
        return OutboxDrain(self.started + other.started, self.left + other.left)


class TriggerOutbox:
    """The cross-shard starts of one sharded deployment.

    :param store: the trigger store (its :meth:`~SqlTriggerStore.on_shard` gives each shard's).
    :param shards: the shard databases, to route and to skip a shard that is down.
    :param start: starts a target on the shard its ``workflow_id`` routes to.
    :param listener: told about each start once its row is gone (``started``, or ``deduped`` when
        an earlier attempt had started it); the firing's reporter.
    :param known: the workflows this process can start: a drain takes only their rows, so rows
        of a workflow it does not know (a deployment rolling out) never crowd out the others.
    """

    def __init__(
        self,
        store: SqlTriggerStore,
        shards: ShardSet,
        start: OutsideStarter,
        *,
        listener: Callable[[FireEvent], None] | None = None,
        known: Callable[[], Collection[str]] | None = None,
        batch: int = BATCH,
    ) -> None:
        self.known = known
        self.store = store
        self.shards = shards
        self.start = start
        self.listener = listener
        self.batch = batch

    def __repr__(self) -> str:
        return f"<TriggerOutbox {self.shards!r}>"

    def target_shard(self, conn: Connection, workflow_id: str) -> int | None:
        """The shard a target must be started on outside ``conn``'s transaction, or ``None`` when
        it can start in it (same shard)."""
        source = self.shards.index_of(conn)
        target = self.shards.for_key(workflow_id)
        return None if source is None or source == target else target

    def defer(self, conn: Connection, start: OutboxStart) -> None:
        """Write ``start`` in the source's transaction; try it at once after the commit."""
        source = self.shards.index_of(conn)
        row_id = self.store.write_outbox(conn, start)
        if source is not None:
            after_commit(conn, partial(self.deliver, source, row_id))

    def deliver(self, shard: int, row_id: str) -> None:
        """Try one row's start now (after its source committed). Never raises: a row it could not
        start stays for the sweeper."""
        try:
            self._drain(shard, [row_id])
        except HarvestError as exc:
            logger.warning(
                "harvest: the cross-shard completion-trigger start %s waits for the sweeper (%s)", row_id, exc
            )

    def enforce_completion_triggers_outbox(self) -> OutboxDrain:
        """The sweeper's step: on every shard that answers, start the oldest waiting rows' targets.
        A target shard that is down leaves its rows for the next sweep and slows no other shard."""
        parts = self.shards.each(
            "drain the completion trigger outbox", lambda shard: self._drain(shard, None)
        )
        total = OutboxDrain()
        for part in parts:
            total += part
        return total

    def _drain(self, shard: int, ids: list[str] | None) -> OutboxDrain:
        store = self.store.on_shard(shard)
        events: list[FireEvent] = []
        left = 0
        down: set[int] = set()
        # The rows stay locked while their targets start (short transactions on other databases,
        # never an outside call): the lock is what keeps a second drainer off them. A shard that
        # failed lately is not even tried, so a down shard holds them for no connect timeout.
        with store.db.transaction("drain the completion trigger outbox") as conn:
            names = None if self.known is None else list(self.known())
            for row in store.take_outbox(conn, limit=self.batch, ids=ids, names=names):
                if row.target_shard in down or not self.shards.available(row.target_shard):
                    left += 1
                    continue
                try:
                    target_id, created = self._start(row)
                except StoreError as exc:
                    # Its shard is down: its other rows wait too, without a connection attempt each.
                    self.shards.failed(row.target_shard, exc)
                    down.add(row.target_shard)
                    left += 1
                    continue
                except HarvestError as exc:
                    # The target workflow or queue is unknown to this process: another may start it.
                    logger.warning(
                        "harvest: could not start %r for completion trigger %s of source execution "
                        "%s: %s; the start stays in the outbox",
                        row.target_workflow_name,
                        row.trigger_id,
                        row.source_exec_id,
                        exc,
                    )
                    left += 1
                    continue
                self.shards.succeeded(row.target_shard)
                store.started_outbox(conn, row, target_id)
                outcome = FireOutcome.STARTED if created else FireOutcome.DEDUPED
                events.append(
                    FireEvent(
                        row.trigger_id, row.source_exec_id, outcome, None, target_id, row.target_workflow_name
                    )
                )
        for fired in events:
            if self.listener is not None:
                self.listener(fired)
        return OutboxDrain(len(events), left)

    def _start(self, row: OutboxStart) -> tuple[str, bool]:
        """Start a row's target on its shard: ``(execution id, created)``.

        :raises StoreError: the target's shard is down.
        :raises HarvestError: the target cannot be started by this process.
        """
        try:
            target, created = self.start(
                row.target_workflow_name,
                json.loads(row.target_input),
                workflow_id=row.target_workflow_id,
                # Any run of this id is the target (its id is the pair's): never a second one,
                # even when the first has ended since.
                policy=IdReusePolicy.REJECT_DUPLICATE,
                trigger_depth=row.trigger_depth,
                # The limit the fire checked the input against, whatever this process's is.
                max_input_bytes=row.max_workflow_input_bytes,
                **row.start_queue(),
            )
        except WorkflowIdReusedError as exc:
            return exc.previous_execution_id, False
        return target.execution_id, created
