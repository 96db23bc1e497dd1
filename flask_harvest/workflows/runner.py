"""Runs workflow executions: start (validate, store, schedule), run (claim, replay, end), sweep.

Flask-free: executions reach workers through the job seam as jobs of kind :data:`WORKFLOW_JOB`,
whose handler is :meth:`WorkflowRunner.run_many`.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime, timedelta

from sqlalchemy import Connection

from .. import tracing
from .._threads import Heartbeat, PerProcess
from .._time import utcnow
from ..errors import InvalidFieldError, InvalidStateError, StoreError
from ..jobs.base import JobBackend, JobBackendError, JobRef
from ..jobs.requeue import requeue_missing
from ..jobs.tasks import carrying_job_context
from ..sweeper import SweepReport
from ._queue_driver import QueueDriver
from .context import StepRetryPolicy, WorkflowContext, _EngineFailed, _Unwind
from .errors import ExecutionNotFoundError, UnknownWorkflowError
from .forks import check_from_step, parse_fork_mode
from .models import (
    Execution,
    ExecutionState,
    ForkMode,
    IdReusePolicy,
    JsonValue,
    StepRecord,
    describe_error,
    encode_json,
    timeout_message,
)
from .queues import QueueTable, StartQueue
from .registry import WorkflowRegistry
from .store import LeaseView, SqlWorkflowStore

__all__ = ["WORKFLOW_JOB", "WorkflowRunner", "workflow_job"]

logger = logging.getLogger(__name__)

#: The job seam's kind for workflow executions.
WORKFLOW_JOB = "workflow"
# Rows due for less than this long are left to the job that is most likely on its way (RQ's
# scheduler moves a delayed job about once a second).
_DUE_GRACE = timedelta(seconds=2)
# How long submit_many waits for a batch of free slots before it returns for fewer (as the
# delivery pool does): long runs must not leave a slot idle for long.
_BATCH_PATIENCE_SECONDS = 0.1


def workflow_job(execution_id: str, due: datetime | None = None) -> JobRef:
    """Return the job reference that runs an execution at ``due`` (``None``: now)."""
    return JobRef(WORKFLOW_JOB, execution_id, 0, due)


#: The default limit on a workflow input, as JSON (``HARVEST_WORKFLOW_MAX_INPUT_BYTES``).
DEFAULT_MAX_INPUT_BYTES = 256 * 1024


class _Threads:
    """The runner's threads in one process, and the runs handed to them and not done yet.

    Built once per process (:class:`~flask_harvest._threads.PerProcess`): a forked child
    (gunicorn ``--preload``) inherits neither its parent's threads nor the count of the runs they
    had, so it must never wait on either.
    """

    def __init__(self, concurrency: int) -> None:
        # One more than the runs: a batch's claim runs on it too.
        self.executor = ThreadPoolExecutor(concurrency + 1, thread_name_prefix="harvest-workflow")
        self.room = threading.Condition()
        self.in_flight = 0  # runs handed over by submit_many and not done yet
        # Slots the worker waits for before it takes more jobs (the delivery pool's rule): a job
        # then takes the jobs queued behind it, and RQ's per-job cost is paid once per batch
        # rather than once per run (half of a busy worker's CPU when every end freed one slot).
        self.batch = max(1, concurrency // 4)

    def done(self, count: int) -> None:
        with self.room:
            self.in_flight -= count
            self.room.notify_all()


class _Entry(enum.Enum):
    """How a run came through its process's gate."""

    AT_ONCE = "at once"
    AFTER_WAIT = "after a wait"
    GAVE_UP = "gave up"  # it waited its whole patience: the run goes back to the queue


class _Turn(enum.Enum):
    """What a claimed run does once it has tried the gate."""

    RUN = "run"
    LOST = "lost"  # its claim is no longer its own (taken over or ended while it waited)
    GIVE_BACK = "give back"


class _Gate:
    """The runs of one process: any number beside each other, or a quarantined one alone.

    A quarantined run waits until the runs in progress are done, and the runs that come after it
    wait until it is done (so it is not starved by a steady stream of others). No run waits more
    than its ``patience``: one long run must not hold the runs claimed behind it for its whole
    length (they go back to the queue, for a worker that is free).
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._beside = 0  # runs in progress beside each other
        self._alone = False  # a run is in progress alone
        self._waiting_alone = 0
        self.waiting_beside = 0  # runs waiting to run beside others (what tests wait for)

    @contextmanager
    def beside(self, patience: float) -> Iterator[_Entry]:
        def ready() -> bool:
            return not self._alone and not self._waiting_alone

        with self._changed:
            entry = _Entry.AT_ONCE if ready() else _Entry.AFTER_WAIT
            self.waiting_beside += 1
            try:
                if not self._changed.wait_for(ready, timeout=patience):
                    entry = _Entry.GAVE_UP
                else:
                    self._beside += 1
            finally:
                self.waiting_beside -= 1
        if entry is _Entry.GAVE_UP:
            yield entry
            return
        try:
            yield entry
        finally:
            with self._changed:
                self._beside -= 1
                self._changed.notify_all()

    @contextmanager
    def alone(self, patience: float) -> Iterator[_Entry]:
        def ready() -> bool:
            return not self._alone and not self._beside

        with self._changed:
            entry = _Entry.AT_ONCE if ready() else _Entry.AFTER_WAIT
            self._waiting_alone += 1
            try:
                if not self._changed.wait_for(ready, timeout=patience):
                    entry = _Entry.GAVE_UP
                else:
                    self._alone = True
            finally:
                self._waiting_alone -= 1
                self._changed.notify_all()  # runs waiting behind it may go on if it gave up
        if entry is _Entry.GAVE_UP:
            yield entry
            return
        try:
            yield entry
        finally:
            with self._changed:
                self._alone = False
                self._changed.notify_all()


class WorkflowRunner:
    """Starts and runs the executions of the workflows in ``registry``, stored in ``store``.

    :param backend: carries the jobs that call :meth:`run`; an enqueue that fails is logged (the
        sweeper's due scan queues the execution again).
    :param lease_seconds: how long a claim holds an execution without a heartbeat.
    :param max_recovery_attempts: how many deaths of its worker while it ran alone in its
        process an execution survives before it fails as a poison pill (a death beside other runs
        quarantines it instead: it runs alone from then on).
    :param step_retry: the backoff between a step's retries, unless the step gives its own.
    :param max_input_bytes: the largest input accepted, as UTF-8 JSON.
    :param heartbeat_interval: seconds between lease renewals while a workflow function runs (by
        one thread per process); ``None`` for a third of the lease, ``0`` to renew only at step
        boundaries.
    :param concurrency: how many executions :meth:`run_many` and :meth:`submit_many` run at once,
        on threads of the runner's own; a quarantined execution runs alone.
    :param context: entered around each execution run on those threads (the Flask app context).
    :param queues: the declared workflow queues (see :doc:`queues`); none if not given.
    :param clock: the current time (tests pass a fake one).
    :param wait: sleeps between a step's retries (tests pass a fake one).
    """

    def __init__(
        self,
        store: SqlWorkflowStore,
        registry: WorkflowRegistry,
        backend: JobBackend,
        *,
        lease_seconds: float = 30.0,
        max_recovery_attempts: int = 5,
        step_retry: StepRetryPolicy | None = None,
        max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES,
        heartbeat_interval: float | None = None,
        concurrency: int = 1,
        context: Callable[[], AbstractContextManager[object]] = nullcontext,
        clock: Callable[[], datetime] = utcnow,
        wait: Callable[[float], None] = time.sleep,
        queues: QueueTable | None = None,
    ) -> None:
        if lease_seconds <= 0:
            raise InvalidFieldError("lease_seconds", f"must be positive, not {lease_seconds}")
        if max_recovery_attempts < 0:
            raise InvalidFieldError(
                "max_recovery_attempts", f"must be 0 or more, not {max_recovery_attempts}"
            )
        self.store = store
        self.registry = registry
        self.backend = backend
        self.lease_seconds = lease_seconds
        self.max_recovery_attempts = max_recovery_attempts
        self.step_retry = step_retry or StepRetryPolicy()
        self.max_input_bytes = max_input_bytes
        self.heartbeat_interval = lease_seconds / 3 if heartbeat_interval is None else heartbeat_interval
        self.clock = clock
        self.wait = wait
        self.concurrency = max(1, concurrency)
        self.context = context
        self._threads = PerProcess(lambda: _Threads(self.concurrency))
        # One run at a time: every claim runs its run alone. Else a gate per process keeps a
        # quarantined run alone (see _gated).
        self._claims_alone = self.concurrency == 1
        self._gate = PerProcess(_Gate)
        # One thread renews the leases of every run in progress in the process.
        self._heartbeats = PerProcess(
            lambda: Heartbeat(self._renew, self.heartbeat_interval, name="harvest-workflow-heartbeat")
        )
        self.queues = queues if queues is not None else QueueTable()
        self._closing = threading.Event()
        self.queue_driver = QueueDriver(
            store,
            self.queues,
            clock=clock,
            lease_seconds=lease_seconds,
            schedule=self._schedule,
            alone=self._claims_alone,
        )

    # -- starting --------------------------------------------------------------------------------

    def start(
        self,
        name: str,
        input: JsonValue,
        *,
        workflow_id: str | None = None,
        policy: IdReusePolicy = IdReusePolicy.ALLOW_DUPLICATE,
        trigger_depth: int = 0,
        completion_callbacks: JsonValue = None,
        conn: Connection | None = None,
        queue: str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        priority: int | None = None,
        max_input_bytes: int | None = None,
    ) -> tuple[Execution, bool]:
        """Start a run of the registered workflow ``name`` (or load the open run of ``workflow_id``).

        With ``conn`` the run is created in the caller's transaction and NOT scheduled here: the
        transaction's owner schedules it after the commit (``store.started_in(conn)`` lists it; the
        store's ``on_started`` does it for terminal hooks), else the sweeper's due scan does.

        :param queue: the queue the run is claimed through (default: the workflow's).
        :param concurrency_key: runs of the queue sharing this key run at most
            ``concurrency_limit`` (default 1) at once.
        :param priority: lower runs first among the queue's due runs (default: the workflow's).
        :param max_input_bytes: the largest input accepted (default: the runner's); a start decided
            elsewhere (a cross-shard trigger start) keeps the limit it was checked against.
        :returns: ``(execution, created)``.
        :raises UnknownWorkflowError: no workflow is registered as ``name``.
        :raises UnknownQueueError: the queue is not declared.
        :raises InputTooLargeError: the input is larger than ``max_input_bytes``.
        :raises InvalidFieldError: the input is not a JSON value, a queue field is out of range.
        :raises WorkflowIdReusedError: the id reuse policy refuses another run.
        """
        definition = self.registry.get(name)
        placement = self.placement(
            name,
            queue=queue,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            priority=priority,
        )
        now = self.clock()
        deadline = now + definition.timeout if definition.timeout is not None else None
        execution, created = self.store.start(
            name,
            input,
            workflow_id,
            policy,
            now=now,
            deadline=deadline,
            trigger_depth=trigger_depth,
            completion_callbacks=completion_callbacks,
            max_input_bytes=self.max_input_bytes if max_input_bytes is None else max_input_bytes,
            conn=conn,
            queue=placement,
        )
        if created and conn is None:
            self._schedule(execution.execution_id, None)
        return execution, created

    def start_many(
        self,
        name: str,
        inputs: Sequence[JsonValue],
        *,
        completion_callbacks: JsonValue = None,
        queue: str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        priority: int | None = None,
    ) -> list[Execution]:
        """Start one run of ``name`` per input, each with a new ``workflow_id``, in one transaction
        (one per shard), and queue them in one call to the backend. Arguments as :meth:`start`'s;
        every input is checked before any run is stored.

        :returns: the runs, in the order of ``inputs``.
        """
        definition = self.registry.get(name)
        placement = self.placement(
            name,
            queue=queue,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            priority=priority,
        )
        now = self.clock()
        deadline = now + definition.timeout if definition.timeout is not None else None
        started = self.store.start_many(
            name,
            inputs,
            now=now,
            deadline=deadline,
            completion_callbacks=completion_callbacks,
            max_input_bytes=self.max_input_bytes,
            queue=placement,
        )
        self.schedule_started([execution.execution_id for execution in started])
        return started

    def fork(self, source_id: str, from_step: int, mode: ForkMode = ForkMode.RECORDED) -> Execution:
        """Create a fork of ``source_id`` from position ``from_step`` (see
        :meth:`SqlWorkflowStore.fork`) and queue it; its deadline is counted from now.

        :raises ExecutionNotFoundError: no execution has the id ``source_id``.
        :raises UnknownWorkflowError: the source's workflow is not registered in this process.
        :raises InvalidFieldError: ``from_step`` or ``mode`` is not valid.
        """
        mode = parse_fork_mode(mode)
        check_from_step(from_step)
        source = self.store.get(source_id)
        if source is None:
            raise ExecutionNotFoundError(source_id)
        definition = self.registry.get(source.workflow_name)
        now = self.clock()
        deadline = now + definition.timeout if definition.timeout is not None else None
        fork = self.store.fork(source_id, from_step, mode, now=now, deadline=deadline)
        self._schedule(fork.execution_id, None)
        return fork

    def placement(
        self,
        name: str,
        *,
        queue: object = None,
        concurrency_key: object = None,
        concurrency_limit: object = None,
        priority: object = None,
    ) -> StartQueue:
        """Return where a start of ``name`` puts its run: the given queue fields, else the
        workflow's, checked (see :meth:`start`).

        :raises UnknownWorkflowError: no workflow is registered as ``name``.
        :raises InvalidFieldError: a queue field is out of range, or names an unknown queue.
        """
        definition = self.registry.get(name)
        return StartQueue.resolve(
            self.queues,
            default_queue=definition.queue,
            default_priority=definition.priority,
            queue=queue,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            priority=priority,
        )

    # -- running ---------------------------------------------------------------------------------

    def run_many(self, execution_ids: Sequence[str]) -> None:
        """Run ``execution_ids`` (a job's rows), up to ``concurrency`` at once, and return when
        each has ended, slept or stopped. The first exception a run raised is raised again once
        the others are done."""
        if self.concurrency == 1 or len(execution_ids) == 1:
            for execution_id in execution_ids:
                self.run(execution_id)
            return
        executor = self._threads.get().executor
        # The runs keep the job's context, so what ends them knows it is in a worker (a completion
        # callback's first attempt is then made here, without a round trip through the queue).
        run = carrying_job_context(self._run_in_context)
        futures = [executor.submit(run, execution_id) for execution_id in execution_ids]
        errors = [future.exception() for future in futures]
        for error in errors:
            if error is not None:
                raise error

    def submit_many(self, execution_ids: Sequence[str]) -> None:
        """Hand ``execution_ids`` (a worker's job rows) to the runner's threads, which claim them in
        one statement and run the claimed ones; return once there is room for more (see
        :meth:`free_slots`). The worker goes on taking jobs while these run, instead of waiting
        for the slowest of a batch.

        A run's exception is logged: its execution stays open and the sweeper recovers it once its
        lease expires (the same as when its worker dies).
        """
        threads = self._threads.get()
        with threads.room:
            threads.in_flight += len(execution_ids)
        threads.executor.submit(carrying_job_context(self._claim_and_run), threads, list(execution_ids))
        with threads.room:
            # A batch of free slots, or any one once a batch has not come free for a while.
            if not threads.room.wait_for(
                lambda: threads.in_flight <= self.concurrency - threads.batch, timeout=_BATCH_PATIENCE_SECONDS
            ):
                threads.room.wait_for(lambda: threads.in_flight < self.concurrency)

    def free_slots(self) -> int:
        """How many more runs :meth:`submit_many` has room for (a worker takes that many jobs)."""
        threads = self._threads.get()
        with threads.room:
            return max(1, self.concurrency - threads.in_flight)

    def _claim_and_run(self, threads: _Threads, execution_ids: list[str]) -> None:
        submitted = 0
        try:
            now = self.clock()
            with self.context():
                claimed = self.store.claim_many(
                    execution_ids, now=now, lease_seconds=self.lease_seconds, alone=self._claims_alone
                )
                missed = sorted(set(execution_ids) - {e.execution_id for e in claimed})
                # A queued run's job claims its queue's best eligible run: one run per job.
                claimed += self.queue_driver.after_misses(missed, now)
            run = carrying_job_context(self._run_submitted)
            for execution in claimed:
                try:
                    threads.executor.submit(run, threads, execution, now)
                except RuntimeError:  # the executor is shutting down: run it on this thread
                    self._run_submitted(threads, execution, now)
                submitted += 1
        except Exception:
            # Rows not claimed are due with no job, and claimed ones not run have a lease that
            # expires: the sweeper queues them again.
            logger.exception("could not claim or run workflow executions %s", execution_ids)
        finally:
            threads.done(len(execution_ids) - submitted)

    def _run_in_context(self, execution_id: str) -> Execution | None:
        with self.context():
            return self.run(execution_id)

    def _run_submitted(self, threads: _Threads, claimed: Execution, now: datetime) -> None:
        try:
            with self.context():
                self._run_and_continue(claimed, now)
        except Exception:
            logger.exception("workflow execution %s stopped", claimed.execution_id)
        finally:
            threads.done(1)

    def close(self) -> None:
        """Wait for the runs :meth:`submit_many` handed over that are under way, then stop the
        runner's threads (this process's: a forked child never waits for its parent's). A run
        handed over that has not begun (waiting for a thread, or for its turn to run alone) is
        given back to the queue instead, due now: a stop waits for the runs under way only."""
        threads = self._threads.take()
        if threads is None:
            return
        # A thread that ends a queued run claims no next one now: a long queue must not keep a
        # stopping worker busy (the runs wait for the next worker).
        self._closing.set()
        try:
            with threads.room:
                threads.room.wait_for(lambda: threads.in_flight == 0)
            threads.executor.shutdown(wait=True)
        finally:
            self._closing.clear()

    def schedule_started(self, execution_ids: Sequence[str]) -> None:
        """Queue the executions a transaction started (a terminal hook's), after its commit."""
        if len(execution_ids) <= 1:
            for execution_id in execution_ids:
                self._schedule(execution_id, None)
            return
        # Several at once (a parent's children): one call, which the backend may batch.
        try:
            self.backend.enqueue([workflow_job(execution_id) for execution_id in execution_ids])
        except JobBackendError:
            # The rows are Pending and due: the sweeper's due scan queues them again.
            logger.warning("could not schedule workflow executions %s", list(execution_ids), exc_info=True)

    def run(self, execution_id: str) -> Execution | None:
        """Claim the execution and run its workflow function until it ends or sleeps.

        A job for an execution that is not due, leased by another worker or already ended does
        nothing. An exception that is not an ``Exception`` (a crash, ``KeyboardInterrupt``), or a
        :class:`~flask_harvest.errors.StoreError` of the engine's own calls, propagates and leaves
        the lease to expire: the sweeper requeues the execution.

        :returns: the execution if this run ended it, else ``None`` (asleep, stopped, not claimed).
        """
        now = self.clock()
        claimed = self.store.claim(
            execution_id, now=now, lease_seconds=self.lease_seconds, alone=self._claims_alone
        )
        if claimed is None or claimed.lease_token is None:
            claimed = self.queue_driver.after_miss(execution_id, now)
            if claimed is None:
                return None
            now = self.clock()
        return self._run_and_continue(claimed, now)

    def _run_and_continue(self, claimed: Execution, now: datetime) -> Execution | None:
        """Run a claimed execution; if it is queued, this thread then claims its queue's next
        eligible run and runs it, and so on while there is one: the slot it freed is filled without
        a job's round trip. Returns what running the first one returned."""
        queue_name = claimed.queue_name
        if queue_name is None or self._closing.is_set():
            return self._run_claimed(claimed, now)
        with self.queue_driver.continuing(claimed.execution_id):
            first = self._run_claimed(claimed, now)
        following = self._next_queued(queue_name)
        while following is not None:
            with self.queue_driver.continuing(following.execution_id):
                self._run_claimed(following, self.clock())
            following = self._next_queued(queue_name)
        return first

    def _next_queued(self, queue_name: str) -> Execution | None:
        if self._closing.is_set():
            # Stopping: the run just ended skipped its terminal nudge (this thread was to claim
            # the next), so the queue gets its attempt as a job instead.
            self.queue_driver.nudge(queue_name)
            return None
        return self.queue_driver.claim_next(queue_name)

    def _run_claimed(self, claimed: Execution, now: datetime) -> Execution | None:
        """Run an execution this runner has just claimed (at ``now``); see :meth:`run`."""
        with tracing.workflow_run(claimed) as span:
            ended = self._run_claimed_traced(claimed, now)
            # None: asleep, stopped or left to the sweeper; the run goes on in a later claim.
            if ended is not None:
                span.set("harvest.workflow.state", ended.state.value)
                if ended.state in (ExecutionState.FAILED, ExecutionState.TIMED_OUT):
                    span.fail(ended.state.value)
            return ended

    def _run_claimed_traced(self, claimed: Execution, now: datetime) -> Execution | None:
        execution_id = claimed.execution_id
        token = claimed.lease_token
        if token is None:
            raise InvalidStateError(f"execution {execution_id} was handed over without its lease")
        # The gate is held until the run's end is committed: the terminal transition (and the hooks
        # in it, user code among them) is part of the run. Let go before it, the next quarantined
        # run could be recorded alone while this one's row is still Running (and alone): a death
        # of the process then would be charged to both.
        if self._closing.is_set():
            self._hand_back(claimed, token)
            return None
        with self._heartbeat(execution_id, token), self._gated(claimed, token) as turn:
            if turn is _Turn.LOST:
                return None  # taken over (or ended) while it waited its turn
            # Waited too long, or the worker began to stop while it waited: another worker runs it.
            if turn is _Turn.GIVE_BACK or self._closing.is_set():
                self._hand_back(claimed, token)
                return None
            return self._run_gated(claimed, token, now)

    def _hand_back(self, claimed: Execution, token: str) -> None:
        """Give a claimed run that has not begun back to the queue (the worker is stopping): due
        now, its lease released, for another worker. A stop waits only for the runs under way."""
        now = self.clock()
        if self.store.suspend(claimed.execution_id, token, wake_at=now, now=now):
            if claimed.queue_name is None:
                self._schedule(claimed.execution_id, None)
            else:  # its queue's slot is free: the queue gets an attempt
                self.queue_driver.released(claimed)
        # Refused (a cancel was requested or its deadline passed meanwhile): the lease runs out and
        # the sweeper ends it, as it would have after the worker's exit.

    def _run_gated(self, claimed: Execution, token: str, now: datetime) -> Execution | None:
        """Run a claimed execution to its end, its sleep or its stop, inside this process's gate."""
        execution_id = claimed.execution_id
        if claimed.cancel_requested:
            return self._end(
                claimed, token, ExecutionState.CANCELLED, error=claimed.cancel_reason or "cancelled"
            )
        if claimed.deadline is not None and claimed.deadline < now:
            return self._end(
                claimed, token, ExecutionState.TIMED_OUT, error=timeout_message(claimed.deadline)
            )
        try:
            definition = self.registry.get(claimed.workflow_name)
        except UnknownWorkflowError as exc:
            return self._end(claimed, token, ExecutionState.FAILED, error=str(exc))
        ctx = WorkflowContext(
            claimed,
            token,
            self.store,
            # The first claim of a run has no checkpoints (only a claim's holder writes them),
            # except a fork's, which starts with copies of its source's.
            steps={}
            if claimed.attempt == 1 and claimed.forked_from is None
            else {step.seq: step for step in self.store.list_steps(execution_id)},
            recorded=self._recorded_steps(claimed),
            clock=self.clock,
            lease_seconds=self.lease_seconds,
            retry=self.step_retry,
            schedule=self._schedule,
            wait=self.wait,
            lease=LeaseView(claimed.cancel_requested, claimed.cancel_reason, claimed.deadline),
            registry=self.registry,
            max_input_bytes=self.max_input_bytes,
        )
        try:
            # Children started since the last step are written before the run ends: one that
            # fails may have started children that run on.
            try:
                output = definition.fn(ctx, claimed.input)
            except Exception:
                ctx._write_pending()
                raise
            ctx._write_pending()
        except _EngineFailed as failed:
            # The engine's own call failed under the workflow code (which could not catch it):
            # the run stays open; its lease expires and the sweeper requeues it.
            logger.warning(
                "workflow execution %s stopped: %s", execution_id, failed.error, exc_info=failed.error
            )
            raise failed.error from None
        except _Unwind:
            # Asleep (or stopped), the run holds no slot of its queue: give it to another.
            self.queue_driver.released(claimed)
            return None
        except StoreError:
            # The database failed under the engine's own calls (a checkpoint, a boundary), not
            # the workflow: leave the run open; its lease expires and the sweeper requeues it.
            logger.warning("workflow execution %s stopped: the store failed", execution_id, exc_info=True)
            raise
        except Exception as exc:
            error = str(ctx.fatal) if ctx.fatal is not None else describe_error(exc)
            return self._end(claimed, token, ExecutionState.FAILED, error=error, ctx=ctx)
        if ctx.fatal is not None:
            # The workflow code caught the non-determinism error; the run is still wrong.
            return self._end(claimed, token, ExecutionState.FAILED, error=str(ctx.fatal), ctx=ctx)
        try:
            encode_json(output, field="output")
        except InvalidFieldError as exc:
            return self._end(
                claimed, token, ExecutionState.FAILED, error=f"the workflow returned {exc}", ctx=ctx
            )
        if claimed.deadline is not None and claimed.deadline < self.clock():
            return self._end(
                claimed, token, ExecutionState.TIMED_OUT, error=timeout_message(claimed.deadline), ctx=ctx
            )
        return self._end(claimed, token, ExecutionState.COMPLETED, output=output, ctx=ctx)

    def _recorded_steps(self, claimed: Execution) -> dict[int, StepRecord] | None:
        """A fork in mode recorded: its source's checkpoints from the fork point on, read at each
        claim (an open source may have recorded more since); ``None`` for any other run."""
        if claimed.forked_from is None or claimed.fork_mode != ForkMode.RECORDED.value:
            return None
        start = claimed.fork_from_step or 0
        return {s.seq: s for s in self.store.list_steps(claimed.forked_from) if s.seq >= start}

    def _end(
        self,
        execution: Execution,
        token: str,
        state: ExecutionState,
        *,
        output: JsonValue = None,
        error: str | None = None,
        ctx: WorkflowContext | None = None,
    ) -> Execution | None:
        # A run that began no child and inherited none has none to close: its end skips the look.
        childless = ctx is not None and not ctx.may_have_children and execution.continued_from is None
        ended = self.store.finish(
            execution.execution_id,
            state,
            output=output,
            error=error,
            now=self.clock(),
            token=token,
            childless=childless,
        )
        if ended is None:
            logger.info(
                "workflow execution %s was not ended %s by this run: it was ended or taken over meanwhile",
                execution.execution_id,
                state.value,
            )
        return ended

    def _schedule(self, execution_id: str, due: datetime | None) -> None:
        ref = workflow_job(execution_id, due)
        try:
            if due is None or due <= self.clock():
                self.backend.enqueue([ref])
            else:
                self.backend.schedule(ref)
        except JobBackendError:
            # The row is Pending and due: the sweeper's due scan queues it again.
            logger.warning("could not schedule workflow execution %s", execution_id, exc_info=True)

    @contextmanager
    def _gated(self, claimed: Execution, token: str) -> Iterator[_Turn]:
        """Hold this process's gate while the run runs, its end included: beside the other runs,
        or, for a quarantined run, alone, recorded as such (a death from then on is charged to it).

        Yields whether to run it: a run that waited checks that its claim is still its own (its
        heartbeat may have failed meanwhile, or be off), and one that waited a whole lease goes
        back to the queue.
        """
        if self._claims_alone:  # its claim recorded it as run alone
            yield _Turn.RUN
            return
        execution_id = claimed.execution_id
        if claimed.isolation is None:
            with self._gate.get().beside(self.lease_seconds) as entry:
                if entry is _Entry.GAVE_UP:
                    yield _Turn.GIVE_BACK
                elif entry is _Entry.AFTER_WAIT and (
                    self.store.renew(execution_id, token, now=self.clock(), lease_seconds=self.lease_seconds)
                    is None
                ):
                    yield _Turn.LOST
                else:
                    yield _Turn.RUN
            return
        with self._gate.get().alone(self.lease_seconds) as entry:
            if entry is _Entry.GAVE_UP:
                yield _Turn.GIVE_BACK
            elif self.store.run_alone(
                execution_id, token, now=self.clock(), lease_seconds=self.lease_seconds
            ):
                yield _Turn.RUN
            else:
                yield _Turn.LOST

    @contextmanager
    def _heartbeat(self, execution_id: str, token: str) -> Iterator[None]:
        if self.heartbeat_interval <= 0:
            yield
            return
        with self._heartbeats.get().keeping(execution_id, token):
            yield

    def _renew(self, execution_id: str, token: str) -> bool:
        return self.store.heartbeat(execution_id, token, now=self.clock(), lease_seconds=self.lease_seconds)

    # -- sweeping --------------------------------------------------------------------------------

    def sweep_once(self) -> SweepReport:
        """One pass of the worker's periodic sweep over workflow executions: the sweeper's
        ``workflows`` step.

        Ends ``Cancelled`` the executions whose lease expired with a cancel requested, requeues
        (and queues) the other executions whose lease expired, fails poison pills, ends overdue
        executions ``TimedOut``, and queues ``Pending`` executions that are due but have no live
        job (it was lost, e.g. with a flushed Redis).

        :returns: the counts: ``released`` the expired leases (requeued or cancelled),
            ``requeued`` the executions queued again, ``cancelled``, ``poisoned``, ``timed_out``.
        """
        now = self.clock()
        cancelled = self.store.cancel_expired(now=now)
        leases = self.store.expired_leases(now=now, max_recovery_attempts=self.max_recovery_attempts)
        for execution_id in leases.requeued:
            self._schedule(execution_id, None)
        timed_out = self.store.enforce_timeouts_once(now=now)
        due = self.store.due_executions(now=now - _DUE_GRACE)
        # A due run's job was queued for now, or (a durable sleep) for its wake time.
        missing = requeue_missing(
            self.backend,
            [workflow_job(execution_id) for execution_id, _ in due],
            also={workflow_job(execution_id): [workflow_job(execution_id, at)] for execution_id, at in due},
        )
        # Queued runs: as many claim attempts per queue as it has room for.
        attempts = self.queue_driver.sweep(self.backend, workflow_job, now=now - _DUE_GRACE)
        return SweepReport(
            released=len(leases.requeued) + len(cancelled),
            requeued=len(leases.requeued) + len(missing) + attempts,
            timed_out=len(timed_out),
            poisoned=len(leases.failed),
            cancelled=len(cancelled),
        )
