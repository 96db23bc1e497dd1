"""Completion deliveries when ``HARVEST_WORKFLOW_SHARDS`` lists several databases.

A delivery row lives on its execution's shard: the terminal transition inserts it in the run's own
transaction, and its id is made beside the execution's (:func:`~flask_harvest.shards.new_id_beside`),
so the id alone names the shard. :class:`ShardedCallbackStore` sends a call about one delivery (or
one execution's deliveries) to that shard, the sweeper's scans to every shard that answers
(:meth:`~flask_harvest._shard_set.ShardSet.each`), and merges the operators' lists and counts of
every shard.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import Connection

from .._shard_set import ShardSet
from ..outbound.attempt import DeliveryState, Verdict
from ..outbound.backoff import RetryPolicy
from .store import CompletionDelivery, NewDelivery, SqlCallbackStore

__all__ = ["ShardedCallbackStore"]


class ShardedCallbackStore(SqlCallbackStore):
    """One :class:`SqlCallbackStore` per shard behind one router; its own ``engine`` and ``db`` are
    shard 0's."""

    def __init__(self, shards: ShardSet) -> None:
        super().__init__(shards.engines[0])
        self.shards = shards
        self.stores = [SqlCallbackStore(engine) for engine in shards.engines]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.shards!r}>"

    def _of(self, identifier: object) -> SqlCallbackStore:
        return self.stores[self.shards.for_id(identifier)]

    def ensure_schema(self) -> None:
        for store in self.stores:
            store.ensure_schema()

    # -- enqueue -------------------------------------------------------------------------------

    def insert(
        self, conn: Connection, rows: Sequence[NewDelivery], policy: RetryPolicy, now: datetime
    ) -> list[str]:
        # ``conn`` is the run's terminal transaction, on the run's shard: the rows go beside it.
        shard = self.shards.index_of(conn)
        store = self.stores[shard] if shard is not None else self._of(rows[0].execution_id if rows else "")
        return store.insert(conn, rows, policy, now)

    # -- delivery (workers and the sweeper: a shard that is down is skipped) --------------------

    def claim(
        self, ids: Sequence[str] | None, *, now: datetime, lease_seconds: float, limit: int = 100
    ) -> list[CompletionDelivery]:
        if ids is None:
            # Shard by shard, each for what is left of ``limit``: a claim is committed once made,
            # so a row claimed beyond it would wait out its lease unsent.
            claimed: list[CompletionDelivery] = []
            for shard in range(self.shards.count):
                left = limit - len(claimed)
                if left <= 0:
                    break
                claimed += itertools.chain.from_iterable(
                    self.shards.each(
                        "claim completion deliveries",
                        partial(self._claim_any, now=now, lease_seconds=lease_seconds, limit=left),
                        only=[shard],
                    )
                )
            return claimed
        groups = self.shards.group(ids)
        # A job's rows on a shard that is down stay due there; the sweeper queues them once it is back.
        parts = self.shards.each(
            "claim completion deliveries",
            lambda s: self.stores[s].claim(groups[s], now=now, lease_seconds=lease_seconds, limit=limit),
            only=groups,
        )
        return list(itertools.chain.from_iterable(parts))

    def _claim_any(
        self, shard: int, *, now: datetime, lease_seconds: float, limit: int
    ) -> list[CompletionDelivery]:
        return self.stores[shard].claim(None, now=now, lease_seconds=lease_seconds, limit=limit)

    def record(
        self, delivery: CompletionDelivery, outcome: Verdict, *, now: datetime
    ) -> CompletionDelivery | None:
        return self._of(delivery.delivery_id).record(delivery, outcome, now=now)

    def give_back(self, delivery: CompletionDelivery, *, due: datetime, now: datetime) -> bool:
        return self._of(delivery.delivery_id).give_back(delivery, due=due, now=now)

    def due(self, now: datetime, limit: int = 1000) -> list[CompletionDelivery]:
        parts = self.shards.each("list due completion deliveries", lambda s: self.stores[s].due(now, limit))
        merged = heapq.merge(*parts, key=_due_key)
        return list(itertools.islice(merged, max(limit, 0)))

    # -- reads and redrive (operators: every shard, or the down shard's error) -------------------

    def get(self, delivery_id: str) -> CompletionDelivery | None:
        return self._of(delivery_id).get(delivery_id)

    def list_for_execution(self, execution_id: str) -> list[CompletionDelivery]:
        return self._of(execution_id).list_for_execution(execution_id)

    def count_states(self, *, cap: int) -> dict[DeliveryState, int]:
        totals: dict[DeliveryState, int] = {}
        for store in self.stores:
            for state, n in store.count_states(cap=cap).items():
                totals[state] = totals.get(state, 0) + n
        # Each shard counts at most ``cap``; the sum keeps the same "at least ``cap``" meaning.
        return {state: min(n, cap) for state, n in totals.items()}

    def count_failed(self, *, cap: int) -> int:
        return min(sum(store.count_failed(cap=cap) for store in self.stores), cap)

    def failed_page(
        self, *, limit: int, before: tuple[datetime, str] | None = None
    ) -> list[CompletionDelivery]:
        # ``(updated_at, delivery_id)`` orders every shard's rows: each shard's page after the
        # position, merged, is the page of all of them.
        pages = [store.failed_page(limit=limit, before=before) for store in self.stores]
        merged = heapq.merge(*pages, key=lambda d: (d.updated_at, d.delivery_id), reverse=True)
        return list(itertools.islice(merged, max(limit, 0)))

    def redrive_selected(self, delivery_ids: Sequence[str], *, now: datetime) -> list[CompletionDelivery]:
        redriven: list[CompletionDelivery] = []
        for shard, ids in sorted(self.shards.group(delivery_ids).items()):
            redriven += self.stores[shard].redrive_selected(ids, now=now)
        return redriven

    def dead_letter(self, delivery_id: str) -> dict[str, Any] | None:
        return self._of(delivery_id).dead_letter(delivery_id)

    def redrive(
        self, execution_id: str, delivery_id: str, *, now: datetime
    ) -> CompletionDelivery | str | None:
        # The delivery's id names its shard; a delivery id of another execution's shard is not found.
        return self._of(delivery_id).redrive(execution_id, delivery_id, now=now)

    def redrive_failed(
        self, *, now: datetime, window_seconds: float, limit: int = 10_000
    ) -> list[CompletionDelivery]:
        redriven: list[CompletionDelivery] = []
        for store in self.stores:
            if len(redriven) >= limit:
                break
            redriven += store.redrive_failed(
                now=now, window_seconds=window_seconds, limit=limit - len(redriven)
            )
        return redriven


def _due_key(delivery: CompletionDelivery) -> datetime:
    # ``due`` lists pending rows by next_attempt_at; an in-flight row with an expired lease has one
    # too (it was due when claimed), and a row without one sorts by when it was written.
    return delivery.next_attempt_at or delivery.updated_at
