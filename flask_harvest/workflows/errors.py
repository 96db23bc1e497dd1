"""The errors of durable workflows; every one derives from :class:`~flask_harvest.errors.HarvestError`."""

from __future__ import annotations

from ..errors import HarvestError, InvalidFieldError, InvalidStateError, NotFoundError


class WorkflowError(HarvestError):
    """Base class of the errors raised by durable workflows."""


class UnknownWorkflowError(WorkflowError, NotFoundError):
    """No workflow is registered under this name (in this process)."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"no workflow named {name!r} is registered; register it with @registry.workflow({name!r}) "
            "in a module that the web process and every worker import"
        )
        self.name = name


class ExecutionNotFoundError(WorkflowError, NotFoundError):
    """No workflow execution has this id."""

    def __init__(self, execution_id: str) -> None:
        super().__init__(f"no workflow execution with id {execution_id!r}")
        self.execution_id = execution_id


class WorkflowIdReusedError(WorkflowError):
    """The id reuse policy refused to start another run of a closed ``workflow_id``.

    :param workflow_id: the business key the caller asked for.
    :param policy: the policy that refused (its value, e.g. ``RejectDuplicate``).
    :param previous_execution_id: the closed run that caused the refusal.
    :param previous_state: that run's terminal state.
    """

    #: The HTTP API answers this error with 409 Conflict.
    http_status = 409
    error_code = "workflow_id_reused"

    def __init__(
        self, workflow_id: str, policy: str, previous_execution_id: str, previous_state: str
    ) -> None:
        super().__init__(
            f"workflow_id {workflow_id!r} was already used by execution {previous_execution_id} "
            f"(ended {previous_state}) and the id reuse policy {policy} refuses another run; "
            "choose another workflow_id or start with the AllowDuplicate policy"
        )
        self.workflow_id = workflow_id
        self.policy = policy
        self.previous_execution_id = previous_execution_id
        self.previous_state = previous_state


class InputTooLargeError(InvalidFieldError):
    """A workflow input (or output) is larger, encoded as JSON, than the configured limit."""

    #: The HTTP API answers this error with 413 Content Too Large.
    http_status = 413
    error_code = "input_too_large"

    def __init__(self, field: str, size: int, limit: int) -> None:
        super().__init__(
            field,
            f"is {size} bytes as JSON, more than the limit of {limit} bytes; pass a reference "
            "(an id, a URL) instead of the data, or raise HARVEST_WORKFLOW_MAX_INPUT_BYTES",
        )
        self.size = size
        self.limit = limit


class ExecutionEndedError(WorkflowError, InvalidStateError):
    """Cancel or terminate asked of an execution that has already ended; nothing was changed.

    :param execution_id: the execution.
    :param state: the terminal state it ended in (its value, e.g. ``Completed``).
    """

    error_code = "execution_ended"

    def __init__(self, execution_id: str, state: str, action: str) -> None:
        super().__init__(
            f"workflow execution {execution_id} already ended {state}: there is nothing to {action}"
        )
        self.execution_id = execution_id
        self.state = state


class NonDeterminismError(WorkflowError):
    """Replaying an execution met a different step than the checkpoint at that position.

    Workflow code must call the same steps in the same order on every run: decisions that can change
    (the clock, random numbers, I/O) belong inside steps, whose results are checkpointed.
    """

    def __init__(self, execution_id: str, seq: int, expected: str, found: str) -> None:
        super().__init__(
            f"non-deterministic workflow: execution {execution_id} position {seq} was checkpointed as "
            f"step {expected!r} but the code now calls {found!r}; workflow code must call the same "
            "steps in the same order on every run (put clocks, randomness and I/O inside steps)"
        )
        self.execution_id = execution_id
        self.seq = seq
        self.expected = expected
        self.found = found


class StepFailedError(WorkflowError):
    """A step raised (after its retries); raised again, with the same message, on every replay.

    :param step: the step's name.
    :param message: the step's error as checkpointed (``ExceptionType: message``).
    """

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"step {step!r} failed: {message}")
        self.step = step
        self.message = message


class ForkNotRecordedError(WorkflowError):
    """A fork with recorded effects reached a position its source run never recorded.

    Such a fork never runs a step for real, so it cannot go on: it ends ``Failed`` with this error.
    """

    def __init__(self, execution_id: str, source_execution_id: str, seq: int, name: str) -> None:
        super().__init__(
            f"fork {execution_id} reached position {seq} ({name!r}), which its source run "
            f"{source_execution_id} never recorded; a fork in mode recorded runs no step for real: "
            "fork again in mode live or live_quiet to run the steps from there"
        )
        self.execution_id = execution_id
        self.source_execution_id = source_execution_id
        self.seq = seq
        self.name = name


class UnknownQueueError(WorkflowError, InvalidFieldError):
    """No workflow queue is declared under this name (in this process)."""

    def __init__(self, field: str, name: str) -> None:
        super().__init__(
            field,
            f"no queue named {name!r:.80} is declared; declare it with harvest.queue({name!r:.80}, ...) "
            "or in HARVEST_WORKFLOW_QUEUES, in the web process and every worker",
        )
        self.name = name


class ChildFailedError(WorkflowError):
    """A child run the workflow waited for ended other than ``Completed``; raised again, the same,
    on every replay. The workflow may catch it.

    :param workflow_id: the child's ``workflow_id``.
    :param execution_id: the child's execution id (the last of its chain if it continued as new).
    :param state: how the child ended (``Failed``, ``Cancelled``, ``TimedOut`` or ``Terminated``).
    :param error: the child's error, as recorded.
    """

    def __init__(self, workflow_id: str, execution_id: str, state: str, error: str | None) -> None:
        super().__init__(f"child workflow {workflow_id!r} ({execution_id}) ended {state}: {error}")
        self.workflow_id = workflow_id
        self.execution_id = execution_id
        self.state = state
        self.error = error
