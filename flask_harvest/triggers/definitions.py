"""What a completion trigger is: source, target, matching terminal states, mapping and guard. Pure.

:class:`CompletionTrigger` validates itself when built (an :class:`~flask_harvest.errors.InvalidFieldError`
naming the trigger), and :func:`trigger_from_json` decodes the admin API's body with the same rules,
so both registration surfaces refuse the same definitions.
"""

from __future__ import annotations

import typing
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from ..conditions import Condition, condition_to_json, parse_condition, validate_condition
from ..conditions.values import check_text, describe
from ..errors import InvalidFieldError
from ..workflows.queues import check_count, check_key, check_priority
from .mappings import InputMapping, Passthrough, mapping_to_json, parse_mapping, validate_mapping

__all__ = [
    "MAX_NAME_LENGTH",
    "TERMINAL_STATE_NAMES",
    "CompletionTrigger",
    "parse_terminal_states",
    "static_trigger_id",
    "trigger_from_json",
    "trigger_to_json",
]

JsonValue = typing.Any

#: The terminal states a trigger may match, by their seed names (the execution states' values).
TERMINAL_STATE_NAMES = ("Completed", "Failed", "Cancelled", "TimedOut", "Terminated")
#: Workflow names are stored in a column of this width.
MAX_NAME_LENGTH = 255
#: The namespace of the ids given to statically registered triggers that name none.
_STATIC_NAMESPACE = uuid.UUID("0d6f1c1e-6a55-4b8e-9a59-3c6e1b2f7a10")
_JSON_KEYS = (
    "id",
    "source_workflow_name",
    "target_workflow_name",
    "terminal_states",
    "input_mapping",
    "condition",
    "queue_name",
    "concurrency_key",
    "concurrency_limit",
    "priority",
)
#: The target start's queue fields: ``None`` leaves each to the target workflow's default.
QUEUE_FIELDS = ("queue_name", "concurrency_key", "concurrency_limit", "priority")


def static_trigger_id(source_workflow_name: str, target_workflow_name: str) -> str:
    """The id a trigger gets when none is given: stable for one (source, target) pair, so a static
    registration upserts the same row at every start-up."""
    return str(uuid.uuid5(_STATIC_NAMESPACE, f"{source_workflow_name}\x00{target_workflow_name}"))


def parse_terminal_states(value: object, *, field: str = "terminal_states") -> tuple[str, ...]:
    """Return the terminal state names of ``value`` (a list of them), in order and without repeats.

    :raises InvalidFieldError: not a non-empty list of terminal state names.
    """
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise InvalidFieldError(field, f"must be a list of terminal states, not {describe(value)}")
    if not value:
        raise InvalidFieldError(field, f"must name at least one of {', '.join(TERMINAL_STATE_NAMES)}")
    names: list[str] = []
    for item in value:
        name = getattr(item, "value", item)  # an ExecutionState
        if not isinstance(name, str) or name not in TERMINAL_STATE_NAMES:
            shown = repr(name)[:40] if isinstance(name, str) else describe(name)
            raise InvalidFieldError(
                field, f"{shown} is not a terminal state; use {', '.join(TERMINAL_STATE_NAMES)}"
            )
        if name not in names:
            names.append(name)
    return tuple(names)


def _check_name(value: object, field: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_NAME_LENGTH:
        raise InvalidFieldError(
            field, f"must be a workflow name of 1 to {MAX_NAME_LENGTH} characters, not {describe(value)}"
        )
    if "\x00" in value:
        # PostgreSQL text cannot hold a NUL, and no workflow is registered under such a name.
        raise InvalidFieldError(field, "must not contain a NUL character")
    check_text(value, "the name", field)
    return value


def _check_id(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidFieldError("id", f"must be a UUID string, not {describe(value)}")
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidFieldError("id", f"{value!r:.60} is not a UUID") from None


@dataclass(frozen=True)
class CompletionTrigger:
    """Start ``target_workflow_name`` when a run of ``source_workflow_name`` ends in one of
    ``terminal_states``, with the input ``input_mapping`` makes, if ``condition`` holds::

        CompletionTrigger("etl_ingest", "daily_report", input_mapping=Projection("summary"))

    :param terminal_states: names (or :class:`~flask_harvest.workflows.ExecutionState` values) of
        ``Completed``, ``Failed``, ``Cancelled``, ``TimedOut``, ``Terminated``.
    :param input_mapping: a mapping, or its JSON form.
    :param condition: a guard condition, its JSON form, or ``None`` (always fire).
    :param id: a UUID; by default one derived from the source and target names.
    :param queue_name: the workflow queue the target starts in (default: the target workflow's).
    :param concurrency_key: the target's concurrency key in its queue.
    :param concurrency_limit: how many running runs may share that key (default 1).
    :param priority: the target's priority in its queue (default: the target workflow's).
    :raises InvalidFieldError: a field is invalid; the message names the trigger.
    """

    source_workflow_name: str
    target_workflow_name: str
    terminal_states: Sequence[str] = ("Completed",)
    input_mapping: InputMapping = field(default_factory=Passthrough)
    condition: Condition | None = None
    id: str = ""
    created_at: datetime | None = field(default=None, compare=False)
    updated_at: datetime | None = field(default=None, compare=False)
    queue_name: str | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    priority: int | None = None

    def __post_init__(self) -> None:
        try:
            source = _check_name(self.source_workflow_name, "source_workflow_name")
            target = _check_name(self.target_workflow_name, "target_workflow_name")
            ident = _check_id(self.id) if self.id else static_trigger_id(source, target)
            states = parse_terminal_states(self.terminal_states)
            mapping = validate_mapping(self.input_mapping)
            condition = self.condition
            if isinstance(condition, dict):
                condition = parse_condition(condition)
            elif condition is not None:
                condition = validate_condition(condition)
            # The queue's existence is checked where the target starts: the queue may be declared
            # in the workers only, or after this trigger.
            if self.queue_name is not None:
                check_key("queue_name", self.queue_name)
            if self.concurrency_key is not None:
                check_key("concurrency_key", self.concurrency_key)
            if self.concurrency_limit is not None:
                check_count("concurrency_limit", self.concurrency_limit)
            if self.priority is not None:
                check_priority(self.priority)
        except InvalidFieldError as exc:
            label = f"{self.source_workflow_name!r:.80} -> {self.target_workflow_name!r:.80}"
            if self.id:
                label = f"{self.id!r:.60} ({label})"
            raise InvalidFieldError(exc.field, f"{exc.message} (completion trigger {label})") from None
        object.__setattr__(self, "id", ident)
        object.__setattr__(self, "terminal_states", states)
        object.__setattr__(self, "input_mapping", mapping)
        object.__setattr__(self, "condition", condition)

    def matches(self, state: str) -> bool:
        """Whether a source ending in ``state`` (a terminal state name) is one this trigger fires on."""
        return getattr(state, "value", state) in self.terminal_states


def trigger_to_json(trigger: CompletionTrigger) -> dict[str, JsonValue]:
    """Return the trigger as the admin API shows it (``condition`` always present)."""
    return {
        "id": trigger.id,
        "source_workflow_name": trigger.source_workflow_name,
        "terminal_states": list(trigger.terminal_states),
        "target_workflow_name": trigger.target_workflow_name,
        "input_mapping": mapping_to_json(trigger.input_mapping),
        "condition": condition_to_json(trigger.condition) if trigger.condition is not None else None,
        **{name: getattr(trigger, name) for name in QUEUE_FIELDS},
        "created_at": _iso(trigger.created_at),
        "updated_at": _iso(trigger.updated_at),
    }


def trigger_from_json(data: object) -> CompletionTrigger:
    """Decode the admin API's registration body (a full definition: what is omitted is defaulted).

    ``terminal_states`` defaults to ``["Completed"]``, ``input_mapping`` to Passthrough, ``condition``
    to none, ``id`` to a fresh UUID.

    :raises InvalidFieldError: an unknown key, a missing name, or any invalid field.
    """
    if not isinstance(data, Mapping):
        raise InvalidFieldError("body", f"must be a JSON object, not {describe(data)}")
    extra = set(data) - set(_JSON_KEYS) - {"created_at", "updated_at"}
    if extra:
        names = ", ".join(repr(k)[:40] for k in sorted(extra, key=str))
        raise InvalidFieldError("body", f"unknown field(s) {names}; known: {', '.join(_JSON_KEYS)}")
    for required in ("source_workflow_name", "target_workflow_name"):
        if required not in data:
            raise InvalidFieldError(required, "is required")
    condition = data.get("condition")
    states = data.get("terminal_states", ["Completed"])
    ident = data.get("id")
    if ident is None:
        ident = str(uuid.uuid4())
    elif not isinstance(ident, str) or not ident:
        raise InvalidFieldError("id", f"must be a UUID string, not {describe(ident)}")
    return CompletionTrigger(
        source_workflow_name=data["source_workflow_name"],
        target_workflow_name=data["target_workflow_name"],
        terminal_states=states,
        input_mapping=parse_mapping(data.get("input_mapping", {"type": "Passthrough"})),
        condition=parse_condition(condition) if condition is not None else None,
        id=ident,
        **{name: data.get(name) for name in QUEUE_FIELDS},
    )


def _iso(when: datetime | None) -> str | None:
    return when.isoformat().replace("+00:00", "Z") if when is not None else None
