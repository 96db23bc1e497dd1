"""Durable workflows: registered functions whose steps are checkpointed in SQL and replayed.

This package is the engine, free of Flask and of any job backend: a :class:`WorkflowRegistry`, a
:class:`SqlWorkflowStore` (executions, step checkpoints, THE terminal transition and its
:class:`TerminalHooks`), and a :class:`WorkflowRunner` that starts and runs executions through a
``schedule(execution_id, due)`` callable bound to the job backend.
"""

from __future__ import annotations

from .children import ChildHandle
from .context import StepRetryPolicy, WorkflowContext
from .errors import (
    ChildFailedError,
    ExecutionEndedError,
    ExecutionNotFoundError,
    ForkNotRecordedError,
    InputTooLargeError,
    NonDeterminismError,
    StepFailedError,
    UnknownQueueError,
    UnknownWorkflowError,
    WorkflowError,
    WorkflowIdReusedError,
)
from .hooks import TerminalHook, TerminalHooks
from .models import Execution, ExecutionState, ForkMode, IdReusePolicy, ParentClosePolicy, StepRecord
from .queues import QueueSpec
from .registry import WorkflowDefinition, WorkflowRegistry
from .runner import WorkflowRunner
from .store import ExecutionCursor, LeaseSweep, SqlWorkflowStore

__all__ = [
    "ChildFailedError",
    "ChildHandle",
    "Execution",
    "ExecutionCursor",
    "ExecutionEndedError",
    "ExecutionNotFoundError",
    "ExecutionState",
    "ForkMode",
    "ForkNotRecordedError",
    "IdReusePolicy",
    "InputTooLargeError",
    "LeaseSweep",
    "NonDeterminismError",
    "ParentClosePolicy",
    "QueueSpec",
    "SqlWorkflowStore",
    "StepFailedError",
    "StepRecord",
    "StepRetryPolicy",
    "TerminalHook",
    "TerminalHooks",
    "UnknownQueueError",
    "UnknownWorkflowError",
    "WorkflowContext",
    "WorkflowDefinition",
    "WorkflowError",
    "WorkflowIdReusedError",
    "WorkflowRegistry",
    "WorkflowRunner",
]
