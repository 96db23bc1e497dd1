"""Child runs, the pure part: the handle a parent gets, and the recorded outcome of a child.

A parent starts a child with :meth:`WorkflowContext.start_child
<flask_harvest.workflows.context.WorkflowContext.start_child>` and waits for it with
:meth:`~flask_harvest.workflows.context.WorkflowContext.wait_child`; both are checkpointed
positions, so a replay returns the same child and the same outcome. The SQL side is
:mod:`._children`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import InvalidStateError
from .errors import ChildFailedError
from .models import ExecutionState, JsonValue

__all__ = [
    "CHILD_STEP",
    "WAIT_CHILD_STEP",
    "ChildHandle",
    "child_outcome",
    "child_result",
    "child_workflow_id",
]

#: The checkpoint name of ``ctx.start_child``: its recorded value is the child's ids.
CHILD_STEP = "harvest:child"
#: The checkpoint name of ``ctx.wait_child``: its recorded value is the child's outcome.
WAIT_CHILD_STEP = "harvest:wait_child"


@dataclass(frozen=True)
class ChildHandle:
    """A child run started by a workflow: its ``execution_id`` and ``workflow_id``.

    Inside the parent, :meth:`result` waits for the child durably (``ctx.wait_child(handle)``).
    """

    execution_id: str
    workflow_id: str
    _wait: Callable[[ChildHandle], JsonValue] | None = field(default=None, repr=False, compare=False)

    def result(self) -> JsonValue:
        """Wait durably for the child and return its output (see ``ctx.wait_child``).

        :raises ChildFailedError: the child ended other than ``Completed``.
        :raises InvalidStateError: the handle was not made by ``ctx.start_child`` in a running workflow.
        """
        if self._wait is None:
            raise InvalidStateError(
                "this child handle is not bound to a running workflow: wait for the child with "
                "ctx.wait_child(handle) inside the parent"
            )
        return self._wait(self)


def child_workflow_id(parent_execution_id: str, seq: int) -> str:
    """The default ``workflow_id`` of the child started at position ``seq`` of a parent run."""
    return f"{parent_execution_id}:{seq}"


def child_outcome(state: ExecutionState, output: JsonValue, error: str | None) -> dict[str, JsonValue]:
    """What ``ctx.wait_child`` records: the child's end, as JSON."""
    return {
        "state": state.value,
        "output": output if state is ExecutionState.COMPLETED else None,
        "error": None if state is ExecutionState.COMPLETED else error,
    }


def child_result(handle_workflow_id: str, handle_execution_id: str, outcome: JsonValue) -> JsonValue:
    """Return a recorded outcome's output, or raise :class:`ChildFailedError` for any other end."""
    state = outcome["state"]
    if state == ExecutionState.COMPLETED.value:
        return outcome["output"]
    raise ChildFailedError(handle_workflow_id, handle_execution_id, state, outcome["error"])
