"""Which workflow functions exist: a name → function table filled by a decorator. Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, TypeVar

from .._input import text_problem
from ..errors import ConfigurationError, InvalidFieldError
from .cron import CronSchedule, tick_iso
from .errors import UnknownWorkflowError
from .models import JsonValue
from .queues import QueueSpec, QueueTable, check_key, check_priority

if TYPE_CHECKING:
    from .context import WorkflowContext

__all__ = ["WorkflowDefinition", "WorkflowFunction", "WorkflowRegistry"]

#: A workflow: called with its context and its JSON input, returns its JSON output.
WorkflowFunction = Callable[["WorkflowContext", JsonValue], JsonValue]

F = TypeVar("F", bound=WorkflowFunction)

#: Workflow names are stored in a column of this width.
MAX_NAME_LENGTH = 255


@dataclass(frozen=True)
class WorkflowDefinition:
    """A registered workflow.

    :param timeout: how long a run may take from its start; ``None`` for no deadline.
    :param schedule: when the sweeper starts runs of it on its own; ``None`` for never.
    :param queue: the queue its runs are claimed through, unless a start names another.
    :param priority: its runs' priority in their queue, unless a start gives another.
    """

    name: str
    fn: WorkflowFunction
    timeout: timedelta | None = None
    schedule: CronSchedule | None = None
    queue: str | None = None
    priority: int = 0


class WorkflowRegistry:
    """The workflows this process knows, by name.

    Register them in a module that the web process and every worker import, so that a run started
    by one is understood by the others::

        registry = WorkflowRegistry()

        @registry.workflow("process_refund", timeout=timedelta(minutes=10))
        def process_refund(ctx, input):
            ...
    """

    def __init__(self) -> None:
        self._definitions: dict[str, WorkflowDefinition] = {}
        #: The workflow queues declared in code (:meth:`queue`).
        self.queues = QueueTable()

    def queue(
        self, name: str, *, concurrency: int | None = None, rate_limit: tuple[int, float] | None = None
    ) -> QueueSpec:
        """Declare the workflow queue ``name`` (again: its limits are replaced).

        :param concurrency: the most runs of the queue running at once; ``None`` for no limit.
        :param rate_limit: ``(limit, seconds)``: at most ``limit`` first starts in any ``seconds``.
        :raises ConfigurationError: a name or limit out of range.
        """
        try:
            spec = QueueSpec.build(name, concurrency=concurrency, rate_limit=rate_limit)
        except InvalidFieldError as exc:
            raise ConfigurationError(f"queue {name!r:.80}: {exc}") from None
        return self.queues.declare(spec)

    def workflow(
        self,
        name: str,
        *,
        timeout: timedelta | None = None,
        schedule: str | None = None,
        queue: str | None = None,
        priority: int = 0,
    ) -> Callable[[F], F]:
        """Return a decorator registering a function as the workflow ``name``.

        :param schedule: cron text (UTC; six fields for seconds first): start a run at each tick.
        :raises ConfigurationError: the name is empty, too long, or taken by another function; the
            timeout is not positive; the schedule is not valid cron text.
        """
        if (
            not isinstance(name, str)
            or not name.strip()
            or len(name) > MAX_NAME_LENGTH
            or text_problem(name) is not None
        ):
            raise ConfigurationError(
                f"a workflow name must be a non-empty string of at most {MAX_NAME_LENGTH} characters "
                f"of valid Unicode text without NUL, not {name!r}"
            )
        if timeout is not None and timeout <= timedelta(0):
            raise ConfigurationError(f"workflow {name!r}: the timeout must be positive, not {timeout}")
        cron = _parse_schedule(name, schedule) if schedule is not None else None
        try:
            # The queue itself may be declared later (or in the settings): a start checks it.
            if queue is not None:
                check_key("queue", queue)
            check_priority(priority)
        except InvalidFieldError as exc:
            raise ConfigurationError(f"workflow {name!r}: {exc}") from None

        def register(fn: F) -> F:
            existing = self._definitions.get(name)
            if existing is not None and existing.fn is not fn:
                raise ConfigurationError(
                    f"workflow {name!r} is already registered (by {_qualname(existing.fn)}); "
                    "give each workflow its own name"
                )
            self._definitions[name] = WorkflowDefinition(
                name, fn, timeout, schedule=cron, queue=queue, priority=priority
            )
            return fn

        return register

    def get(self, name: str) -> WorkflowDefinition:
        """Return the workflow registered as ``name``.

        :raises UnknownWorkflowError: none is.
        """
        try:
            return self._definitions[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name (a list from a JSON body)
            raise UnknownWorkflowError(name) from None

    def __contains__(self, name: object) -> bool:
        return name in self._definitions

    def __iter__(self) -> Iterator[WorkflowDefinition]:
        return iter(list(self._definitions.values()))

    def __len__(self) -> int:
        return len(self._definitions)

    def names(self) -> list[str]:
        """Return the registered names, sorted."""
        return sorted(self._definitions)


def _parse_schedule(name: str, schedule: str) -> CronSchedule:
    try:
        cron = CronSchedule.parse(schedule)
    except InvalidFieldError as exc:
        raise ConfigurationError(f"workflow {name!r}: {exc.message}") from None
    # Each tick's run has the workflow_id "<name>@<tick>", which must fit the workflow_id column.
    longest = MAX_NAME_LENGTH - len("@" + tick_iso(datetime(2000, 1, 1, tzinfo=timezone.utc)))
    if len(name) > longest:
        raise ConfigurationError(
            f"workflow {name!r}: a scheduled workflow's name must be at most {longest} characters"
        )
    return cron


def _qualname(fn: object) -> str:
    module = getattr(fn, "__module__", "?")
    return f"{module}.{getattr(fn, '__qualname__', repr(fn))}"
