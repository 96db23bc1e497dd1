"""Workflow executions and step checkpoints in SQL (SQLAlchemy 2 Core, PostgreSQL or SQLite).

:class:`SqlWorkflowStore` is what the runner, the service, completion callbacks, triggers and the
dashboard use. It is composed of parts that share one :class:`~._store_core.StoreCore` (the
database, the terminal hooks, the transactions): THE terminal transition
(:class:`~._store_core.TerminalTransition`), starts and ends from outside a run (:mod:`._runs`),
reads (:mod:`._reads`), claims, leases and step checkpoints (:mod:`._leases`), the sweeper's
queries (:mod:`._sweep`) and continue-as-new with its chains (:mod:`._chain`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from sqlalchemy import Connection, Engine

from . import _reads
from ._chain import MAX_CHAIN, Chains
from ._children import ChildRuns, ChildStart, ChildWait
from ._forks import Forks
from ._leases import Checkpoint, Leases, LeaseView
from ._queue_claims import PendingRow, QueueClaim, QueueClaims, QueueCounts
from ._reads import ExecutionReads
from ._runs import Runs
from ._store_core import OnStarted, StoreCore, TerminalTransition
from ._sweep import LeaseSweep, _SweepQueries
from .hooks import TerminalHook, TerminalHooks
from .models import (
    Execution,
    ExecutionState,
    ForkMode,
    IdReusePolicy,
    JsonValue,
    StepRecord,
    encode_json,
)
from .queues import QueueSpec, StartQueue

__all__ = [
    "Checkpoint",
    "ChildStart",
    "ChildWait",
    "ExecutionCursor",
    "LeaseSweep",
    "LeaseView",
    "SqlWorkflowStore",
]

#: A listing position: the ``(created_at, execution_id)`` of the last execution of a page.
ExecutionCursor = _reads.ExecutionCursor


class SqlWorkflowStore:
    """Executions and their step checkpoints, shared by every process through the database.

    :param engine: a SQLAlchemy engine on PostgreSQL or SQLite (a file database, so that threads
        and processes share it).
    :param hooks: the terminal hooks :meth:`finish` runs; a fresh empty registry if not given.
    :param on_started: called after commit with the ids of the executions that terminal hooks
        started inside a transaction the store owns (bind it to the job backend's schedule); errors
        are logged, and the sweeper's due scan queues those executions anyway.
    :param shard: the database's place among ``HARVEST_WORKFLOW_SHARDS`` (see
        :mod:`flask_harvest.shards`), or ``None`` when the deployment is not sharded.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        hooks: TerminalHooks | None = None,
        on_started: OnStarted | None = None,
        shard: int | None = None,
    ) -> None:
        self._core = StoreCore(engine, hooks=hooks, on_started=on_started, shard=shard)
        self.shard = shard
        self.db = self._core.db
        self.engine = engine
        self._terminal = TerminalTransition(self._core)
        self._reads = ExecutionReads(self._core)
        self._runs = Runs(self._core, self._terminal, self._reads)
        self._leases = Leases(self._core)
        self._sweeps = _SweepQueries(self._core, self._terminal)
        self._forks = Forks(self._core)
        self._chains = Chains(self._core, self._terminal)
        self._queues = QueueClaims(self._core)
        self._children = ChildRuns(self._core, self._terminal, self._runs, self._leases)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.engine.url.render_as_string(hide_password=True)}>"

    @property
    def hooks(self) -> TerminalHooks:
        """The terminal hooks :meth:`finish` runs in the transaction that ends an execution."""
        return self._core.hooks

    @hooks.setter
    def hooks(self, hooks: TerminalHooks) -> None:
        self._core.hooks = hooks

    @property
    def on_started(self) -> OnStarted | None:
        """Called after commit with the ids of the executions started in a transaction the store
        owns (see the class's parameters)."""
        return self._core.on_started

    @on_started.setter
    def on_started(self, on_started: OnStarted | None) -> None:
        self._core.on_started = on_started

    @staticmethod
    def started_in(conn: Connection) -> list[str]:
        """Return (and forget) the ids of the executions ``start(conn=conn)`` created in ``conn``'s
        transaction: schedule them once it has committed."""
        return StoreCore.started_in(conn)

    def can_start_in(self, conn: Connection, workflow_id: str) -> bool:
        """Whether a start of ``workflow_id`` may join ``conn``'s transaction (with shards, only on
        the database it routes to)."""
        return True

    def ensure_schema(self) -> None:
        """Create the workflow tables and indexes where they do not exist yet."""
        self._core.ensure_schema()

    # -- starting ------------------------------------------------------------------------------

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
        """Start a run of ``name``, or load the open run of ``workflow_id``.

        While a run with ``workflow_id`` is open it is returned (``created`` False); once closed,
        ``policy`` decides. At most one open run per ``workflow_id`` is enforced by a unique index,
        so concurrent starts give one run. The caller schedules a created run after commit; with
        ``conn``, :meth:`started_in` lists the runs created in it (and a terminal hook's starts are
        handed to ``on_started`` by the store itself).

        :param workflow_id: the business key; a fresh UUID when absent.
        :param conn: run inside the caller's transaction (the run exists once it commits).
        :param queue: the run's queue, concurrency key and limit, and priority (checked already).
        :returns: ``(execution, created)``.
        :raises WorkflowIdReusedError: ``policy`` refuses a new run after a closed one.
        :raises InvalidFieldError: ``input`` is not JSON, or too large (``InputTooLargeError``); the
            name or ``workflow_id`` is empty or longer than 255 characters, or ``workflow_id``
            holds a control character; an unknown policy.
        """
        return self._runs.start(
            name,
            input,
            workflow_id,
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
        """Start one run of ``name`` per input, all in one transaction with one INSERT; the caller
        schedules them after it (they are due at once).

        Every input is checked before any run is stored: one bad input starts none.

        :param workflow_ids: each run's key, which no run may have yet (the sharded store's keys
            made to route to this database); fresh UUIDs when absent.
        :returns: the runs, in the order of ``inputs``.
        :raises InvalidFieldError: ``inputs`` is not a list, an input is not JSON or too large
            (``InputTooLargeError``), the name or a key is not valid.
        :raises StoreError: the database refused (a key that has an open run among them).
        """
        return self._runs.start_many(
            name,
            inputs,
            workflow_ids,
            now=now,
            deadline=deadline,
            completion_callbacks=completion_callbacks,
            max_input_bytes=max_input_bytes,
            queue=queue,
        )

    # -- reading -------------------------------------------------------------------------------

    def get(self, execution_id: str) -> Execution | None:
        """Return the execution with this id, or ``None`` (also for an id no row could have)."""
        return self._reads.get(execution_id)

    def get_by_workflow_id(self, workflow_id: str) -> Execution | None:
        """Return the latest run of ``workflow_id`` (the open one if any), or ``None``."""
        return self._reads.get_by_workflow_id(workflow_id)

    def list_executions(
        self,
        *,
        name: str | None = None,
        state: ExecutionState | None = None,
        cursor: ExecutionCursor | None = None,
        limit: int = 100,
    ) -> list[Execution]:
        """Return executions newest first by ``(created_at, execution_id)``.

        :param cursor: return only executions after this position (the last one of the previous
            page: ``(execution.created_at, execution.execution_id)``).
        :raises InvalidFieldError: ``name`` is not text a workflow name could be.
        """
        return self._reads.list_executions(name=name, state=state, cursor=cursor, limit=limit)

    def count_executions(
        self, *, name: str | None = None, state: ExecutionState | None = None, cap: int
    ) -> int:
        """Return how many executions :meth:`list_executions` lists with these filters, counting at
        most ``cap`` (a bounded walk of the index its pages walk: a count equal to ``cap`` means
        "at least").

        :raises InvalidFieldError: ``name`` is not text a workflow name could be.
        """
        return self._reads.count_executions(name=name, state=state, cap=cap)

    def count_states(self, *, cap: int) -> dict[ExecutionState, int]:
        """Return how many executions are in each state, counting at most ``cap`` of each.

        Each count reads at most ``cap`` entries of an index that leads with ``state``, never the
        whole table (a page view must stay fast at millions of rows): a count equal to ``cap``
        means "at least".
        """
        return self._reads.count_states(cap=cap)

    def count_by_workflow(self, names: Sequence[str], *, cap: int) -> dict[tuple[str, ExecutionState], int]:
        """Return how many executions of each of ``names`` are in each state, counting at most
        ``cap`` of each pair (bounded walks of the ``(workflow_name, state)`` index)."""
        return self._reads.count_by_workflow(names, cap=cap)

    def list_steps(self, execution_id: str) -> list[StepRecord]:
        """Return the execution's step checkpoints in order."""
        return self._reads.list_steps(execution_id)

    def get_step(self, execution_id: str, seq: int) -> StepRecord | None:
        """Return the checkpoint at position ``seq``, or ``None``."""
        return self._reads.get_step(execution_id, seq)

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
        """Create a ``Pending`` fork of ``source_id``: a new run of its workflow with its input, its
        completion callbacks and trigger depth, whose checkpoints at positions below ``from_step``
        are copies of the source's, written in the transaction that inserts it. The source is not
        changed; an open source is forked as it is checkpointed now.

        The caller schedules the fork after this returns (as after :meth:`start`).

        :raises ExecutionNotFoundError: no execution has the id ``source_id``.
        :raises InvalidFieldError: ``from_step`` is not an integer from 0 to the source's number of
            checkpoints, or ``mode`` is not a :class:`ForkMode`.
        """
        return self._forks.fork(source_id, from_step, mode, now=now, deadline=deadline)

    # -- running -------------------------------------------------------------------------------

    def claim(
        self, execution_id: str, *, now: datetime, lease_seconds: float, alone: bool = False
    ) -> Execution | None:
        """Lease a due ``Pending`` execution to the caller: ``Running`` with a fresh lease token.

        :param alone: the caller runs nothing else in its process while it runs this one, so its
            process dying now is charged to it (``isolation`` becomes ``alone``); otherwise a
            quarantined run stays ``quarantined`` until :meth:`run_alone`.
        :returns: the claimed execution (its ``lease_token`` is the caller's), or ``None`` when it
            is not due, already running, terminal or absent.
        """
        return self._leases.claim(execution_id, now=now, lease_seconds=lease_seconds, alone=alone)

    def run_alone(self, execution_id: str, token: str, *, now: datetime, lease_seconds: float) -> bool:
        """Record that the caller now runs the execution alone in its process (a quarantined
        run's claim, once the runs beside it are done), and renew its lease.

        :returns: whether the execution is still running under ``token``.
        """
        return self._leases.run_alone(execution_id, token, now=now, lease_seconds=lease_seconds)

    def claim_many(
        self, execution_ids: Sequence[str], *, now: datetime, lease_seconds: float, alone: bool = False
    ) -> list[Execution]:
        """:meth:`claim` several executions in one statement (a worker's batch of jobs).

        Each claim is the same as :meth:`claim`'s; the rows share one fresh lease token, which is
        still new for each execution. Rows are locked in id order, so batches that overlap do not
        deadlock.

        :returns: the executions claimed, in id order (those not due, running, ended or absent are
            left out).
        """
        return self._leases.claim_many(execution_ids, now=now, lease_seconds=lease_seconds, alone=alone)

    def renew(
        self, execution_id: str, token: str, *, now: datetime, lease_seconds: float
    ) -> Execution | None:
        """Extend the caller's lease and return the row (to see a cancel request or the deadline).

        :returns: ``None`` when the lease is lost: the execution ended (terminated, timed out) or
            another worker holds it.
        """
        return self._leases.renew(execution_id, token, now=now, lease_seconds=lease_seconds)

    def heartbeat(self, execution_id: str, token: str, *, now: datetime, lease_seconds: float) -> bool:
        """Extend the caller's lease; ``False`` when it is lost (see :meth:`renew`)."""
        return self.renew(execution_id, token, now=now, lease_seconds=lease_seconds) is not None

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
        """Checkpoint step ``seq``'s result (or its ``error``) while the caller still runs the execution.

        The insert is guarded in SQL by the execution being ``Running`` under ``token`` (and, on
        PostgreSQL, share-locks that row), so once a terminate commits no checkpoint lands.

        :returns: whether the checkpoint was written.
        :raises InvalidFieldError: ``output`` is not a JSON value.
        """
        return self._leases.record_step(execution_id, token, seq, name, output=output, error=error, now=now)

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
        """Checkpoint step ``seq`` and read the execution's row, in one transaction; with
        ``lease_seconds``, renew the caller's lease in it too.

        The checkpoint lands only while the execution is ``Running`` under ``token``, holding its
        row (share-locked on PostgreSQL, or locked by the renewal's ``UPDATE``) until the commit,
        so once a terminate commits no checkpoint lands (as with :meth:`record_step`). What it read
        serves as the lease check of the next step's boundary. Without ``lease_seconds`` the row is
        not written: each write of it updates every index of the executions table.

        :returns: the row as read, or ``None`` when nothing was written: the lease is lost (ended,
            taken over) or position ``seq`` has a checkpoint already.
        :raises InvalidFieldError: ``output`` is not a JSON value.
        """
        return self._leases.checkpoint(
            execution_id, token, seq, name, output=output, error=error, now=now, lease_seconds=lease_seconds
        )

    def checkpoint_many(self, checkpoints: Sequence[Checkpoint]) -> list[LeaseView | None]:
        """Write checkpoints of any runs in one transaction: each result is what
        :meth:`checkpoint` would have returned for it alone (a run's checkpoints in their order).

        :meth:`checkpoint` goes through this: runs that checkpoint at once on a process's threads
        share one transaction, while a lone run writes at once.

        :raises InvalidFieldError: an ``output`` is not a JSON value (nothing is written).
        """
        return self._leases.checkpoint_many(checkpoints)

    def suspend(
        self, execution_id: str, token: str, *, wake_at: datetime, now: datetime | None = None
    ) -> bool:
        """Give the execution back until ``wake_at`` (a durable sleep): ``Pending``, lease released.

        Refused, in the same guarded UPDATE, when a cancel was requested or (given ``now``) the
        deadline passed since the caller last looked at the row: the caller ends the run at once
        instead of leaving it asleep with a cancel request or past its deadline until it wakes.

        :returns: whether the execution went to sleep (else nothing changed).
        """
        return self._leases.suspend(execution_id, token, wake_at=wake_at, now=now)

    # -- ending --------------------------------------------------------------------------------

    def request_cancel(self, execution_id: str, reason: str | None = None, *, now: datetime) -> Execution:
        """Cancel cooperatively: a ``Pending`` run ends ``Cancelled`` now; a ``Running`` one is
        flagged and ends ``Cancelled`` at its next step or sleep boundary. A terminal run is left
        as it is. The reason becomes the run's error and, only when one is given, its
        ``cancel_reason`` (what a completion trigger's outcome envelope reports).

        :returns: the execution after the request.
        :raises ExecutionNotFoundError: no execution has this id.
        :raises InvalidFieldError: ``reason`` is not storable text.
        """
        return self._runs.request_cancel(execution_id, reason, now=now)

    def terminate(self, execution_id: str, reason: str | None = None, *, now: datetime) -> Execution:
        """End an open execution ``Terminated`` at once; its running code can record nothing more.

        :returns: the execution after the call (unchanged if it had already ended).
        :raises ExecutionNotFoundError: no execution has this id.
        :raises InvalidFieldError: ``reason`` is not storable text.
        """
        return self._runs.terminate(execution_id, reason, now=now)

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
        """THE terminal transition: move an open execution to terminal ``state``, once.

        Only a ``Pending`` or ``Running`` row moves (and, with ``token``, only under that lease).
        When it lands, the terminal hooks run in the same transaction: what they write commits with
        the state change, and an exception from a hook rolls both back and propagates.

        :param output: the result, for ``Completed`` only.
        :param error: the error message, reason or cause, for the other terminal states.
        :param childless: the caller knows the run has no child runs (its runner saw all its
            checkpoints), so the end does not look for children to close.
        :returns: the execution after the transition, or ``None`` if it did not land.
        """
        return self._terminal.finish(
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
        """Claim up to ``count`` of the best eligible due runs of ``spec``'s queue (see
        :mod:`._queue_claims`): lower priority first, then older due time, within the queue's
        concurrency and rate limit and each run's concurrency-key limit.

        :param clock: the claim time, read once the queue's claims are serialised.
        :param alone: as :meth:`claim`'s.
        :returns: the claimed runs, and when a rate limit held runs back, when to try again.
        """
        return self._queues.claim(spec, count=count, clock=clock, lease_seconds=lease_seconds, alone=alone)

    def queue_counts(self, queue_name: str, *, now: datetime, cap: int) -> QueueCounts:
        """Return how many runs of a queue are running, waiting, and waiting and due, each count
        stopping at ``cap`` (it reads at most that many index entries)."""
        return self._queues.counts(queue_name, now=now, cap=cap)

    def pending_rows(self, execution_ids: Sequence[str]) -> list[PendingRow]:
        """Return the ``Pending`` rows among ``execution_ids`` (id, due time, queue), in one read."""
        return self._queues.pending_rows(execution_ids)

    def waiting(self, queue_name: str, *, now: datetime, limit: int) -> list[str]:
        """Return the ids of the best due ``Pending`` runs of a queue (its limits aside), best first."""
        return self._queues.waiting(queue_name, now=now, limit=limit)

    def due_queues(self, *, now: datetime, limit: int = 500) -> list[str]:
        """Return the names of the queues that have due ``Pending`` runs."""
        return self._queues.due_queues(now=now, limit=limit)

    # -- the sweeper ---------------------------------------------------------------------------

    def due_executions(self, *, now: datetime, limit: int = 500) -> list[tuple[str, datetime]]:
        """Return the ids and due times of ``Pending`` executions due at ``now``, oldest due first."""
        return self._sweeps.due_executions(now=now, limit=limit)

    def cancel_expired(self, *, now: datetime, limit: int = 500) -> list[str]:
        """End ``Cancelled`` the ``Running`` executions whose lease expired with a cancel requested
        (their worker died before their next boundary); return their ids."""
        return self._sweeps.cancel_expired(now=now, limit=limit)

    def expired_leases(self, *, now: datetime, max_recovery_attempts: int) -> LeaseSweep:
        """Requeue ``Running`` executions whose lease expired (their worker died), back to
        ``Pending`` (due now), ``recovery_count`` plus one, and quarantined (``isolation``
        ``quarantined``: it runs alone from now on). Only a run that ran alone (``isolation``
        ``alone``) is charged: ``charged_recoveries`` plus one, unless it was charged
        ``max_recovery_attempts`` times already: then it ends ``Failed`` as a poison pill. A run
        that died beside others is not charged."""
        return self._sweeps.expired_leases(now=now, max_recovery_attempts=max_recovery_attempts)

    def enforce_timeouts_once(self, *, now: datetime, limit: int = 500) -> list[str]:
        """End open executions whose deadline has passed as ``TimedOut``; return their ids."""
        return self._sweeps.enforce_timeouts_once(now=now, limit=limit)

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
        """End the run ``ContinuedAsNew`` and start the next run of its ``workflow_id``, at once.

        One transaction: the guarded UPDATE through THE terminal transition (only a ``Running`` run
        under ``token``, with no cancel requested and its deadline not passed; the terminal hooks
        run and see ``ContinuedAsNew``), then the INSERT of the successor: ``Pending``, due now,
        with ``input``, no checkpoints, and the run's deadline, completion callbacks, trigger depth,
        parent, queue, concurrency, priority and fork mode. ``continued_to`` and
        ``continued_from`` link the two. The caller schedules the successor after the call.

        :returns: ``(closed run, successor)``, or ``None`` if the guard refused: nothing changed.
        :raises InvalidFieldError: ``input`` is not a JSON value, or is larger than
            ``max_input_bytes`` (``InputTooLargeError``); nothing changed.
        """
        input_text = encode_json(input, field="input", max_bytes=max_input_bytes)
        return self._chains.continue_as_new(execution_id, token, input_text, now=now)

    def last_run(self, execution_id: str) -> Execution | None:
        """Return the last run of the chain from ``execution_id`` on, following ``continued_to``
        (the run itself if it did not continue as new), or ``None`` if there is no such run."""
        return self._chains.last_run(execution_id)

    def chain(self, execution_id: str, *, limit: int = MAX_CHAIN) -> list[Execution]:
        """Return the runs of ``execution_id``'s continue-as-new chain, first to last; of a chain
        longer than ``limit``, the ``limit`` most recent runs. Empty if there is no such run."""
        return self._chains.chain(execution_id, limit=limit)

    # -- child runs ----------------------------------------------------------------------------

    @property
    def children_hook(self) -> TerminalHook:
        """The terminal hook of child runs (the engine registers it once): it wakes a parent
        waiting for the run that ended, and applies the parent-close policy of its open children."""
        return self._children.terminal_hook

    def record_children(
        self,
        parent_id: str,
        token: str,
        starts: Sequence[ChildStart],
        outcomes: Sequence[tuple[int, JsonValue]] = (),
        *,
        now: datetime,
    ) -> tuple[list[Execution], LeaseView] | None:
        """Start (or load) children of ``parent_id`` and checkpoint each at its position, and
        checkpoint the outcomes of ended children it waited for, in one transaction guarded by the
        parent's lease (all or none).

        :returns: the children in order and the parent's row as read then, or ``None`` when the
            parent's lease is lost (nothing was written).
        """
        return self._children.record(parent_id, token, starts, outcomes, now=now)

    def child_outcome(self, execution_id: str) -> JsonValue:
        """The recorded form of a child's end (following its continue-as-new chain), or ``None``
        while it is open."""
        return self._children.outcome_of(execution_id)

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
        """Checkpoint the child's outcome at ``seq`` if it ended, else suspend the parent until it
        does (see :class:`ChildWait`)."""
        return self._children.wait_child(
            parent_id, token, seq, child_execution_id, child_workflow_id, now=now
        )

    def list_children(
        self, parent_id: str, *, cursor: ExecutionCursor | None = None, limit: int = 100
    ) -> list[Execution]:
        """Return the runs ``parent_id`` started as children, oldest first, after ``cursor``."""
        return self._children.list_children(parent_id, cursor=cursor, limit=limit)

    def wake_stranded(self, *, now: datetime, limit: int = 500) -> list[str]:
        """Wake the parents still waiting for a child that has ended; return their ids, to queue."""
        return self._children.wake_stranded(now=now, limit=limit)
