"""Workflow executions on several databases (``HARVEST_WORKFLOW_SHARDS``): one
:class:`~flask_harvest.workflows.store.SqlWorkflowStore` per shard behind one router.

:class:`ShardedWorkflowStore` is a ``SqlWorkflowStore`` to everything that uses one (the runner,
the service, the dashboard, the HTTP API): it sends a call about one run to the run's shard (the
shard its id names, see :mod:`flask_harvest.shards`), a start to the shard its ``workflow_id``
routes to, and a scan to every shard. Sweeps skip a shard whose database fails for a while
(:meth:`~flask_harvest._shard_set.ShardSet.each`); listings and counts need every shard and fail
with the down shard's error.

Its ``engine`` and ``db`` are shard 0's, the default shard, where the tables that are not
per-run (schedules) live and from which trigger definitions are read.
"""

from __future__ import annotations

import heapq
import itertools
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import TypeVar

from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from .._shard_set import ShardSet
from ..errors import ConfigurationError, InvalidFieldError, InvalidStateError
from ._chain import MAX_CHAIN
from ._children import ChildStart, ChildWait
from ._leases import Checkpoint, LeaseView, encode_checkpoint
from ._queue_claims import PendingRow, QueueClaim, QueueCounts
from ._schema import executions_table
from ._store_core import OnStarted, check_key
from ._sweep import LeaseSweep
from .hooks import TerminalHook, TerminalHooks
from .models import Execution, ExecutionState, ForkMode, IdReusePolicy, JsonValue, StepRecord, encode_json
from .queues import QueueSpec, StartQueue
from .store import ExecutionCursor, SqlWorkflowStore

__all__ = ["CrossShardStartError", "ShardedWorkflowStore", "open_workflow_store"]

T = TypeVar("T")


class CrossShardStartError(InvalidStateError):
    """A start inside a caller's transaction whose ``workflow_id`` routes to another shard's database
    (a transaction cannot span two databases)."""


class ShardedWorkflowStore(SqlWorkflowStore):
    """Executions on several shard databases, routed as :mod:`flask_harvest.shards` says.

    :param shards: the shard databases; each gets a ``SqlWorkflowStore`` of its own, all sharing
        one set of terminal hooks.
    :param hooks: the terminal hooks; a fresh empty registry if not given.
    """

    def __init__(
        self, shards: ShardSet, *, hooks: TerminalHooks | None = None, on_started: OnStarted | None = None
    ) -> None:
        shared = hooks if hooks is not None else TerminalHooks()
        # The base is shard 0's store: its engine and db are what other stores are built on.
        super().__init__(shards.engines[0], hooks=shared, on_started=on_started, shard=0)
        self.shards = shards
        self.stores = [
            SqlWorkflowStore(engine, hooks=shared, on_started=on_started, shard=index)
            for index, engine in enumerate(shards.engines)
        ]
        self._next_queue_shard = itertools.count()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.shards!r}>"

    def _of(self, execution_id: object) -> SqlWorkflowStore:
        return self.stores[self.shards.for_id(execution_id)]

    def _read_all(self, read: Callable[[SqlWorkflowStore], T]) -> list[T]:
        return [read(store) for store in self.stores]

    def _sweep_all(self, action: str, work: Callable[[SqlWorkflowStore], T]) -> list[T]:
        return self.shards.each(action, lambda shard: work(self.stores[shard]))

    # -- wiring --------------------------------------------------------------------------------

    @property
    def hooks(self) -> TerminalHooks:
        return self._core.hooks

    @hooks.setter
    def hooks(self, hooks: TerminalHooks) -> None:
        self._core.hooks = hooks
        for store in self.stores:
            store.hooks = hooks

    @property
    def on_started(self) -> OnStarted | None:
        return self._core.on_started

    @on_started.setter
    def on_started(self, on_started: OnStarted | None) -> None:
        self._core.on_started = on_started
        for store in self.stores:
            store.on_started = on_started

    def ensure_schema(self) -> None:
        for store in self.stores:
            store.ensure_schema()

    def close(self) -> None:
        """Release the connections of the shard engines this store made (not the app's own)."""
        for engine in self.shards.engines:
            if engine in self.shards.owned:
                engine.dispose()

    def check_layout(self) -> None:
        """Refuse a ``HARVEST_WORKFLOW_SHARDS`` list that changed since the shards were first used
        (:meth:`~flask_harvest._shard_set.ShardSet.check_layout`)."""
        self.shards.check_layout(executions=executions_table)

    def shard_of(self, conn: Connection) -> int | None:
        """The shard ``conn`` is a transaction on, or ``None``."""
        return self.shards.index_of(conn)

    # -- starting ------------------------------------------------------------------------------

    def can_start_in(self, conn: Connection, workflow_id: str) -> bool:
        return self.shards.index_of(conn) == self.shards.for_key(workflow_id)

    def start(
        self,
        name: str,
        input: JsonValue,
        workflow_id: str | None = None,
        policy: IdReusePolicy = IdReusePolicy.ALLOW_DUPLICATE,
        *,
        now: datetime,
        deadline: datetime | None = None,
        trigger_depth: int = 0,
        completion_callbacks: JsonValue = None,
        max_input_bytes: int | None = None,
        conn: Connection | None = None,
        queue: StartQueue | None = None,
    ) -> tuple[Execution, bool]:
        """:meth:`SqlWorkflowStore.start` on the shard ``workflow_id`` routes to.

        :raises CrossShardStartError: ``conn`` is a transaction on another database than that shard's.
        """
        key = workflow_id if workflow_id is not None else str(uuid.uuid4())
        shard = self.shards.for_key(key) if isinstance(key, str) else 0
        if conn is not None and self.shards.index_of(conn) != shard:
            raise CrossShardStartError(
                f"workflow_id {key!r} routes to shard {shard}, whose database this transaction is not on: "
                "start it outside the transaction (or on that shard's database)"
            )
        return self.stores[shard].start(
            name,
            input,
            key,
            policy,
            now=now,
            deadline=deadline,
            trigger_depth=trigger_depth,
            completion_callbacks=completion_callbacks,
            max_input_bytes=max_input_bytes,
            conn=conn,
            queue=queue,
        )

    def start_many(
        self,
        name: str,
        inputs: Sequence[JsonValue],
        workflow_ids: Sequence[str] | None = None,
        *,
        now: datetime,
        deadline: datetime | None = None,
        completion_callbacks: JsonValue = None,
        max_input_bytes: int | None = None,
        queue: StartQueue | None = None,
    ) -> list[Execution]:
        """:meth:`SqlWorkflowStore.start_many` on each shard for the runs whose keys route to it
        (one transaction per shard: a shard that refuses leaves the others' runs started).

        :returns: the runs, in the order of ``inputs``.
        """
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
            raise InvalidFieldError("inputs", f"must be a list of inputs, not {type(inputs).__name__}")
        keys = [str(uuid.uuid4()) for _ in inputs] if workflow_ids is None else list(workflow_ids)
        if len(keys) != len(inputs):
            raise InvalidFieldError("workflow_ids", "must be as many as the inputs")
        # Checked here, before any shard stores its runs: a bad input starts none.
        check_key("name", name)
        for value in inputs:
            encode_json(value, field="input", max_bytes=max_input_bytes)
        by_shard: dict[int, list[int]] = {}
        for position, key in enumerate(keys):
            by_shard.setdefault(self.shards.for_key(key) if isinstance(key, str) else 0, []).append(position)
        found: dict[int, Execution] = {}
        for shard, positions in by_shard.items():
            started = self.stores[shard].start_many(
                name,
                [inputs[p] for p in positions],
                [keys[p] for p in positions],
                now=now,
                deadline=deadline,
                completion_callbacks=completion_callbacks,
                max_input_bytes=max_input_bytes,
                queue=queue,
            )
            found.update(zip(positions, started, strict=True))
        return [found[position] for position in range(len(keys))]

    # -- reading -------------------------------------------------------------------------------

    def get(self, execution_id: str) -> Execution | None:
        return self._of(execution_id).get(execution_id)

    def get_by_workflow_id(self, workflow_id: str) -> Execution | None:
        # Its routed shard first; a child or a fork may live on its parent's or source's shard.
        first = self.shards.for_key(workflow_id) if isinstance(workflow_id, str) else 0
        order = [first, *(s for s in range(self.shards.count) if s != first)]
        for shard in order:
            found = self.stores[shard].get_by_workflow_id(workflow_id)
            if found is not None:
                return found
        return None

    def list_executions(
        self,
        *,
        name: str | None = None,
        state: ExecutionState | None = None,
        cursor: ExecutionCursor | None = None,
        limit: int = 100,
    ) -> list[Execution]:
        """Newest first across every shard. ``(created_at, execution_id)`` orders all runs of all
        shards, so the last row of a page is every shard's position: each shard's page after it is
        read, and the pages are merged."""
        pages = self._read_all(
            lambda s: s.list_executions(name=name, state=state, cursor=cursor, limit=limit)
        )
        merged = heapq.merge(*pages, key=lambda e: (e.created_at, e.execution_id), reverse=True)
        return list(itertools.islice(merged, max(limit, 0)))

    def count_executions(
        self, *, name: str | None = None, state: ExecutionState | None = None, cap: int
    ) -> int:
        counts = self._read_all(lambda s: s.count_executions(name=name, state=state, cap=cap))
        return min(sum(counts), cap)

    def count_states(self, *, cap: int) -> dict[ExecutionState, int]:
        totals: dict[ExecutionState, int] = {}
        for counts in self._read_all(lambda s: s.count_states(cap=cap)):
            for state, n in counts.items():
                totals[state] = totals.get(state, 0) + n
        # A count at the cap still means "at least": shards' capped counts add up to a lower bound.
        return {state: min(n, cap) for state, n in totals.items()}

    def count_by_workflow(self, names: Sequence[str], *, cap: int) -> dict[tuple[str, ExecutionState], int]:
        totals: dict[tuple[str, ExecutionState], int] = {}
        for counts in self._read_all(lambda s: s.count_by_workflow(names, cap=cap)):
            for pair, n in counts.items():
                totals[pair] = totals.get(pair, 0) + n
        return {pair: min(n, cap) for pair, n in totals.items()}

    def list_steps(self, execution_id: str) -> list[StepRecord]:
        return self._of(execution_id).list_steps(execution_id)

    def get_step(self, execution_id: str, seq: int) -> StepRecord | None:
        return self._of(execution_id).get_step(execution_id, seq)

    # -- forking -------------------------------------------------------------------------------

    def fork(
        self,
        source_id: str,
        from_step: int,
        mode: ForkMode = ForkMode.RECORDED,
        *,
        now: datetime,
        deadline: datetime | None = None,
    ) -> Execution:
        """:meth:`SqlWorkflowStore.fork` on the source's shard (the fork lives beside its source)."""
        return self._of(source_id).fork(source_id, from_step, mode, now=now, deadline=deadline)

    # -- running -------------------------------------------------------------------------------

    def claim(
        self, execution_id: str, *, now: datetime, lease_seconds: float, alone: bool = False
    ) -> Execution | None:
        return self._of(execution_id).claim(execution_id, now=now, lease_seconds=lease_seconds, alone=alone)

    def run_alone(self, execution_id: str, token: str, *, now: datetime, lease_seconds: float) -> bool:
        return self._of(execution_id).run_alone(execution_id, token, now=now, lease_seconds=lease_seconds)

    def claim_many(
        self, execution_ids: Sequence[str], *, now: datetime, lease_seconds: float, alone: bool = False
    ) -> list[Execution]:
        """:meth:`SqlWorkflowStore.claim_many` on each shard the ids name, in id order. A job's
        runs on a shard that is down are left there (the sweeper queues them once it is back), so
        that they neither fail nor hold up the job's runs on the other shards."""
        by_shard = self.shards.group(execution_ids)
        parts = self.shards.each(
            "claim runs",
            lambda shard: self.stores[shard].claim_many(
                by_shard[shard], now=now, lease_seconds=lease_seconds, alone=alone
            ),
            only=by_shard,
        )
        return sorted(itertools.chain.from_iterable(parts), key=lambda e: e.execution_id)

    def renew(
        self, execution_id: str, token: str, *, now: datetime, lease_seconds: float
    ) -> Execution | None:
        return self._of(execution_id).renew(execution_id, token, now=now, lease_seconds=lease_seconds)

    def heartbeat(self, execution_id: str, token: str, *, now: datetime, lease_seconds: float) -> bool:
        return self._of(execution_id).heartbeat(execution_id, token, now=now, lease_seconds=lease_seconds)

    def record_step(
        self,
        execution_id: str,
        token: str,
        seq: int,
        name: str,
        *,
        output: JsonValue = None,
        error: str | None = None,
        now: datetime,
    ) -> bool:
        return self._of(execution_id).record_step(
            execution_id, token, seq, name, output=output, error=error, now=now
        )

    def checkpoint(
        self,
        execution_id: str,
        token: str,
        seq: int,
        name: str,
        *,
        output: JsonValue = None,
        error: str | None = None,
        now: datetime,
        lease_seconds: float | None = None,
    ) -> LeaseView | None:
        return self._of(execution_id).checkpoint(
            execution_id, token, seq, name, output=output, error=error, now=now, lease_seconds=lease_seconds
        )

    def checkpoint_many(self, checkpoints: Sequence[Checkpoint]) -> list[LeaseView | None]:
        """:meth:`SqlWorkflowStore.checkpoint_many` on each shard the runs are on, one transaction
        per shard."""
        for checkpoint in checkpoints:
            encode_checkpoint(checkpoint)  # a bad output writes none, on any shard
        by_shard: dict[int, list[int]] = {}
        for index, checkpoint in enumerate(checkpoints):
            by_shard.setdefault(self.shards.for_id(checkpoint.execution_id), []).append(index)
        results: list[LeaseView | None] = [None] * len(checkpoints)
        for shard, indexes in by_shard.items():
            written = self.stores[shard].checkpoint_many([checkpoints[i] for i in indexes])
            for index, view in zip(indexes, written, strict=True):
                results[index] = view
        return results

    def suspend(
        self, execution_id: str, token: str, *, wake_at: datetime, now: datetime | None = None
    ) -> bool:
        return self._of(execution_id).suspend(execution_id, token, wake_at=wake_at, now=now)

    # -- ending --------------------------------------------------------------------------------

    def request_cancel(self, execution_id: str, reason: str | None = None, *, now: datetime) -> Execution:
        return self._of(execution_id).request_cancel(execution_id, reason, now=now)

    def terminate(self, execution_id: str, reason: str | None = None, *, now: datetime) -> Execution:
        return self._of(execution_id).terminate(execution_id, reason, now=now)

    def finish(
        self,
        execution_id: str,
        state: ExecutionState,
        *,
        output: JsonValue = None,
        error: str | None = None,
        now: datetime,
        token: str | None = None,
        conn: Connection | None = None,
        childless: bool = False,
    ) -> Execution | None:
        return self._of(execution_id).finish(
            execution_id,
            state,
            output=output,
            error=error,
            now=now,
            token=token,
            conn=conn,
            childless=childless,
        )

    # -- queues --------------------------------------------------------------------------------

    def claim_queued(
        self,
        spec: QueueSpec,
        *,
        count: int,
        clock: Callable[[], datetime],
        lease_seconds: float,
        alone: bool = False,
    ) -> QueueClaim:
        """Claim from each shard's part of the queue in turn, starting one shard further on each
        call so no shard's runs wait behind another's. A queue's limits hold on each shard."""
        first = next(self._next_queue_shard) % self.shards.count
        claimed: list[Execution] = []
        retry: list[datetime] = []
        for offset in range(self.shards.count):
            if len(claimed) >= count:
                break
            shard = (first + offset) % self.shards.count
            parts = self.shards.each(
                "claim queued runs",
                partial(self._claim_queued_on, spec, count - len(claimed), clock, lease_seconds, alone),
                only=[shard],
            )
            for part in parts:  # none when the shard is down
                claimed += part.claimed
                if part.retry_at is not None:
                    retry.append(part.retry_at)
        return QueueClaim(claimed, min(retry) if retry else None)

    def _claim_queued_on(
        self,
        spec: QueueSpec,
        count: int,
        clock: Callable[[], datetime],
        lease_seconds: float,
        alone: bool,
        shard: int,
    ) -> QueueClaim:
        return self.stores[shard].claim_queued(
            spec, count=count, clock=clock, lease_seconds=lease_seconds, alone=alone
        )

    def queue_counts(self, queue_name: str, *, now: datetime, cap: int) -> QueueCounts:
        """The sums of the shards that answer: the queue's sweep and claims go on while one is down."""
        parts = self._sweep_all(
            "count a queue's runs", lambda s: s.queue_counts(queue_name, now=now, cap=cap)
        )
        return QueueCounts(
            running=min(sum(p.running for p in parts), cap),
            waiting=min(sum(p.waiting for p in parts), cap),
            due=min(sum(p.due for p in parts), cap),
        )

    def pending_rows(self, execution_ids: Sequence[str]) -> list[PendingRow]:
        """Of the shards that answer: a job's misses on a shard that is down wait for the sweeper."""
        by_shard = self.shards.group(execution_ids)
        parts = self.shards.each(
            "read queued runs", lambda shard: self.stores[shard].pending_rows(by_shard[shard]), only=by_shard
        )
        return list(itertools.chain.from_iterable(parts))

    def waiting(self, queue_name: str, *, now: datetime, limit: int) -> list[str]:
        """Each shard's best waiting runs, taken in turns (shard 0's best, shard 1's best, ...), of
        the shards that answer."""
        parts = self._sweep_all("list a queue's runs", lambda s: s.waiting(queue_name, now=now, limit=limit))
        turns = itertools.chain.from_iterable(itertools.zip_longest(*parts))
        return [execution_id for execution_id in turns if execution_id is not None][: max(limit, 0)]

    def due_queues(self, *, now: datetime, limit: int = 500) -> list[str]:
        parts = self._sweep_all("list due queues", lambda s: s.due_queues(now=now, limit=limit))
        return sorted(set(itertools.chain.from_iterable(parts)))[: max(limit, 0)]

    # -- the sweeper ---------------------------------------------------------------------------

    def due_executions(self, *, now: datetime, limit: int = 500) -> list[tuple[str, datetime]]:
        parts = self._sweep_all("list due runs", lambda s: s.due_executions(now=now, limit=limit))
        merged = heapq.merge(*parts, key=lambda row: row[1])
        return list(itertools.islice(merged, max(limit, 0)))

    def cancel_expired(self, *, now: datetime, limit: int = 500) -> list[str]:
        parts = self._sweep_all("cancel runs", lambda s: s.cancel_expired(now=now, limit=limit))
        return list(itertools.chain.from_iterable(parts))

    def expired_leases(self, *, now: datetime, max_recovery_attempts: int) -> LeaseSweep:
        parts = self._sweep_all(
            "recover runs", lambda s: s.expired_leases(now=now, max_recovery_attempts=max_recovery_attempts)
        )
        return LeaseSweep(
            list(itertools.chain.from_iterable(p.requeued for p in parts)),
            list(itertools.chain.from_iterable(p.failed for p in parts)),
        )

    def enforce_timeouts_once(self, *, now: datetime, limit: int = 500) -> list[str]:
        parts = self._sweep_all("time out runs", lambda s: s.enforce_timeouts_once(now=now, limit=limit))
        return list(itertools.chain.from_iterable(parts))

    # -- continue-as-new -----------------------------------------------------------------------

    def continue_as_new(
        self,
        execution_id: str,
        token: str,
        input: JsonValue,
        *,
        now: datetime,
        max_input_bytes: int | None = None,
    ) -> tuple[Execution, Execution] | None:
        """:meth:`SqlWorkflowStore.continue_as_new` on the run's shard (the successor lives there too)."""
        return self._of(execution_id).continue_as_new(
            execution_id, token, input, now=now, max_input_bytes=max_input_bytes
        )

    def last_run(self, execution_id: str) -> Execution | None:
        return self._of(execution_id).last_run(execution_id)

    def chain(self, execution_id: str, *, limit: int = MAX_CHAIN) -> list[Execution]:
        return self._of(execution_id).chain(execution_id, limit=limit)

    # -- child runs ----------------------------------------------------------------------------

    @property
    def children_hook(self) -> TerminalHook:
        """The children hook of the shard the ending run is on (a child lives on its parent's)."""

        def hook(conn: Connection, execution: Execution) -> None:
            self._of(execution.execution_id).children_hook(conn, execution)

        return hook

    def record_children(
        self,
        parent_id: str,
        token: str,
        starts: Sequence[ChildStart],
        outcomes: Sequence[tuple[int, JsonValue]] = (),
        *,
        now: datetime,
    ) -> tuple[list[Execution], LeaseView] | None:
        """:meth:`SqlWorkflowStore.record_children` on the parent's shard, where its children live."""
        return self._of(parent_id).record_children(parent_id, token, starts, outcomes, now=now)

    def child_outcome(self, execution_id: str) -> JsonValue:
        return self._of(execution_id).child_outcome(execution_id)

    def wait_child(
        self,
        parent_id: str,
        token: str,
        seq: int,
        child_execution_id: str,
        child_workflow_id: str,
        *,
        now: datetime,
    ) -> ChildWait:
        return self._of(parent_id).wait_child(
            parent_id, token, seq, child_execution_id, child_workflow_id, now=now
        )

    def list_children(
        self, parent_id: str, *, cursor: ExecutionCursor | None = None, limit: int = 100
    ) -> list[Execution]:
        return self._of(parent_id).list_children(parent_id, cursor=cursor, limit=limit)

    def wake_stranded(self, *, now: datetime, limit: int = 500) -> list[str]:
        parts = self._sweep_all("wake parents", lambda s: s.wake_stranded(now=now, limit=limit))
        return list(itertools.chain.from_iterable(parts))


def open_workflow_store(app_engine: Engine, urls: Sequence[str]) -> SqlWorkflowStore:
    """The workflow store of a deployment: the app's database alone when ``urls`` is empty, else a
    :class:`ShardedWorkflowStore` on ``urls`` (a URL naming the app's own database reuses its
    engine, so that starts inside the app's transactions can land on that shard)."""
    if not urls:
        return SqlWorkflowStore(app_engine)
    own = app_engine.url.render_as_string(hide_password=False)
    engines: list[Engine] = []
    for index, url in enumerate(urls):
        try:
            same = make_url(url).render_as_string(hide_password=False) == own
            engines.append(app_engine if same else _engine(url))
        except (ArgumentError, ValueError, ImportError) as exc:
            for made in engines:
                if made is not app_engine:
                    made.dispose()
            # The exception's text may hold the URL and its password: only its kind is shown.
            raise ConfigurationError(
                f"HARVEST_WORKFLOW_SHARDS entry {index} is not a usable database URL ({type(exc).__name__})"
            ) from None
    return ShardedWorkflowStore(ShardSet(engines, owned=[e for e in engines if e is not app_engine]))


def _engine(url: str) -> Engine:
    if make_url(url).get_backend_name() == "postgresql":
        # A shard whose server does not answer must fail a connection in seconds, not minutes. No
        # pre-ping (a round trip per checkout): a dropped connection invalidates the pool anyway.
        return create_engine(url, connect_args={"connect_timeout": 5})
    return create_engine(url)
