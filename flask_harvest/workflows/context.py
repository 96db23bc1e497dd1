"""What a workflow function gets: ``ctx.step`` (checkpointed, replayed), ``ctx.sleep`` (durable) and
``ctx.continue_as_new`` (hand over to a fresh run of the same ``workflow_id``).

A run replays the function from the top: each ``ctx.step`` takes the next position; a position with
a checkpoint returns it (or raises its error again) without running the step, a fresh position runs
the step and checkpoints it. Before each step and sleep (a *boundary*) the context renews the lease
and looks at the row: a cancel request ends the run ``Cancelled``, a passed deadline ``TimedOut``, and
a lost lease (terminated, or taken over) stops the code without writing anything.

Each checkpoint reads the row in its own transaction (and renews the lease there once a third of it
has passed since the claim or the last renewal; the heartbeat thread renews it too). When the workflow code
reaches its next boundary within :data:`FRESH_SECONDS` of that read (or of the claim), the boundary
acts on that read instead of renewing again: one statement per step instead of two. The deadline is
always checked against the current time.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NoReturn, TypeVar

from .. import tracing
from .._input import check_id, text_problem
from ..errors import InvalidFieldError, InvalidStateError
from ..outbound.backoff import retry_delay_ms
from ..shards import new_id_beside
from .children import CHILD_STEP, WAIT_CHILD_STEP, ChildHandle, child_result, child_workflow_id
from .errors import ForkNotRecordedError, NonDeterminismError, StepFailedError, WorkflowError
from .models import (
    Execution,
    ExecutionState,
    ForkMode,
    JsonValue,
    ParentClosePolicy,
    StepRecord,
    decode_json,
    describe_error,
    encode_json,
    timeout_message,
)
from .registry import WorkflowRegistry
from .store import ChildStart, LeaseView, SqlWorkflowStore

__all__ = ["FRESH_SECONDS", "StepRetryPolicy", "WorkflowContext"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The checkpoint name of ``ctx.sleep``; user step names may not start with ``harvest:``.
SLEEP_STEP = "harvest:sleep"
_MAX_STEP_NAME = 255
#: How long the row read by a checkpoint (or the claim) serves as the next boundary's lease check.
FRESH_SECONDS = 0.05


class _Unwind(BaseException):
    """Stops the workflow function without it being an error of the workflow.

    A ``BaseException``, so that ``except Exception`` in workflow code cannot swallow it.
    """


class _Suspended(_Unwind):
    """The run went to sleep durably: the row is ``Pending`` until its wake time."""


class _Stopped(_Unwind):
    """The run must stop: it ended (cancelled, timed out, terminated) or its lease is lost."""


class _ContinuedAsNew(_Unwind):
    """The run closed ``ContinuedAsNew``; its successor is stored and queued."""


class _EngineFailed(_Unwind):
    """One of the engine's own calls (the store, a terminal hook) failed under the workflow code.

    A ``BaseException``, so that workflow code that catches ``Exception`` around a step cannot take
    a database outage for the step's failure (and, say, compensate for a charge that never ran).
    The runner raises :attr:`error` again and leaves the run open for recovery.
    """

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


@contextmanager
def _engine_call() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        raise _EngineFailed(exc) from exc


@dataclass(frozen=True)
class StepRetryPolicy:
    """How long a step waits between retries: full-jitter exponential backoff (``backoff.py``)."""

    initial_ms: int = 1000
    max_ms: int = 60_000


class WorkflowContext:
    """The handle a workflow function gets; built by the runner for one run of one execution."""

    def __init__(
        self,
        execution: Execution,
        token: str,
        store: SqlWorkflowStore,
        *,
        steps: dict[int, StepRecord],
        clock: Callable[[], datetime],
        lease_seconds: float,
        retry: StepRetryPolicy,
        schedule: Callable[[str, datetime | None], None],
        wait: Callable[[float], None],
        lease: LeaseView | None = None,
        recorded: dict[int, StepRecord] | None = None,
        registry: WorkflowRegistry | None = None,
        max_input_bytes: int | None = None,
    ) -> None:
        self._execution = execution
        # What a child's start needs: whether its workflow exists, its timeout, the input limit.
        self._registry = registry
        self._max_input_bytes = max_input_bytes
        # Children started and not written yet: they are written together, with their checkpoints,
        # before the next step, sleep or wait, or the end (one transaction instead of one each).
        self._unwritten: list[tuple[ChildStart, ChildHandle]] = []
        # Outcomes of ended children waited for and not checkpointed yet, written with them.
        self._unwritten_waits: list[tuple[int, JsonValue]] = []
        self._began_child = False
        self._token = token
        self._store = store
        self._steps = steps
        # A fork in mode recorded: the source run's checkpoints from the fork point on, which the
        # positions this run has not checkpointed yet return instead of running (any step name:
        # steps, sleeps, and whatever else the engine checkpoints).
        self._recorded = recorded
        self._clock = clock
        self._lease_seconds = lease_seconds
        self._retry = retry
        self._schedule = schedule
        self._wait = wait
        self._seq = 0
        self._in_step = False
        # The row as the claim or the last checkpoint read it, and when (monotonic seconds).
        self._lease = lease
        self._lease_read_at = time.monotonic()
        # When this run last extended its lease (the claim did, at the run's start).
        self._renewed_at = clock()
        #: A non-determinism error (or a recorded fork's missing position), kept even if the
        #: workflow code catches it.
        self.fatal: WorkflowError | None = None

    def __repr__(self) -> str:
        return f"<WorkflowContext {self.workflow_name} {self.execution_id}>"

    @property
    def execution_id(self) -> str:
        return self._execution.execution_id

    @property
    def workflow_id(self) -> str:
        return self._execution.workflow_id

    @property
    def workflow_name(self) -> str:
        return self._execution.workflow_name

    @property
    def may_have_children(self) -> bool:
        """Whether this run may have child runs: it began one, or one of its checkpoints (or of
        the source it replays) records one. Its end looks for children to close only then."""
        if self._began_child:
            return True
        replayed = self._recorded.values() if self._recorded else ()
        return any(step.name == CHILD_STEP for step in (*self._steps.values(), *replayed))

    @property
    def attempt(self) -> int:
        """How many times this execution was claimed, this run included."""
        return self._execution.attempt

    def step(
        self,
        name: str,
        fn: Callable[..., T],
        *args: Any,
        retries: int = 0,
        backoff: StepRetryPolicy | None = None,
        **kwargs: Any,
    ) -> T:
        """Run ``fn(*args, **kwargs)`` once and checkpoint its JSON result; on a replay, return it.

        :param name: names the step; a replay must meet the same name at the same position.
        :param retries: how many times to run ``fn`` again after it raised (with backoff).
        :raises StepFailedError: ``fn`` raised on its last try (also on every replay of it).
        :raises NonDeterminismError: the checkpoint at this position has another name.
        """
        if (
            not isinstance(name, str)
            or not name
            or len(name) > _MAX_STEP_NAME
            or name.startswith("harvest:")
            or text_problem(name) is not None
        ):
            raise InvalidFieldError(
                "name",
                f"a step name is 1 to {_MAX_STEP_NAME} characters of valid Unicode text without "
                f"NUL, not starting with 'harvest:'; got {name!r}",
            )
        if retries < 0:
            raise InvalidFieldError("retries", f"must be 0 or more, not {retries}")
        self._refuse_inside_step("ctx.step")
        seq = self._next_position()
        recorded = self._replay(seq, name)
        if recorded is not None:
            # A replayed position does no work: no boundary (the claim has just read the row).
            if recorded.error is not None:
                raise StepFailedError(name, recorded.error)
            output: T = recorded.output
            return output
        self._write_pending()
        self._boundary()
        policy = backoff or self._retry
        attempt = 0
        while True:
            try:
                self._in_step = True
                try:
                    with tracing.workflow_step(name, seq, attempt + 1):
                        result = fn(*args, **kwargs)
                finally:
                    self._in_step = False
                # What a replay will return: the first run sees the same value, not a look-alike
                # (a str enum member comes back as a str).
                result = decode_json(encode_json(result, field=f"step {name!r} result"))
            except Exception as exc:
                attempt += 1
                # A result that is not JSON is a bug of the step: trying again would not help.
                if attempt <= retries and not isinstance(exc, InvalidFieldError):
                    self._wait(retry_delay_ms(attempt, policy.initial_ms, policy.max_ms) / 1000)
                    self._boundary(renew=True)
                    continue
                # Storable as it is, so that the first run and every replay raise the same message.
                message = describe_error(exc)
                self._record(seq, name, error=message)
                raise StepFailedError(name, message) from exc
            self._record(seq, name, output=result)
            return result

    def sleep(self, duration: timedelta | float) -> None:
        """Sleep durably: the worker is given back and the run resumes at the wake time.

        The wake time is checkpointed by the first run, so a replay sleeps until the same moment.

        :param duration: a ``timedelta`` or seconds, 0 or more.
        :raises InvalidFieldError: ``duration`` is negative, not finite, not a number, or so long
            that the wake time is past the year 9999.
        """
        delta = self._sleep_delta(duration)
        self._refuse_inside_step("ctx.sleep")
        seq = self._next_position()
        recorded = self._replay(seq, SLEEP_STEP)
        if recorded is not None:
            wake_at = datetime.fromisoformat(recorded.output)
            if self._clock() >= wake_at:
                return
            self._boundary()
        else:
            self._write_pending()
            self._boundary()
            wake_at = self._clock() + delta
            self._record(seq, SLEEP_STEP, output=wake_at.isoformat())
            if self._clock() >= wake_at:
                return
        with _engine_call():
            slept = self._store.suspend(self.execution_id, self._token, wake_at=wake_at, now=self._clock())
        if not slept:
            # A cancel request or the deadline landed since the boundary (or the lease is lost):
            # the boundary, reading the row afresh, ends the run now rather than at its wake time.
            self._boundary(renew=True)
            raise _Stopped
        try:
            self._schedule(self.execution_id, wake_at)
        except Exception:
            # The row is Pending with its wake time: the sweeper's due scan queues it anyway.
            logger.warning(
                "could not schedule workflow execution %s at %s", self.execution_id, wake_at, exc_info=True
            )
        raise _Suspended

    def continue_as_new(self, input: JsonValue) -> NoReturn:
        """End this run ``ContinuedAsNew`` and start the next run of its ``workflow_id`` with
        ``input``: a fresh history (no checkpoints), the same deadline and completion callbacks.

        Never returns: the workflow function stops here. As at any boundary, a cancel request ends
        the run ``Cancelled`` instead, and a passed deadline ``TimedOut``.

        :raises InvalidFieldError: ``input`` is not a JSON value, or is larger than
            ``HARVEST_WORKFLOW_MAX_INPUT_BYTES`` (``InputTooLargeError``); nothing changed.
        :raises InvalidStateError: called inside a step.
        """
        self._refuse_inside_step("ctx.continue_as_new")
        if self.fatal is not None:
            raise self.fatal
        # Checked here, outside the engine's own calls, so that bad input is the workflow code's
        # error (the run fails with it, or the code catches it), never an engine failure.
        encode_json(input, field="input", max_bytes=self._max_input_bytes)
        self._refuse_unrecorded_continue()
        # Children started since the last write exist before the hand-over, which gives them to
        # the successor (their parent-close policy then applies when the chain ends).
        self._write_pending()
        self._boundary()
        with _engine_call():
            moved = self._store.continue_as_new(
                self.execution_id,
                self._token,
                input,
                now=self._clock(),
                max_input_bytes=self._max_input_bytes,
            )
        if moved is None:
            # A cancel request, the deadline or a lost lease since the boundary: the boundary,
            # reading the row afresh, ends the run as any boundary would.
            self._boundary(renew=True)
            raise _Stopped
        successor = moved[1]
        try:
            self._schedule(successor.execution_id, None)
        except Exception:
            # The successor is Pending and due: the sweeper's due scan queues it anyway.
            logger.warning("could not schedule workflow execution %s", successor.execution_id, exc_info=True)
        raise _ContinuedAsNew

    # -- internals -------------------------------------------------------------------------------

    def _refuse_unrecorded_continue(self) -> None:
        # A recorded fork does no new work: it may continue as new only where its source did, and
        # its next run then replays the source's next run.
        execution = self._execution
        if execution.fork_mode != ForkMode.RECORDED.value or execution.forked_from is None:
            return
        with _engine_call():
            source = self._store.get(execution.forked_from)
        if source is None or source.continued_to is None:
            raise InvalidStateError(
                f"this recorded fork cannot continue as new: its source {execution.forked_from} "
                "did not continue as new, so there is no recorded run to replay next"
            )

    def start_child(
        self,
        name: str,
        input: JsonValue = None,
        *,
        workflow_id: str | None = None,
        parent_close_policy: ParentClosePolicy | str = ParentClosePolicy.TERMINATE,
    ) -> ChildHandle:
        """Start a run of the workflow ``name`` as a child of this run; on a replay, return the
        same child (the start is checkpointed with the child's row, in one transaction).

        The children started since the last write are written together before the next step,
        sleep, wait for an open child, or the run's end; one with a ``workflow_id`` of the
        caller's is written at once.

        :param workflow_id: the child's business key; by default ``"<this execution_id>:<position>"``,
            the same on every replay.
        :param parent_close_policy: what happens to the child if it is still open when this run
            closes (:class:`ParentClosePolicy`).
        :raises UnknownWorkflowError: no workflow is registered as ``name``.
        :raises InvalidFieldError: a bad input, ``workflow_id`` or policy.
        """
        self._refuse_inside_step("ctx.start_child")
        self._began_child = True
        try:
            policy = ParentClosePolicy(parent_close_policy)
        except ValueError:
            choices = ", ".join(p.value for p in ParentClosePolicy)
            raise InvalidFieldError(
                "parent_close_policy", f"must be one of {choices}, not {parent_close_policy!r:.80}"
            ) from None
        seq = self._next_position()
        recorded = self._replay(seq, CHILD_STEP)
        if recorded is not None:
            return self._handle(recorded.output)
        if self._registry is None:
            raise InvalidStateError("this context cannot start child runs: it has no workflow registry")
        definition = self._registry.get(name)
        child_id = workflow_id if workflow_id is not None else child_workflow_id(self.execution_id, seq)
        # Bad input is the workflow's error to see (and catch), not a failure of the engine's call.
        input_text = encode_json(input, field="input", max_bytes=self._max_input_bytes)
        check_id(child_id, "workflow_id", max_chars=_MAX_STEP_NAME)
        self._boundary()
        now = self._clock()
        start = ChildStart(
            seq,
            new_id_beside(self.execution_id),
            name,
            input_text,
            child_id,
            policy,
            now + definition.timeout if definition.timeout is not None else None,
        )
        handle = ChildHandle(start.execution_id, child_id, self.wait_child)
        self._unwritten.append((start, handle))
        if workflow_id is not None:
            # A workflow_id of the caller's may have an open run already: the handle must be that
            # run's before the code sees it.
            self._write_pending()
        return handle

    def wait_child(self, handle: ChildHandle) -> JsonValue:
        """Wait durably for a child to end and return its output; on a replay, return (or raise)
        what the first wait recorded.

        While the child is open this run sleeps (``Pending``, no worker held, no polling) until the
        child's end wakes it; a cancel request or this run's deadline still end it.

        :raises ChildFailedError: the child ended ``Failed``, ``Cancelled``, ``TimedOut`` or
            ``Terminated`` (the workflow may catch it).
        """
        if not isinstance(handle, ChildHandle):
            raise InvalidFieldError(
                "handle", f"must be a ChildHandle from ctx.start_child, not {handle!r:.80}"
            )
        self._refuse_inside_step("ctx.wait_child")
        seq = self._next_position()
        recorded = self._replay(seq, WAIT_CHILD_STEP)
        if recorded is not None:
            return child_result(handle.workflow_id, handle.execution_id, recorded.output)
        if not any(pending is handle for _, pending in self._unwritten):
            # An ended child's outcome never changes: it is checkpointed with the next write (the
            # next start, step, sleep, wait that sleeps, or the end), not in a transaction of its own.
            with _engine_call():
                ended = self._store.child_outcome(handle.execution_id)
            if ended is not None:
                self._unwritten_waits.append((seq, ended))
                self._steps[seq] = StepRecord(self.execution_id, seq, WAIT_CHILD_STEP, ended)
                return child_result(handle.workflow_id, handle.execution_id, ended)
        self._write_pending()
        self._boundary()
        with _engine_call():
            waited = self._store.wait_child(
                self.execution_id,
                self._token,
                seq,
                handle.execution_id,
                handle.workflow_id,
                now=self._clock(),
            )
        if waited.suspended:
            raise _Suspended
        if waited.lease is not None:
            self._lease, self._lease_read_at = waited.lease, time.monotonic()
        if waited.boundary:
            self._boundary(renew=True)
        if waited.outcome is None:
            raise _Stopped
        self._steps[seq] = StepRecord(self.execution_id, seq, WAIT_CHILD_STEP, waited.outcome)
        return child_result(handle.workflow_id, handle.execution_id, waited.outcome)

    # -- internals -------------------------------------------------------------------------------

    def _write_pending(self) -> None:
        """Write the children started and the waits for ended children since the last write, with
        their checkpoints, in one transaction under the lease (the runner calls it before it ends
        the run, too)."""
        if not self._unwritten and not self._unwritten_waits:
            return
        unwritten, self._unwritten = self._unwritten, []
        waits, self._unwritten_waits = self._unwritten_waits, []
        with _engine_call():
            written = self._store.record_children(
                self.execution_id, self._token, [start for start, _ in unwritten], waits, now=self._clock()
            )
        if written is None:
            raise _Stopped  # the lease is lost: terminated, timed out or taken over
        children, self._lease = written
        self._lease_read_at = time.monotonic()
        for (start, handle), child in zip(unwritten, children, strict=True):
            if child.execution_id != handle.execution_id:
                # An open run of the workflow_id was loaded instead: the handle is that run's. The
                # handle is the engine's own object, frozen for the workflow code.
                object.__setattr__(handle, "execution_id", child.execution_id)
            ids = {"execution_id": child.execution_id, "workflow_id": child.workflow_id}
            self._steps[start.seq] = StepRecord(self.execution_id, start.seq, CHILD_STEP, ids)

    def _handle(self, ids: JsonValue) -> ChildHandle:
        return ChildHandle(ids["execution_id"], ids["workflow_id"], self.wait_child)

    def _sleep_delta(self, duration: object) -> timedelta:
        if isinstance(duration, timedelta):
            delta = duration
        elif isinstance(duration, int | float) and not isinstance(duration, bool) and math.isfinite(duration):
            try:
                delta = timedelta(seconds=duration)
            except OverflowError:
                raise InvalidFieldError("duration", "is too long") from None
        else:
            raise InvalidFieldError(
                "duration", f"must be a timedelta or a finite number of seconds, not {duration!r:.80}"
            )
        if delta < timedelta(0):
            raise InvalidFieldError("duration", f"must not be negative, not {delta}")
        try:
            self._clock() + delta
        except OverflowError:
            raise InvalidFieldError(
                "duration", "is too long: the wake time would be past the year 9999"
            ) from None
        return delta

    def _refuse_inside_step(self, what: str) -> None:
        # A step's checkpoint stands for all it did: positions taken inside it would be replayed
        # differently (the outer step does not run again), so nesting is refused outright.
        if self._in_step:
            raise InvalidStateError(f"{what} cannot be called inside a step; call it from the workflow")

    def _next_position(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    def _replay(self, seq: int, name: str) -> StepRecord | None:
        recorded = self._steps.get(seq)
        if recorded is None and self._recorded is not None:
            return self._replay_source(seq, name, self._recorded)
        if recorded is not None and recorded.name != name:
            self.fatal = NonDeterminismError(self.execution_id, seq, recorded.name, name)
            raise self.fatal
        return recorded

    def _replay_source(self, seq: int, name: str, recorded: dict[int, StepRecord]) -> StepRecord:
        """A recorded fork's new position: the source's checkpoint there, checkpointed as this run's."""
        source_id = self._execution.forked_from or ""
        found = recorded.get(seq)
        if found is None:
            self.fatal = ForkNotRecordedError(self.execution_id, source_id, seq, name)
            raise self.fatal
        if found.name != name:
            self.fatal = NonDeterminismError(source_id, seq, found.name, name)
            raise self.fatal
        # A boundary, as a step that runs has: a cancel or the deadline stops a long replay too.
        self._boundary()
        self._record(seq, name, output=found.output, error=found.error)
        return self._steps[seq]

    def _record(self, seq: int, name: str, *, output: JsonValue = None, error: str | None = None) -> None:
        now = self._clock()
        # A checkpoint renews the lease only once a third of it has passed (as the heartbeat does):
        # writing the execution's row costs an update of each of its indexes.
        renew = now - self._renewed_at >= timedelta(seconds=self._lease_seconds / 3)
        with _engine_call():
            lease = self._store.checkpoint(
                self.execution_id,
                self._token,
                seq,
                name,
                output=output,
                error=error,
                now=now,
                lease_seconds=self._lease_seconds if renew else None,
            )
        if renew:
            self._renewed_at = now
        if lease is None:
            # Terminated, timed out or taken over since the last boundary: write nothing more.
            raise _Stopped
        self._lease, self._lease_read_at = lease, time.monotonic()
        self._steps[seq] = StepRecord(self.execution_id, seq, name, output, error)

    def _boundary(self, *, renew: bool = False) -> None:
        """Renew the lease (unless a checkpoint just did) and act on what the row says: cancel,
        deadline, or lost."""
        with _engine_call():
            self._look_at_the_row(renew=renew)

    def _look_at_the_row(self, *, renew: bool) -> None:
        now = self._clock()
        row: LeaseView | Execution | None = self._lease
        if renew or row is None or time.monotonic() - self._lease_read_at > FRESH_SECONDS:
            row = self._store.renew(
                self.execution_id, self._token, now=now, lease_seconds=self._lease_seconds
            )
            self._lease, self._lease_read_at, self._renewed_at = None, time.monotonic(), now
        if row is None:
            raise _Stopped
        if row.cancel_requested:
            self._store.finish(
                self.execution_id,
                ExecutionState.CANCELLED,
                error=row.cancel_reason or "cancelled",
                now=now,
                token=self._token,
            )
            raise _Stopped
        if row.deadline is not None and row.deadline < now:
            self._store.finish(
                self.execution_id,
                ExecutionState.TIMED_OUT,
                error=timeout_message(row.deadline),
                now=now,
                token=self._token,
            )
            raise _Stopped
