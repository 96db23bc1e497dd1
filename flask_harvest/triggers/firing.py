"""The terminal hook that fires completion triggers inside the source's terminal transaction.

For each trigger of the workflow that just ended whose terminal states match, in the transaction
that moved the source to its terminal state:

1. a pair the ledger has decided already is ``deduped``;
2. a stored condition that no longer parses (or breaks the caps) is skipped as
   ``condition_invalid``: a warning, no ledger row, and the source's transition goes on;
3. an unmet condition writes the ledger row with outcome ``condition_unmet`` (``skipped``);
4. a target past ``HARVEST_TRIGGER_MAX_CHAIN_DEPTH`` writes the row with outcome
   ``chain_depth_exceeded``: a warning, and no start;
5. a target that cannot be started is ``payload_too_large`` (the mapped input is over the
   workflow input limit) or ``validation_failed`` (not JSON, an unknown target workflow): a
   warning and a ledger row with that outcome, which the CLI, the admin API and the dashboard
   show. That row leaves the pair open: a later evaluation that can start the target (once the
   workflow is registered, ``flask harvest triggers evaluate``) takes it over;
6. otherwise the ledger row (outcome NULL) is inserted (or takes over a failed start's), and only
   the transaction that wrote it starts the target, through start-or-load with the
   deterministic ``workflow_id`` ``completion-trigger-{trigger_id}-{source_exec_id}`` and the
   source's trigger depth plus one. Its job is queued after commit (the store's ``on_started``),
   and the sweeper's due scan covers a lost enqueue;
7. with shards, a target whose ``workflow_id`` routes to another shard than the source's is not
   started in the transaction: a cross-shard outbox row is written beside the ledger row instead
   (outcome ``deferred``), and :mod:`~flask_harvest.triggers.outbox` starts it after the commit
   (reporting ``started`` then, and naming the target on the ledger row), or its sweeper step does.

What happened is reported to the listener as :class:`FireEvent` values once the transaction
commits (never for a transaction that rolled back).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Connection, event

from .._time import utcnow
from ..conditions import evaluate, parse_condition
from ..errors import InvalidFieldError
from ..workflows.errors import InputTooLargeError
from ..workflows.models import Execution, ExecutionState, JsonValue, encode_json
from .definitions import parse_terminal_states
from .mappings import InputMapping, SourceOutcome, apply_mapping, parse_mapping
from .store import OutboxStart, SqlTriggerStore, StoredTrigger, loads_column

__all__ = [
    "FireEvent",
    "FireListener",
    "FireOutcome",
    "SkipReason",
    "TriggerCounters",
    "TriggerFiring",
    "target_workflow_id",
]

logger = logging.getLogger(__name__)


class FireOutcome(str, enum.Enum):
    """The ``outcome`` label of the ``harvest.completion_trigger.fires`` counter."""

    STARTED = "started"
    SKIPPED = "skipped"
    DEDUPED = "deduped"
    VALIDATION_FAILED = "validation_failed"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    CHAIN_DEPTH_EXCEEDED = "chain_depth_exceeded"
    #: Fired, the target on another shard: its start waits in the outbox (``started`` follows).
    DEFERRED = "deferred"


class SkipReason(str, enum.Enum):
    """The ``reason`` label of the ``harvest.completion_trigger.skipped`` counter."""

    CONDITION_UNMET = "condition_unmet"
    CONDITION_INVALID = "condition_invalid"


@dataclass(frozen=True)
class FireEvent:
    """What evaluating one trigger for one source execution did."""

    trigger_id: str
    source_exec_id: str
    outcome: FireOutcome
    #: Why it was skipped, for ``skipped``.
    reason: SkipReason | None = None
    #: The target execution, for ``started`` (and ``deduped`` when start-or-load found it open).
    target_execution_id: str | None = None
    target_workflow_name: str | None = None


#: Told about each :class:`FireEvent` after the transaction that produced it committed.
FireListener = Callable[[FireEvent], None]


class Starter(Protocol):
    """Starts (or loads) a workflow run in the caller's transaction: the runner's ``start``."""

    def __call__(
        self,
        name: str,
        input: JsonValue,
        *,
        workflow_id: str,
        trigger_depth: int,
        conn: Connection,
        queue: str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        priority: int | None = None,
    ) -> tuple[Execution, bool]: ...


class CrossShard(Protocol):
    """Where a target starts when the workflows are sharded (:class:`~.outbox.TriggerOutbox`)."""

    def target_shard(self, conn: Connection, workflow_id: str) -> int | None:
        """The target's shard when it is not ``conn``'s (the start must wait), else ``None``."""
        ...

    def defer(self, conn: Connection, start: OutboxStart) -> None:
        """Write the start in ``conn``'s transaction, to be made after the commit."""
        ...


#: Checks a target start's queue fields (``WorkflowRunner.placement``); raises
#: :class:`~flask_harvest.errors.InvalidFieldError` (an unknown queue) to refuse them.
Placer = Callable[..., object]


def target_workflow_id(trigger_id: str, source_exec_id: str) -> str:
    """The deterministic ``workflow_id`` of the target a (trigger, source execution) pair starts."""
    return f"completion-trigger-{trigger_id}-{source_exec_id}"


class TriggerCounters:
    """In-process counts of the two counters (what a metrics exporter reads), thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: ``harvest.completion_trigger.fires`` by outcome.
        self.fires: Counter[str] = Counter()
        #: ``harvest.completion_trigger.skipped`` by (trigger id, reason).
        self.skipped: Counter[tuple[str, str]] = Counter()

    def count(self, fired: FireEvent) -> None:
        with self._lock:
            self.fires[fired.outcome.value] += 1
            if fired.reason is not None:
                self.skipped[(fired.trigger_id, fired.reason.value)] += 1


class TriggerFiring:
    """The terminal hook: register it on the workflow store's :class:`TerminalHooks`.

    :param start: starts a target in the caller's transaction (``WorkflowRunner.start``).
    :param knows: whether a workflow name is registered (an unknown target is ``validation_failed``).
    :param max_chain_depth: the deepest trigger depth a target may have.
    :param max_input_bytes: the workflow input limit, to refuse an oversized mapped input up front.
    :param listener: told about each event once its transaction committed.
    :param place: checks the target start's queue fields before anything is written (an unknown
        queue is ``validation_failed``); none: not checked.
    :param cross_shard: with shards, how a target on another shard than the source's is started;
        none: every target starts in the source's transaction.
    """

    def __init__(
        self,
        store: SqlTriggerStore,
        start: Starter,
        *,
        knows: Callable[[str], bool],
        max_chain_depth: int,
        max_input_bytes: int,
        listener: FireListener | None = None,
        clock: Callable[[], datetime] = utcnow,
        place: Placer | None = None,
        cross_shard: CrossShard | None = None,
    ) -> None:
        self.place = place
        self.cross_shard = cross_shard
        self.store = store
        self.start = start
        self.knows = knows
        self.max_chain_depth = max_chain_depth
        self.max_input_bytes = max_input_bytes
        self.listener = listener
        self.clock = clock
        self.counters = TriggerCounters()
        self._key = f"harvest_trigger_events_{id(self)}"
        # Every database a terminal transaction may be on (each shard's).
        self._engines = store.engines
        for engine in self._engines:
            event.listen(engine, "commit", self._committed)
            event.listen(engine, "rollback", self._rolled_back)

    def __repr__(self) -> str:
        return f"<TriggerFiring max_chain_depth={self.max_chain_depth}>"

    def close(self) -> None:
        """Stop listening to the engine's transactions."""
        for engine in self._engines:
            for name, fn in (("commit", self._committed), ("rollback", self._rolled_back)):
                if event.contains(engine, name, fn):
                    event.remove(engine, name, fn)

    def __call__(self, conn: Connection, execution: Execution) -> None:
        self.evaluate(conn, execution)

    def evaluate(self, conn: Connection, execution: Execution) -> list[FireEvent]:
        """Evaluate every trigger of ``execution``'s workflow in the caller's transaction.

        :returns: what each matching trigger did (also reported to the listener after commit).
        """
        if not execution.notifies:  # open, ContinuedAsNew, or a fork that notifies no one
            return []
        events = []
        for stored in self.store.for_source(conn, execution.workflow_name):
            fired = self._evaluate_one(conn, execution, stored)
            if fired is not None:
                events.append(fired)
        if events:
            conn.info.setdefault(self._key, []).extend(events)
        return events

    def _evaluate_one(
        self, conn: Connection, execution: Execution, stored: StoredTrigger
    ) -> FireEvent | None:
        trigger_id = stored.id
        exec_id = execution.execution_id

        def outcome(
            kind: FireOutcome, reason: SkipReason | None = None, target: str | None = None
        ) -> FireEvent:
            return FireEvent(trigger_id, exec_id, kind, reason, target, stored.target_workflow_name)

        try:
            states = parse_terminal_states(loads_column(stored.terminal_states, "terminal_states"))
            if execution.state.value not in states:
                return None
            mapping = parse_mapping(loads_column(stored.input_mapping, "input_mapping"))
        except InvalidFieldError as exc:
            logger.warning(
                "completion trigger %s is not fired for source execution %s: its stored definition is "
                "invalid (%s); register it again",
                trigger_id,
                exec_id,
                exc,
            )
            return outcome(FireOutcome.VALIDATION_FAILED)
        if self.store.fire_decided(conn, exec_id, trigger_id):
            return outcome(FireOutcome.DEDUPED)
        now = self.clock()
        if stored.condition is not None:
            try:
                condition = parse_condition(loads_column(stored.condition, "condition"))
            except InvalidFieldError as exc:
                # Fail closed, and leave the pair undecided: a later re-evaluation may still fire it.
                logger.warning(
                    "completion trigger %s skipped for source execution %s: condition_invalid (%s); "
                    "the fire is lost unless the pair is evaluated again: start the target by hand "
                    "or fix the condition and run 'flask harvest triggers evaluate %s'",
                    trigger_id,
                    exec_id,
                    exc,
                    exec_id,
                )
                return outcome(FireOutcome.SKIPPED, SkipReason.CONDITION_INVALID)
            if not evaluate(condition, execution.output):
                recorded = self.store.record_fire(
                    conn, exec_id, trigger_id, outcome=SkipReason.CONDITION_UNMET.value, now=now
                )
                if not recorded:
                    return outcome(FireOutcome.DEDUPED)
                return outcome(FireOutcome.SKIPPED, SkipReason.CONDITION_UNMET)
        depth = execution.trigger_depth + 1
        if depth > self.max_chain_depth:
            if not self.store.record_fire(
                conn, exec_id, trigger_id, outcome=FireOutcome.CHAIN_DEPTH_EXCEEDED.value, now=now
            ):
                return outcome(FireOutcome.DEDUPED)
            logger.warning(
                "completion trigger %s did not start %r for source execution %s: the chain would be %d "
                "deep, past HARVEST_TRIGGER_MAX_CHAIN_DEPTH=%d (a trigger cycle?)",
                trigger_id,
                stored.target_workflow_name,
                exec_id,
                depth,
                self.max_chain_depth,
            )
            return outcome(FireOutcome.CHAIN_DEPTH_EXCEEDED)
        target_input = self._mapped_input(mapping, execution)
        refused = self._refusal(stored, target_input)
        if refused is not None:
            kind, why = refused
            if not self.store.record_fire(conn, exec_id, trigger_id, outcome=kind.value, now=now):
                return outcome(FireOutcome.DEDUPED)
            logger.warning(
                "completion trigger %s did not start %r for source execution %s: %s",
                trigger_id,
                stored.target_workflow_name,
                exec_id,
                why,
            )
            return outcome(kind)
        if not self.store.record_fire(conn, exec_id, trigger_id, outcome=None, now=now):
            return outcome(FireOutcome.DEDUPED)
        workflow_id = target_workflow_id(trigger_id, exec_id)
        elsewhere = self.cross_shard.target_shard(conn, workflow_id) if self.cross_shard else None
        if self.cross_shard is not None and elsewhere is not None:
            self.cross_shard.defer(
                conn,
                OutboxStart(
                    source_exec_id=exec_id,
                    trigger_id=trigger_id,
                    target_shard=elsewhere,
                    target_workflow_name=stored.target_workflow_name,
                    target_workflow_id=workflow_id,
                    target_input=encode_json(target_input, field="input", max_bytes=self.max_input_bytes),
                    max_workflow_input_bytes=self.max_input_bytes,
                    trigger_depth=depth,
                    created_at=now,
                    queue_name=stored.queue_name,
                    concurrency_key=stored.concurrency_key,
                    concurrency_limit=stored.concurrency_limit,
                    priority=stored.priority,
                ),
            )
            return outcome(FireOutcome.DEFERRED)
        target, created = self.start(
            stored.target_workflow_name,
            target_input,
            workflow_id=workflow_id,
            trigger_depth=depth,
            conn=conn,
            **stored.start_queue(),
        )
        self.store.set_target(conn, exec_id, trigger_id, target.execution_id)
        return outcome(FireOutcome.STARTED if created else FireOutcome.DEDUPED, target=target.execution_id)

    @staticmethod
    def _mapped_input(mapping: InputMapping, execution: Execution) -> JsonValue:
        source = SourceOutcome(
            execution.execution_id,
            execution.workflow_id,
            execution.workflow_name,
            execution.state.value,
            execution.output,
            # A cancel's error is its reason only when one was recorded (the store's placeholder
            # "cancelled" is not a reason); every other end keeps its message.
            execution.cancel_reason if execution.state is ExecutionState.CANCELLED else execution.error,
        )
        return apply_mapping(mapping, source)

    def _refusal(self, stored: StoredTrigger, target_input: JsonValue) -> tuple[FireOutcome, str] | None:
        if not self.knows(stored.target_workflow_name):
            return FireOutcome.VALIDATION_FAILED, "no workflow of that name is registered in this process"
        if self.place is not None:
            # Before the fire is recorded: a start refused later would fail the source's transition.
            try:
                self.place(stored.target_workflow_name, **stored.start_queue())
            except InvalidFieldError as exc:
                return FireOutcome.VALIDATION_FAILED, str(exc)
        try:
            encode_json(target_input, field="input", max_bytes=self.max_input_bytes)
        except InputTooLargeError as exc:
            return FireOutcome.PAYLOAD_TOO_LARGE, str(exc)
        except InvalidFieldError as exc:
            return FireOutcome.VALIDATION_FAILED, str(exc)
        except ValueError as exc:  # text with no UTF-8 encoding: never fail the source's transition
            return FireOutcome.VALIDATION_FAILED, f"the mapped input is not storable JSON ({exc})"
        return None

    # -- after commit --------------------------------------------------------------------------

    def _committed(self, conn: Any) -> None:
        events: list[FireEvent] = conn.info.pop(self._key, [])
        for fired in events:
            self.report(fired)

    def report(self, fired: FireEvent) -> None:
        """Count ``fired`` and tell the listener (its transaction has committed)."""
        self.counters.count(fired)
        if self.listener is not None:
            try:
                self.listener(fired)
            except Exception:
                logger.warning("a completion trigger listener failed on %s", fired, exc_info=True)

    def _rolled_back(self, conn: Any) -> None:
        conn.info.pop(self._key, None)
