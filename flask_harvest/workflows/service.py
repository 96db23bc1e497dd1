"""What an app does with workflows, in one place: start, read, list, wait, cancel, terminate.

:class:`WorkflowService` is the workflow side of the engine; the Flask extension, the HTTP API and
the CLI are thin over it. :class:`WorkflowHandle` is what :meth:`WorkflowService.start` returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from .._input import check_text
from .._time import utcnow
from ..errors import HarvestError, InvalidFieldError
from ..http.cursor import decode_position, encode_position
from .errors import ExecutionEndedError, ExecutionNotFoundError
from .forks import parse_fork_mode
from .hooks import TerminalHooks
from .models import (
    Execution,
    ExecutionState,
    ForkMode,
    IdReusePolicy,
    JsonValue,
    StepRecord,
    check_reason,
)
from .registry import WorkflowRegistry
from .runner import WorkflowRunner
from .store import SqlWorkflowStore

__all__ = [
    "StartPreparer",
    "WorkflowFailedError",
    "WorkflowHandle",
    "WorkflowService",
    "decode_cursor",
    "encode_cursor",
    "execution_to_dict",
    "step_to_dict",
]

#: Turns a start's ``completion_callbacks`` into what is stored, or raises to refuse the start.
StartPreparer = Callable[[JsonValue], JsonValue]

# How often waiting for a result looks at the row: starts small, since most runs end quickly.
_POLL_START = 0.01
_POLL_MAX = 0.25
# Cancel and terminate follow a chain whose open run keeps continuing as new at most this often.
_CHAIN_ROUNDS = 5


class WorkflowFailedError(HarvestError):
    """The execution ended in a state other than ``Completed``; ``execution`` says which and why.

    For a run that continued as new (``result(follow=False)``), the message names the run it
    continued as: the logical workflow has no outcome in that run.
    """

    def __init__(self, execution: Execution) -> None:
        self.execution = execution
        if execution.state is ExecutionState.CONTINUED_AS_NEW:
            message = (
                f"workflow execution {execution.execution_id} continued as another run, "
                f"{execution.continued_to}: it has no result of its own; follow the chain for the "
                "workflow's outcome"
            )
        else:
            ended = f"ended {execution.state.value}: {execution.error}"
            message = f"workflow execution {execution.execution_id} {ended}"
        super().__init__(message)


def _iso(when: datetime | None) -> str | None:
    return when.isoformat() if when is not None else None


def execution_to_dict(execution: Execution, *, with_io: bool = True) -> dict[str, Any]:
    """Return an execution's JSON form: status and timestamps, with input, output and error."""
    data: dict[str, Any] = {
        "execution_id": execution.execution_id,
        "workflow_name": execution.workflow_name,
        "workflow_id": execution.workflow_id,
        "state": execution.state.value,
        "created_at": _iso(execution.created_at),
        "started_at": _iso(execution.started_at),
        "completed_at": _iso(execution.completed_at),
        "deadline": _iso(execution.deadline),
        "attempt": execution.attempt,
        "recovery_count": execution.recovery_count,
        # Quarantine: the recoveries charged towards the poison-pill limit, and whether it runs alone.
        "charged_recoveries": execution.charged_recoveries,
        "isolation": execution.isolation,
        "cancel_requested": execution.cancel_requested,
        "trigger_depth": execution.trigger_depth,
        "continued_from": execution.continued_from,
        "continued_to": execution.continued_to,
        "queue_name": execution.queue_name,
        "concurrency_key": execution.concurrency_key,
        "priority": execution.priority,
        "parent_execution_id": execution.parent_execution_id,
        "parent_close_policy": execution.parent_close_policy,
    }
    if execution.forked_from is not None:
        data["forked_from"] = execution.forked_from
        data["fork_from_step"] = execution.fork_from_step
        data["fork_mode"] = execution.fork_mode
    if with_io:
        data["input"] = execution.input
        if execution.state is ExecutionState.COMPLETED:
            data["output"] = execution.output
        if execution.error is not None:
            data["error"] = execution.error
    return data


def step_to_dict(step: StepRecord) -> dict[str, Any]:
    """Return a step checkpoint's JSON form."""
    data: dict[str, Any] = {"seq": step.seq, "name": step.name, "created_at": _iso(step.created_at)}
    if step.failed:
        data["error"] = step.error
    else:
        data["output"] = step.output
    return data


def encode_cursor(execution: Execution) -> str:
    """Return an opaque cursor that continues a listing after ``execution``."""
    return encode_position(execution.created_at, execution.execution_id)


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Return the position an :func:`encode_cursor` cursor stands for.

    :raises InvalidFieldError: the cursor was not made by :func:`encode_cursor`.
    """
    return decode_position(cursor)


class WorkflowService:
    """Starts, reads and ends the workflow executions of one engine.

    :param store: the executions and their checkpoints.
    :param registry: the workflows this app knows.
    :param runner: runs executions and queues their jobs.
    :param hooks: the terminal hooks run in every execution's terminal transaction.
    """

    def __init__(
        self,
        store: SqlWorkflowStore,
        registry: WorkflowRegistry,
        runner: WorkflowRunner,
        hooks: TerminalHooks,
    ) -> None:
        self.store = store
        self.registry = registry
        self.runner = runner
        self.hooks = hooks
        self._preparers: list[StartPreparer] = []

    def add_start_preparer(self, preparer: StartPreparer) -> None:
        """Run ``preparer`` on every start's ``completion_callbacks`` before the run is stored.

        It returns the value to store (completion callbacks validate the targets and add the
        app-wide defaults) and raises a :class:`~flask_harvest.errors.HarvestError` to refuse the
        start; preparers run in the order they were added.
        """
        self._preparers.append(preparer)

    def prepared_callbacks(self, completion_callbacks: JsonValue = None) -> JsonValue:
        """Return what a start stores for ``completion_callbacks``, after every start preparer."""
        for prepare in self._preparers:
            completion_callbacks = prepare(completion_callbacks)
        return completion_callbacks

    def __repr__(self) -> str:
        return f"<WorkflowService workflows={self.registry.names()}>"

    def start(
        self,
        name: str,
        input: JsonValue = None,
        *,
        workflow_id: str | None = None,
        policy: IdReusePolicy | str = IdReusePolicy.ALLOW_DUPLICATE,
        completion_callbacks: JsonValue = None,
        queue: str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        priority: int | None = None,
    ) -> tuple[WorkflowHandle, bool]:
        """Start a run of ``name`` (or load the open run of ``workflow_id``) and queue it.

        ``queue``, ``concurrency_key``, ``concurrency_limit`` and ``priority`` place the run in a
        workflow queue (see :meth:`WorkflowRunner.start`); they default to the workflow's.

        :returns: a handle on the run, and whether this call created it.
        :raises UnknownWorkflowError: no workflow is registered as ``name``.
        :raises UnknownQueueError: the queue is not declared.
        :raises InputTooLargeError: the input is over ``HARVEST_WORKFLOW_MAX_INPUT_BYTES``.
        :raises InvalidFieldError: the input is not JSON, or an argument is invalid.
        :raises WorkflowIdReusedError: the id reuse policy refuses another run.
        """
        try:
            chosen = IdReusePolicy(policy)
        except ValueError:
            names = ", ".join(p.value for p in IdReusePolicy)
            raise InvalidFieldError("policy", f"must be one of {names}") from None
        completion_callbacks = self.prepared_callbacks(completion_callbacks)
        execution, created = self.runner.start(
            name,
            input,
            workflow_id=workflow_id,
            policy=chosen,
            completion_callbacks=completion_callbacks,
            queue=queue,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            priority=priority,
        )
        return WorkflowHandle(self, execution.execution_id, execution.workflow_id), created

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
    ) -> list[WorkflowHandle]:
        """Start one run of ``name`` per item of ``inputs`` and queue them: one INSERT in one
        transaction and one call to the job backend for all of them, where :meth:`start` costs
        both per run. Each run gets a new ``workflow_id``; the other arguments apply to every run,
        as :meth:`start`'s. Every input is checked before any run is stored: one bad input starts
        none.

        :returns: a handle on each run, in the order of ``inputs``.
        :raises UnknownWorkflowError: no workflow is registered as ``name``.
        :raises UnknownQueueError: the queue is not declared.
        :raises InputTooLargeError: an input is over ``HARVEST_WORKFLOW_MAX_INPUT_BYTES``.
        :raises InvalidFieldError: ``inputs`` is not a list, an input is not JSON, or an argument
            is invalid.
        """
        started = self.runner.start_many(
            name,
            inputs,
            completion_callbacks=self.prepared_callbacks(completion_callbacks),
            queue=queue,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            priority=priority,
        )
        return [WorkflowHandle(self, run.execution_id, run.workflow_id) for run in started]

    def fork(
        self, execution_id: str, from_step: int, mode: ForkMode | str = ForkMode.RECORDED
    ) -> WorkflowHandle:
        """Retry from step ``from_step``: start a fork of the run ``execution_id`` and queue it.

        The fork is a new run of the same workflow with the same input, whose checkpoints before
        ``from_step`` are copies of the source's; ``mode`` decides what the steps from there do
        (:class:`ForkMode`). The source is not changed. See :doc:`forks`.

        :returns: a handle on the fork.
        :raises ExecutionNotFoundError: no execution has this id.
        :raises InvalidFieldError: ``from_step`` is not an integer from 0 to the number of the
            source's checkpoints, or ``mode`` is not a fork mode.
        :raises UnknownWorkflowError: the source's workflow is not registered in this process.
        """
        fork = self.runner.fork(execution_id, from_step, parse_fork_mode(mode))
        return WorkflowHandle(self, fork.execution_id, fork.workflow_id)

    def get(self, execution_id: str) -> Execution:
        """Return the execution.

        :raises ExecutionNotFoundError: no execution has this id.
        """
        # The store finds nothing for an id no row can have (not text, a NUL, a lone surrogate).
        execution = self.store.get(execution_id)
        if execution is None:
            raise ExecutionNotFoundError(execution_id)
        return execution

    def handle(self, execution_id: str) -> WorkflowHandle:
        """Return a handle on an existing execution."""
        execution = self.get(execution_id)
        return WorkflowHandle(self, execution.execution_id, execution.workflow_id)

    def list_executions(
        self,
        *,
        name: str | None = None,
        state: ExecutionState | str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> tuple[list[Execution], str | None]:
        """Return one page of executions, newest first, and the cursor of the next (or ``None``).

        :raises InvalidFieldError: an unknown state, a bad cursor or a limit outside 1 to 500.
        """
        if not 1 <= limit <= 500:
            raise InvalidFieldError("limit", "must be between 1 and 500")
        chosen = _listed_state(name, state)
        position = decode_cursor(cursor) if cursor else None
        rows = self.store.list_executions(name=name, state=chosen, cursor=position, limit=limit + 1)
        page = rows[:limit]
        return page, encode_cursor(page[-1]) if len(rows) > limit else None

    def count_executions(
        self, *, name: str | None = None, state: ExecutionState | str | None = None, cap: int = 1000
    ) -> int:
        """Return how many executions :meth:`list_executions` lists with these filters, counting at
        most ``cap`` (one bounded index walk; a count equal to ``cap`` means "at least").

        :raises InvalidFieldError: an unknown state.
        """
        return self.store.count_executions(name=name, state=_listed_state(name, state), cap=cap)

    def state_counts(self, *, cap: int = 10_000) -> dict[ExecutionState, int]:
        """Return how many executions are in each state, each count stopping at ``cap`` (a count
        equal to ``cap`` means "at least that many")."""
        return self.store.count_states(cap=cap)

    def steps(self, execution_id: str) -> list[StepRecord]:
        """Return the execution's step checkpoints in order.

        :raises ExecutionNotFoundError: no execution has this id.
        """
        self.get(execution_id)
        return self.store.list_steps(execution_id)

    def children(
        self, execution_id: str, *, cursor: str | None = None, limit: int = 50
    ) -> tuple[list[Execution], str | None]:
        """Return one page of the runs ``execution_id`` started as children, oldest first, and the
        cursor of the next page (or ``None``).

        :raises ExecutionNotFoundError: no execution has this id.
        :raises InvalidFieldError: a bad cursor or a limit outside 1 to 500.
        """
        if not 1 <= limit <= 500:
            raise InvalidFieldError("limit", "must be between 1 and 500")
        position = decode_cursor(cursor) if cursor else None
        self.get(execution_id)
        rows = self.store.list_children(execution_id, cursor=position, limit=limit + 1)
        page = rows[:limit]
        return page, encode_cursor(page[-1]) if len(rows) > limit else None

    def cancel(self, execution_id: str, reason: str | None = None) -> Execution:
        """Cancel cooperatively: a pending run ends ``Cancelled`` now, a running one at its next
        step or sleep boundary. Given a run that continued as new, the chain's open run is the one
        cancelled.

        :returns: the execution after the request (still ``Running``, with ``cancel_requested``,
            until its code reaches a boundary).
        :raises ExecutionNotFoundError: no execution has this id.
        :raises ExecutionEndedError: it (its chain) had already ended; nothing was changed.
        """
        check_reason(reason)
        return self._end_chain(
            execution_id, "cancel", lambda i: self.store.request_cancel(i, reason, now=utcnow())
        )

    def terminate(self, execution_id: str, reason: str | None = None) -> Execution:
        """End an open run ``Terminated`` at once; its code can record nothing more. Given a run
        that continued as new, the chain's open run is the one terminated.

        :raises ExecutionNotFoundError: no execution has this id.
        :raises ExecutionEndedError: it (its chain) had already ended; nothing was changed.
        """
        check_reason(reason)
        return self._end_chain(
            execution_id, "terminate", lambda i: self.store.terminate(i, reason, now=utcnow())
        )

    def _end_chain(self, execution_id: str, action: str, act: Callable[[str], Execution]) -> Execution:
        # The chain's open run may itself continue as new between our read and the store's guarded
        # UPDATE (which then moves nothing): follow it again, a bounded number of times.
        for _ in range(_CHAIN_ROUNDS):
            target = self._require_open(execution_id, action)
            ended = act(target.execution_id)
            if ended.state is not ExecutionState.CONTINUED_AS_NEW:
                return ended
            execution_id = ended.execution_id
        return ended

    def _require_open(self, execution_id: str, action: str) -> Execution:
        # An execution that ends between this read and the store's guarded UPDATE is left as it
        # ended (the UPDATE only moves an open row): the caller then sees its real terminal state.
        execution = self.last_run(execution_id)
        if execution.terminal:
            raise ExecutionEndedError(execution.execution_id, execution.state.value, action)
        return execution

    def last_run(self, execution_id: str) -> Execution:
        """Return the last run of the chain from ``execution_id`` on (following ``continued_to``):
        the execution itself unless it continued as new.

        :raises ExecutionNotFoundError: no execution has this id.
        """
        execution = self.store.last_run(execution_id)
        if execution is None:
            raise ExecutionNotFoundError(execution_id)
        return execution

    def chain(self, execution_id: str) -> list[Execution]:
        """Return the runs of ``execution_id``'s continue-as-new chain, first to last (a single
        run when it never continued): at most the :data:`~flask_harvest.workflows._chain.MAX_CHAIN`
        most recent runs of a longer chain.

        :raises ExecutionNotFoundError: no execution has this id.
        """
        runs = self.store.chain(execution_id)
        if not runs:
            raise ExecutionNotFoundError(execution_id)
        return runs

    def wait(self, execution_id: str, timeout: float | None, *, follow: bool = True) -> Execution:
        """Return the execution once it has ended, or as it is after ``timeout`` seconds.

        :param timeout: seconds to wait at most; ``None`` to wait until it ends.
        :param follow: follow ``continued_to`` to the chain's last run and wait for that one (a run
            that continued as new is not the workflow's outcome); ``False`` returns the run itself,
            ``ContinuedAsNew`` if it continued.
        :raises ExecutionNotFoundError: no execution has this id.
        """
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        delay = _POLL_START
        while True:
            execution = self.last_run(execution_id) if follow else self.get(execution_id)
            execution_id = execution.execution_id
            remaining = _POLL_MAX if deadline is None else deadline - time.monotonic()
            if execution.terminal or remaining <= 0:
                return execution
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, _POLL_MAX)


class WorkflowHandle:
    """A started execution: ask for its status, or wait for its result."""

    def __init__(self, service: WorkflowService, execution_id: str, workflow_id: str) -> None:
        self._service = service
        self.execution_id = execution_id
        self.workflow_id = workflow_id

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.execution_id} workflow_id={self.workflow_id!r}>"

    def status(self) -> ExecutionState:
        """Return the execution's current state."""
        return self._service.get(self.execution_id).state

    def execution(self) -> Execution:
        """Return the execution as stored now."""
        return self._service.get(self.execution_id)

    def result(self, timeout: float | None = 60.0, *, follow: bool = True) -> JsonValue:
        """Wait up to ``timeout`` seconds (``None``: as long as it takes) for the execution to end;
        return its output.

        :param follow: follow the continue-as-new chain to its last run and return that run's
            outcome (the default); ``False`` looks at this run only.
        :raises WorkflowFailedError: it ended ``Failed``, ``Cancelled``, ``TimedOut`` or
            ``Terminated``, or (``follow=False``) continued as another run, which the error names.
        :raises TimeoutError: it was still open after ``timeout`` seconds.
        """
        execution = self._service.wait(self.execution_id, timeout, follow=follow)
        if not execution.terminal:
            raise TimeoutError(
                f"workflow execution {execution.execution_id} is still {execution.state.value}"
            )
        if execution.state is not ExecutionState.COMPLETED:
            raise WorkflowFailedError(execution)
        return execution.output

    def cancel(self, reason: str | None = None) -> Execution:
        """Cancel the execution (see :meth:`WorkflowService.cancel`)."""
        return self._service.cancel(self.execution_id, reason)

    def terminate(self, reason: str | None = None) -> Execution:
        """Terminate the execution (see :meth:`WorkflowService.terminate`)."""
        return self._service.terminate(self.execution_id, reason)


def _listed_state(name: str | None, state: ExecutionState | str | None) -> ExecutionState | None:
    """The listing's filters checked: the state as a member (``None`` for any)."""
    try:
        chosen = ExecutionState(state) if state is not None else None
    except ValueError:
        raise InvalidFieldError(
            "state", f"must be one of {', '.join(s.value for s in ExecutionState)}"
        ) from None
    if name is not None:
        check_text(name, "name")
    return chosen
