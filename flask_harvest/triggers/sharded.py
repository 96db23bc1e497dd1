"""Completion triggers when ``HARVEST_WORKFLOW_SHARDS`` lists several databases.

Every shard holds every trigger definition, since a source's terminal transaction reads them on its
own shard; shard 0 is the copy that counts. Reads of definitions go to shard 0. A registration or a
deletion writes shard 0 (which must succeed) and then each other shard it can reach; a shard that
is down is skipped with a warning, and the sweeper's ``trigger-definitions`` step
(:meth:`ShardedTriggerStore.repair`) makes it match shard 0 once it is back. The fires ledger and
the cross-shard outbox live on each source's shard, so their reads and purges visit every shard.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TypeVar

from sqlalchemy import Engine

from .._shard_set import ShardSet
from ..errors import StoreError
from ..workflows.sharded import ShardedWorkflowStore
from ..workflows.store import SqlWorkflowStore
from .definitions import CompletionTrigger
from .store import Fire, SqlTriggerStore

__all__ = ["ShardedTriggerStore", "open_trigger_store"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class ShardedTriggerStore(SqlTriggerStore):
    """Trigger definitions on every shard, read from shard 0; ledger and outbox per shard.

    Its ``engine`` and ``db`` are shard 0's.
    """

    def __init__(self, shards: ShardSet) -> None:
        super().__init__(shards.engines[0])
        self.shards = shards
        self.stores = [SqlTriggerStore(engine) for engine in shards.engines]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.shards!r}>"

    @property
    def engines(self) -> list[Engine]:
        return list(self.shards.engines)

    def on_shard(self, shard: int) -> SqlTriggerStore:
        return self.stores[shard]

    def of_execution(self, execution_id: str) -> SqlTriggerStore:
        return self.stores[self.shards.for_id(execution_id)]

    def ensure_schema(self) -> None:
        for store in self.stores:
            store.ensure_schema()

    def _others(self, action: str, work: Callable[[SqlTriggerStore], T]) -> list[T]:
        """``work`` on every shard but 0 that answers; one that is down is skipped with a warning
        (the ``trigger-definitions`` sweep repairs it)."""
        done: list[T] = []
        for shard in range(1, self.shards.count):
            if not self.shards.available(shard):
                log.warning(
                    "harvest: could not %s on shard %d, which is unavailable; the sweeper copies "
                    "shard 0's completion triggers there when it is back",
                    action,
                    shard,
                )
                continue
            try:
                done.append(work(self.stores[shard]))
            except StoreError as exc:
                self.shards.failed(shard, exc)
                log.warning(
                    "harvest: could not %s on shard %d; the sweeper copies shard 0's completion "
                    "triggers there when it is back",
                    action,
                    shard,
                )
                continue
            self.shards.succeeded(shard)
        return done

    # -- definitions: shard 0 first, then every shard that answers ---------------------------

    def upsert(self, trigger: CompletionTrigger, *, now: datetime) -> CompletionTrigger:
        stored = self.stores[0].upsert(trigger, now=now)
        row = self.stores[0].get(trigger.id)
        if row is not None:
            self._others("register a completion trigger", lambda store: store.put([row]))
        return stored

    def sync(self, triggers: Sequence[CompletionTrigger], *, now: datetime) -> list[CompletionTrigger]:
        stored = self.stores[0].sync(triggers, now=now)
        ids = {trigger.id for trigger in triggers}
        rows = [row for row in self.stores[0].list_triggers() if row.id in ids]
        self._others("sync the static completion triggers", lambda store: store.put(rows))
        return stored

    def delete(self, trigger_id: str) -> bool:
        found = self.stores[0].delete(trigger_id)
        elsewhere = self._others("delete a completion trigger", lambda store: store.delete(trigger_id))
        return found or any(elsewhere)

    def repair(self) -> int:
        """Make every shard that answers hold exactly shard 0's definitions (the sweeper's
        ``trigger-definitions`` step). :returns: how many definitions were written or deleted."""
        rows = self.stores[0].list_triggers()
        changed = self.shards.each(
            "repair completion triggers",
            lambda shard: self.stores[shard].mirror(rows) if shard else 0,
        )
        return sum(changed)

    # -- the ledger and the outbox: every shard ----------------------------------------------

    def fires(
        self, *, trigger_id: str | None = None, source_exec_id: str | None = None, limit: int = 100
    ) -> list[Fire]:
        if source_exec_id is not None:
            # A fire row lives on its source's shard.
            store = self.of_execution(source_exec_id)
            return store.fires(trigger_id=trigger_id, source_exec_id=source_exec_id, limit=limit)
        every = [
            fire
            for store in self.stores
            for fire in store.fires(trigger_id=trigger_id, source_exec_id=None, limit=limit)
        ]
        every.sort(key=lambda fire: fire.source_exec_id)
        every.sort(key=lambda fire: fire.fired_at, reverse=True)
        return every[: max(0, limit)]

    def count_outcomes(self, outcomes: Sequence[str | None], *, cap: int) -> list[int]:
        totals = [0] * len(outcomes)
        for store in self.stores:
            for index, count in enumerate(store.count_outcomes(outcomes, cap=cap)):
                totals[index] += count
        # Capped counts still mean "at least".
        return [min(total, cap) for total in totals]

    def count_outbox(self, *, cap: int) -> int:
        return min(sum(store.count_outbox(cap=cap) for store in self.stores), cap)

    def purge_fires(self, *, before: datetime) -> int:
        purged = self.shards.each(
            "purge completion trigger fires", lambda shard: self.stores[shard].purge_fires(before=before)
        )
        return sum(purged)


def open_trigger_store(workflows: SqlWorkflowStore) -> SqlTriggerStore:
    """The trigger store beside a workflow store: on its database, or on each of its shards."""
    if isinstance(workflows, ShardedWorkflowStore):
        return ShardedTriggerStore(workflows.shards)
    return SqlTriggerStore(workflows.engine)
