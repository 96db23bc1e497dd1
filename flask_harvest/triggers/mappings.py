"""Input mappings: what a completion trigger gives its target workflow as input. Pure.

Adjacently tagged JSON:

=========================================================  ==============================================
``{"type": "Passthrough"}``                                the source's output as it is
``{"type": "Static", "data": <any JSON>}``                 that value
``{"type": "Projection", "data": "results.summary"}``      the value at the dotted path of the output
                                                           (``null`` when the path is missing)
``{"type": "Outcome", "data": {"projection": null}}``      the terminal-outcome envelope (below), or the
                                                           value at ``projection`` in it
=========================================================  ==============================================

The envelope: ``terminal_state`` (``COMPLETED``, ``FAILED``, ``CANCELLED``, ``TIMED_OUT``,
``TERMINATED``), ``source_exec_id``, ``source_workflow_id``, ``source_workflow_name``, ``output``
(``null`` unless the source completed) and ``error`` (the failure message, or the cancel, timeout or
terminate reason, when one was recorded; else ``null``). All six are always present.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

from ..conditions.paths import MISSING, parse_path, select
from ..conditions.values import check_value, describe, names, parse_tagged
from ..errors import InvalidFieldError

__all__ = [
    "ENVELOPE_STATES",
    "MAPPING_TYPES",
    "InputMapping",
    "Outcome",
    "Passthrough",
    "Projection",
    "SourceOutcome",
    "Static",
    "apply_mapping",
    "mapping_to_json",
    "outcome_envelope",
    "parse_mapping",
    "validate_mapping",
]

JsonValue = typing.Any

#: The envelope's ``terminal_state`` of each terminal state name.
ENVELOPE_STATES = {
    "Completed": "COMPLETED",
    "Failed": "FAILED",
    "Cancelled": "CANCELLED",
    "TimedOut": "TIMED_OUT",
    "Terminated": "TERMINATED",
}


@dataclass(frozen=True)
class Passthrough:
    """The source's output, unchanged (``null`` for a source that did not complete)."""


@dataclass(frozen=True)
class Static:
    """A fixed JSON value."""

    value: JsonValue


@dataclass(frozen=True)
class Projection:
    """The value at a dotted path of the source's output (``""``: all of it)."""

    path: str


@dataclass(frozen=True)
class Outcome:
    """The terminal-outcome envelope, or the value at ``projection`` inside it."""

    projection: str | None = None


InputMapping = typing.Union[Passthrough, Static, Projection, Outcome]  # noqa: UP007
#: Every mapping's JSON ``type`` name.
MAPPING_TYPES = ("Passthrough", "Static", "Projection", "Outcome")


@dataclass(frozen=True)
class SourceOutcome:
    """What a mapping reads of the source execution, as recorded at its terminal transition."""

    execution_id: str
    workflow_id: str
    workflow_name: str
    state: str
    output: JsonValue = None
    error: str | None = None


def parse_mapping(data: object, *, field: str = "input_mapping") -> InputMapping:
    """Return the mapping its JSON form describes.

    :raises InvalidFieldError: an unknown type or key, a wrong shape, or a malformed path.
    """
    kind, data = parse_tagged(data, MAPPING_TYPES, "a mapping", field)
    if kind == "Passthrough":
        if data.get("data") is not None:
            raise InvalidFieldError(field, "Passthrough takes no 'data'")
        return Passthrough()
    if "data" not in data:
        raise InvalidFieldError(field, f"{kind} has no 'data'")
    body = data["data"]
    if kind == "Static":
        check_value(body, "data", field)
        return Static(body)
    if kind == "Projection":
        _check_path(body, "data", field)
        return Projection(typing.cast(str, body))
    if not isinstance(body, dict):
        raise InvalidFieldError(
            field, f'Outcome\'s data must be an object {{"projection"}}, not {describe(body)}'
        )
    extra = set(body) - {"projection"}
    if extra:
        raise InvalidFieldError(
            field, f"Outcome's data has unknown key(s) {names(extra)}; it takes 'projection'"
        )
    projection = body.get("projection")
    if projection is not None:
        _check_path(projection, "data.projection", field)
    return Outcome(typing.cast("str | None", projection))


def _check_path(path: object, where: str, field: str) -> None:
    try:
        parse_path(path)
    except InvalidFieldError as exc:
        raise InvalidFieldError(field, f"{where}: {exc.message}") from None


def validate_mapping(mapping: object, *, field: str = "input_mapping") -> InputMapping:
    """Check a mapping built in Python (or given as JSON) and return it as parsed.

    :raises InvalidFieldError: it is not a valid mapping.
    """
    if isinstance(mapping, dict):
        return parse_mapping(mapping, field=field)
    if not isinstance(mapping, Passthrough | Static | Projection | Outcome):
        raise InvalidFieldError(
            field,
            f"must be Passthrough(), Static(v), Projection(path) or Outcome(), not {type(mapping).__name__}",
        )
    return parse_mapping(mapping_to_json(mapping), field=field)


def mapping_to_json(mapping: InputMapping) -> dict[str, JsonValue]:
    """Return the adjacently tagged JSON form of ``mapping``."""
    if isinstance(mapping, Passthrough):
        return {"type": "Passthrough"}
    if isinstance(mapping, Static):
        return {"type": "Static", "data": mapping.value}
    if isinstance(mapping, Projection):
        return {"type": "Projection", "data": mapping.path}
    return {"type": "Outcome", "data": {"projection": mapping.projection}}


def outcome_envelope(source: SourceOutcome) -> dict[str, JsonValue]:
    """Return the terminal-outcome envelope of ``source``."""
    envelope: dict[str, JsonValue] = {
        "terminal_state": ENVELOPE_STATES.get(source.state, str(source.state).upper()),
        "source_exec_id": source.execution_id,
        "source_workflow_id": source.workflow_id,
        "source_workflow_name": source.workflow_name,
        # Both always present, as in the seed's envelope: null where they do not apply.
        "output": source.output if source.state == "Completed" else None,
        "error": source.error if source.state != "Completed" else None,
    }
    return envelope


def apply_mapping(mapping: InputMapping, source: SourceOutcome) -> JsonValue:
    """Return the target's input. Never raises: a missing projection gives ``null``."""
    output = source.output if source.state == "Completed" else None
    if isinstance(mapping, Passthrough):
        return output
    if isinstance(mapping, Static):
        return mapping.value
    if isinstance(mapping, Projection):
        return _project(output, mapping.path)
    envelope = outcome_envelope(source)
    return envelope if mapping.projection is None else _project(envelope, mapping.projection)


def _project(value: JsonValue, path: str) -> JsonValue:
    try:
        segments = parse_path(path)
    except InvalidFieldError:
        return None
    found = select(value, segments)
    return None if found is MISSING else found
