"""What a workflow execution is: its states, its row as a value, its step checkpoints. Pure.

Inputs, outputs and step results are JSON values. :func:`encode_json` is the one gate they pass:
it refuses what would not come back equal from the database (NaN, tuples, non-string keys, sets,
objects), so a replay sees exactly what the first run saw.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .._input import check_json_value, check_text, text_problem
from .._time import utcnow as utcnow  # re-exported: callers that imported it from here keep working
from ..errors import InvalidFieldError
from .errors import InputTooLargeError

__all__ = [
    "Execution",
    "ExecutionState",
    "ForkMode",
    "IdReusePolicy",
    "JsonValue",
    "ParentClosePolicy",
    "StepRecord",
    "check_reason",
    "decode_json",
    "describe_error",
    "encode_json",
    "storable_text",
    "timeout_message",
]

#: A JSON value: ``None``, ``bool``, ``int``, ``float``, ``str``, ``list`` or ``dict`` with ``str`` keys.
JsonValue = Any


class ExecutionState(str, enum.Enum):
    """The states of a workflow execution. ``Pending`` and ``Running`` are open; the rest terminal."""

    PENDING = "Pending"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    CANCELLED = "Cancelled"
    TIMED_OUT = "TimedOut"
    TERMINATED = "Terminated"
    #: The run handed over to the next run of its ``workflow_id`` (``ctx.continue_as_new``). The
    #: row is closed, but the logical run goes on: it is not an outcome, so no completion callback
    #: and no completion trigger ever matches it.
    CONTINUED_AS_NEW = "ContinuedAsNew"

    @property
    def terminal(self) -> bool:
        """Whether an execution in this state has ended (it never changes state again)."""
        return self not in (ExecutionState.PENDING, ExecutionState.RUNNING)

    @property
    def outcome(self) -> bool:
        """Whether this state is how a logical run ended: terminal, and not ``ContinuedAsNew``."""
        return self.terminal and self is not ExecutionState.CONTINUED_AS_NEW


#: The states an execution can leave; a terminal transition only moves a row in one of these.
OPEN_STATES = (ExecutionState.PENDING, ExecutionState.RUNNING)
#: The outcomes a logical run can end with: what completion callbacks and triggers match.
TERMINAL_STATES = tuple(s for s in ExecutionState if s.outcome)
#: Every state a row can close in: the outcomes, and ``ContinuedAsNew``.
CLOSED_STATES = tuple(s for s in ExecutionState if s.terminal)


class Isolation(str, enum.Enum):
    """Whether a run must run alone in its worker process: what makes the poison-pill rule exact
    with several runs at once (see :doc:`workflows`). ``None`` on a run is neither: it runs beside
    others, and a death of its process is not charged to it."""

    #: Its process died while it ran beside other runs: which run killed it is unknown, so it is
    #: not charged but runs alone from now on. Its current claim (if any) has not started it alone.
    QUARANTINED = "quarantined"
    #: Its current claim runs it alone in its process: a death of the process now is charged to it.
    ALONE = "alone"


class ForkMode(str, enum.Enum):
    """How a fork runs the steps from its fork point on (see :doc:`forks`)."""

    #: Steps at or after the fork point return the source run's recorded results; the fork
    #: enqueues no completion callback and fires no completion trigger.
    RECORDED = "recorded"
    #: Steps at or after the fork point run for real; callbacks and triggers as for any run.
    LIVE = "live"
    #: Steps run for real, but the fork notifies no one: no completion trigger, no callback.
    LIVE_QUIET = "live_quiet"

    @property
    def notifies(self) -> bool:
        """Whether a fork in this mode enqueues completion callbacks and fires triggers."""
        return self is ForkMode.LIVE


class ParentClosePolicy(str, enum.Enum):
    """What happens to a child run that is still open when its parent closes (Temporal's)."""

    #: The child ends ``Terminated`` in the parent's terminal transaction.
    TERMINATE = "Terminate"
    #: The child is asked to cancel, as :meth:`WorkflowService.cancel` would.
    REQUEST_CANCEL = "RequestCancel"
    #: The child runs on, on its own.
    ABANDON = "Abandon"


class IdReusePolicy(str, enum.Enum):
    """What starting a ``workflow_id`` whose previous run has closed does (Temporal's policies).

    While a run with the ``workflow_id`` is open, starting again always returns that run.
    """

    #: Start a new run whatever the previous one ended as.
    ALLOW_DUPLICATE = "AllowDuplicate"
    #: Start a new run only if the last run did not end ``Completed`` (it failed, was cancelled,
    #: terminated or timed out); as in Temporal, only the last run counts, not earlier ones.
    ALLOW_DUPLICATE_FAILED_ONLY = "AllowDuplicateFailedOnly"
    #: Never start a second run of a ``workflow_id``.
    REJECT_DUPLICATE = "RejectDuplicate"


@dataclass(frozen=True)
class Execution:
    """One run of a workflow, as stored.

    :param execution_id: the run's id (a UUID string), unique across every run.
    :param workflow_id: the caller's business key; at most one open run has it at a time.
    :param attempt: how many times the run was claimed by a worker.
    :param recovery_count: how many times its lease expired (its worker died) and it was requeued.
    :param next_run_at: when a ``Pending`` run is due (its start, or its wake time after a sleep).
    :param trigger_depth: how many completion triggers led to this run (0 when started directly).
    :param completion_callbacks: the completion-callback targets registered with the run, if any.
    :param continued_from: the run of the same ``workflow_id`` that continued as this one.
    :param continued_to: the run this one continued as (set when it closed ``ContinuedAsNew``).
    :param parent_execution_id: the run that started this one as its child.
    :param parent_close_policy: what this child does when its parent closes (a
        :class:`ParentClosePolicy` value).
    :param waiting_on: the ``workflow_id`` of the child this ``Pending`` run waits for.
    :param forked_from: the run this one is a fork of.
    :param fork_from_step: the position from which the fork's steps are new (or, recorded, replayed).
    :param fork_mode: how a fork runs its new steps (a :class:`ForkMode` value).
    :param queue_name: the queue the run is claimed through (``None``: no queue, no limits).
    :param concurrency_key: runs sharing this key in the queue are limited to ``concurrency_limit``.
    :param concurrency_limit: how many running runs may share ``concurrency_key``.
    :param priority: lower runs first among due runs of its queue.
    :param trace_context: the W3C trace context of the span that started the run
        (:mod:`flask_harvest.tracing`); ``None`` when nothing was traced.
    :param isolation: whether the run must run alone in its process (an :class:`Isolation` value;
        ``None``: it runs beside others).
    :param charged_recoveries: those of its recoveries charged to it: its worker died while it ran
        alone in its process. The poison-pill limit counts these.
    """

    execution_id: str
    workflow_name: str
    workflow_id: str
    input: JsonValue
    state: ExecutionState
    created_at: datetime
    output: JsonValue = None
    error: str | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    deadline: datetime | None = None
    attempt: int = 0
    recovery_count: int = 0
    lease_token: str | None = None
    lease_expires_at: datetime | None = None
    next_run_at: datetime | None = None
    cancel_requested: bool = False
    cancel_reason: str | None = None
    trigger_depth: int = 0
    completion_callbacks: JsonValue = None
    continued_from: str | None = None
    continued_to: str | None = None
    parent_execution_id: str | None = None
    parent_close_policy: str | None = None
    waiting_on: str | None = None
    forked_from: str | None = None
    fork_from_step: int | None = None
    fork_mode: str | None = None
    queue_name: str | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    priority: int = 0
    trace_context: str | None = None
    isolation: str | None = None
    charged_recoveries: int = 0

    @property
    def terminal(self) -> bool:
        """Whether the run has ended (``ContinuedAsNew`` included: the row never moves again)."""
        return self.state.terminal

    @property
    def notifies(self) -> bool:
        """Whether this run's end enqueues completion callbacks and fires completion triggers.

        Only an outcome does (never ``ContinuedAsNew``: the chain's last run notifies), and a fork
        only in :attr:`ForkMode.LIVE`.
        """
        if not self.state.outcome:
            return False
        return self.fork_mode is None or ForkMode(self.fork_mode).notifies


@dataclass(frozen=True)
class StepRecord:
    """A step's checkpoint: its position, name, and either its JSON result or its error message."""

    execution_id: str
    seq: int
    name: str
    output: JsonValue = None
    error: str | None = None
    created_at: datetime | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None


def encode_json(value: JsonValue, *, field: str, max_bytes: int | None = None) -> str:
    """Return ``value`` as compact JSON text, refusing what is not a JSON value or is too large.

    :param field: names the value in errors (``input``, ``output``, ``step 'charge'``).
    :param max_bytes: refuse a UTF-8 encoding longer than this, if given.
    :raises InvalidFieldError: ``value`` is not a JSON value that comes back equal after decoding,
        has a string that is not valid Unicode (a lone surrogate), or nests deeper than
        :data:`~flask_harvest._input.MAX_JSON_DEPTH`.
    :raises InputTooLargeError: its encoding is longer than ``max_bytes``.
    """
    # First, without recursion: what the database could not store (lone surrogates) and what the
    # recursive encoder and decoder could not handle (absurd depth) are bad input, never a driver
    # error or a RecursionError. NUL is fine: JSON escapes it as \u0000.
    check_json_value(value, field, nul=True)
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidFieldError(field, f"is not a JSON value ({exc})") from exc
    # dumps quietly turns tuples into lists and int keys into strings: the round trip catches
    # those, which would otherwise replay as a different value than the first run saw.
    try:
        same = json.loads(text) == value
    except RecursionError as exc:
        raise InvalidFieldError(field, "is nested too deeply") from exc
    if not same:
        raise InvalidFieldError(
            field, "is not a JSON value (use dict with str keys, list, str, int, float, bool, None)"
        )
    # A lone surrogate (JSON's "\ud800") decodes to a str that no database driver can send.
    problem = text_problem(text, nul=True)
    if problem is not None:
        raise InvalidFieldError(field, problem)
    size = len(text.encode("utf-8"))
    if max_bytes is not None and size > max_bytes:
        raise InputTooLargeError(field, size, max_bytes)
    return text


def check_reason(reason: object) -> None:
    """Refuse a cancel or terminate reason that is not text a database can store.

    :raises InvalidFieldError: it is not ``None`` or a string, or holds a NUL or a lone surrogate.
    """
    if reason is None:
        return
    if not isinstance(reason, str):
        raise InvalidFieldError("reason", f"must be a string, not {type(reason).__name__}")
    check_text(reason, "reason")


def storable_text(text: str) -> str:
    """Return ``text`` in a form every database stores: NUL and lone surrogates escaped.

    For the messages the engine writes itself (an exception's text as a step's or a run's error),
    which come from code, not from a caller that could be told its input is bad.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def describe_error(exc: BaseException) -> str:
    """Return ``ExceptionType: message`` for ``exc``, storable, even if its ``str()`` raises."""
    try:
        message = str(exc)
    except Exception:
        message = f"<{type(exc).__name__} whose message cannot be shown>"
    return storable_text(f"{type(exc).__name__}: {message}")


def decode_json(text: str | None) -> JsonValue:
    """Return the value of JSON text written by :func:`encode_json` (``None`` for ``None``)."""
    return None if text is None else json.loads(text)


def timeout_message(deadline: datetime) -> str:
    """The error of a run that ended ``TimedOut``."""
    return f"timed out: the workflow's deadline {deadline.isoformat()} passed"
