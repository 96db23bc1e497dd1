"""The event catalog: the event types an app sends, each with a JSON Schema for its payload.

Pure: no Flask, SQL or network (a schema's remote ``$ref`` is never fetched). An event type is
registered in code (:meth:`EventCatalog.register`, or ``harvest.event_type(...)``); registration
checks the schema against its dialect's metaschema and the example against the schema, so a broken
type fails where it is declared, not at the first dispatch. Dispatch asks :meth:`EventCatalog.check`
for the first problem of a payload; subscriptions ask :meth:`EventCatalog.unmatched_patterns`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from jsonschema import (
    Draft4Validator,
    Draft6Validator,
    Draft7Validator,
    Draft201909Validator,
    Draft202012Validator,
)
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable

from .._input import check_json_value, id_problem, parse_json, text_problem
from ..errors import InvalidFieldError
from .topics import RESERVED_PREFIX, topic_matches, validate_topic

__all__ = [
    "EventCatalog",
    "EventType",
    "PayloadProblem",
    "render_rst",
]

#: The longest event type name (as long as an id).
MAX_NAME_CHARS = 255
#: The longest description.
MAX_DESCRIPTION_CHARS = 2048
#: The highest version number.
MAX_VERSION = 2**31 - 1
#: The longest text of one payload problem: the rule that failed, never the whole payload.
_MAX_PROBLEM_CHARS = 300

#: The JSON Schema dialects a schema may name with ``$schema``; without one, 2020-12 applies.
# jsonschema ships no types: its validator classes are Any here.
_DIALECTS: dict[str, Any] = {}
for _cls in (Draft4Validator, Draft6Validator, Draft7Validator, Draft201909Validator, Draft202012Validator):
    _uri = _cls.META_SCHEMA.get("$id") or _cls.META_SCHEMA.get("id")
    _DIALECTS[str(_uri).rstrip("#")] = _cls
    _DIALECTS[str(_uri).rstrip("#").replace("http://", "https://", 1)] = _cls

#: Rules whose own message names what is missing or extra (a property name), not a payload value.
_NAMING_RULES = frozenset({"required", "additionalProperties", "unevaluatedProperties", "dependentRequired"})


def _no_retrieval(uri: str) -> Any:
    # A schema is applied where events are sent: reaching out to the network there would make a
    # dispatch depend on a stranger's server. A schema must carry its own definitions ($defs).
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


_OFFLINE: Registry[Any] = Registry(retrieve=_no_retrieval)  # type: ignore[call-arg]


@dataclass(frozen=True)
class PayloadProblem:
    """Why a payload does not match its event type's schema: where (a JSON path) and what."""

    #: Where in the payload, as a JSON path: ``$`` is the payload itself, ``$.items[2].sku`` inside.
    path: str
    #: What is wrong there, naming the rule that failed; never the payload's own values.
    message: str

    def __str__(self) -> str:
        return f"at {self.path}: {self.message}"


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 80 else text[:77] + "..."


def _problem(error: ValidationError) -> PayloadProblem:
    if error.validator in _NAMING_RULES:
        message = error.message
    else:
        message = f"does not match the schema's {error.validator!r} rule ({_short(error.validator_value)})"
    return PayloadProblem(error.json_path, message[:_MAX_PROBLEM_CHARS])


def _json_copy(value: Any, field: str) -> Any:
    """``value`` as plain JSON data (a deep copy), or :class:`InvalidFieldError` naming ``field``."""
    check_json_value(value, field, nul=True)
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except RecursionError:
        raise InvalidFieldError(field, "is nested too deeply") from None
    except (TypeError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InvalidFieldError(field, f"must be JSON data ({reason})") from None
    return parse_json(text, field)


def _validator_class(schema: Any, name: str) -> Any:
    if isinstance(schema, bool):
        return Draft202012Validator
    if not isinstance(schema, dict):
        raise InvalidFieldError(
            "schema",
            f"event type {name!r}: a JSON Schema is an object (or true/false), not {type(schema).__name__}",
        )
    dialect = schema.get("$schema")
    if dialect is None:
        return Draft202012Validator
    found = _DIALECTS.get(dialect.rstrip("#")) if isinstance(dialect, str) else None
    if found is None:
        known = ", ".join(sorted({u for u in _DIALECTS if u.startswith("https://")}))
        raise InvalidFieldError("schema", f"event type {name!r}: unknown $schema dialect; use one of {known}")
    return found


@dataclass(frozen=True)
class EventType:
    """One kind of event an app sends: its name (a topic), what it means, and its payload's shape.

    Build it with :meth:`EventCatalog.register` (or ``harvest.event_type``), which checks it.

    :param name: the topic it is dispatched under, such as ``order.created`` (no ``*``).
    :param description: one or two sentences for the people who subscribe.
    :param schema: a JSON Schema (2020-12 unless ``$schema`` names another dialect) of the payload.
    :param example: a payload that matches the schema.
    :param version: a positive integer; raise it when the schema changes in a way receivers notice.
    """

    name: str
    description: str
    schema: Any
    example: Any
    version: int = 1

    def to_dict(self) -> dict[str, Any]:
        """The type as JSON: the actuator's answer and the CLI's ``--json``."""
        return {
            "name": self.name,
            "description": self.description,
            "version": self.version,
            "schema": self.schema,
            "example": self.example,
        }

    def validator(self) -> Any:
        """A validator of this type's schema, which never fetches a remote ``$ref``; built once
        per type, as every dispatch of the type uses it."""
        return self._validator

    @cached_property
    def _validator(self) -> Any:
        cls = _validator_class(self.schema, self.name)
        return cls(self.schema, registry=_OFFLINE)

    def problem(self, payload: Any) -> PayloadProblem | None:
        """Return the most relevant reason ``payload`` (JSON data) does not match, or ``None``."""
        try:
            validator = self.validator()
            # The common case first: a valid payload, without collecting and ranking errors.
            if validator.is_valid(payload):
                return None
            error = best_match(validator.iter_errors(payload))
        except Unresolvable as exc:
            return PayloadProblem("$", f"the schema cannot be applied: {exc} (remote $refs are not fetched)")
        except RecursionError:
            return PayloadProblem("$", "the schema cannot be applied: it refers to itself without end")
        return None if error is None else _problem(error)


def make_event_type(
    name: Any, *, description: Any = "", schema: Any, example: Any, version: Any = 1
) -> EventType:
    """Check every part of an event type and return it.

    :raises InvalidFieldError: naming the part (``name``, ``description``, ``schema``, ``example``,
        ``version``) that is wrong and why: a name that is not a plain topic, a schema that is not a
        valid JSON Schema, an example that does not match it.
    """
    problem = id_problem(name, max_chars=MAX_NAME_CHARS)
    if problem is not None:
        raise InvalidFieldError("name", f"an event type name {problem}")
    validate_topic(name, pattern=False, field_name="name")
    if not isinstance(description, str):
        raise InvalidFieldError("description", f"event type {name!r}: must be a string")
    problem = text_problem(description)
    if problem is None and len(description) > MAX_DESCRIPTION_CHARS:
        problem = f"must be at most {MAX_DESCRIPTION_CHARS} characters"
    if problem is not None:
        raise InvalidFieldError("description", f"event type {name!r}: {problem}")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
        raise InvalidFieldError("version", f"event type {name!r}: must be an integer from 1 to {MAX_VERSION}")
    schema = _json_copy(schema, "schema")
    example = _json_copy(example, "example")
    cls = _validator_class(schema, name)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(part) for part in exc.path) or "the top level"
        raise InvalidFieldError(
            "schema",
            f"event type {name!r}: not a valid JSON Schema at {where}: {exc.message[:_MAX_PROBLEM_CHARS]}",
        ) from None
    except RecursionError:
        raise InvalidFieldError("schema", f"event type {name!r}: is nested too deeply") from None
    event_type = EventType(name, description, schema, example, version)
    mismatch = event_type.problem(example)
    if mismatch is not None:
        raise InvalidFieldError("example", f"event type {name!r}: does not match its schema {mismatch}")
    return event_type


class EventCatalog:
    """The event types of an app, by name. Shared by every app the extension is registered on,
    and read at each dispatch, so a type registered later applies at once."""

    def __init__(self) -> None:
        self._types: dict[str, EventType] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<EventCatalog {sorted(self._types)}>"

    def __len__(self) -> int:
        return len(self._types)

    def register(
        self, name: str, *, description: str = "", schema: Any, example: Any, version: int = 1
    ) -> EventType:
        """Check and add an event type (see :func:`make_event_type`); return it.

        Registering the same type again (equal in every part) is a no-op, so a module imported
        twice does no harm.

        :raises InvalidFieldError: a part is wrong, or another type of that name is registered.
        """
        event_type = make_event_type(
            name, description=description, schema=schema, example=example, version=version
        )
        with self._lock:
            known = self._types.get(event_type.name)
            if known is not None and known != event_type:
                raise InvalidFieldError(
                    "name",
                    f"another event type {event_type.name!r} is registered already; give each type "
                    "its own name (raise its version to change a type)",
                )
            self._types[event_type.name] = event_type
        return event_type

    def get(self, name: str) -> EventType | None:
        """Return the type named ``name``, or ``None``."""
        return self._types.get(name) if isinstance(name, str) else None

    def types(self) -> list[EventType]:
        """Every registered type, by name."""
        return [self._types[name] for name in sorted(self._types)]

    def check(self, topic: str, payload: Any) -> tuple[EventType | None, PayloadProblem | None]:
        """Return the type of ``topic`` (``None`` when it has none) and the payload's problem
        (``None`` when it matches, or when there is no type to check it against)."""
        event_type = self.get(topic)
        if event_type is None:
            return None, None
        return event_type, event_type.problem(payload)

    def unmatched_patterns(self, patterns: Iterable[str]) -> list[str]:
        """Return a warning for each topic pattern that selects no registered type (none when the
        catalog is empty: an app without a catalog gets no warnings)."""
        # flask-harvest's own types (the operational notifications) never reach a subscription by
        # its patterns: an app that only has those has no catalog to warn against.
        names = [name for name in self._types if not name.startswith(RESERVED_PREFIX)]
        if not names:
            return []
        return [
            f"topic pattern {pattern!r} matches no event type in the catalog"
            for pattern in patterns
            if not any(topic_matches(pattern, name) for name in names)
        ]


def render_rst(catalog: EventCatalog | Iterable[EventType], *, title: str = "Event types") -> str:
    """Return reStructuredText describing every type: a section each, with its description,
    version, schema and example as JSON blocks. Write it into your docs (see the event catalog
    page of the documentation)."""
    types = catalog.types() if isinstance(catalog, EventCatalog) else list(catalog)
    lines = [title, "=" * len(title), ""]
    for event_type in types:
        heading = f"``{event_type.name}``"
        lines += [heading, "-" * len(heading), ""]
        if event_type.description:
            lines += [_rst_text(event_type.description), ""]
        lines += [f"Version: {event_type.version}", ""]
        for label, value in (("Schema", event_type.schema), ("Example", event_type.example)):
            lines += [f"{label}:", "", ".. code-block:: json", ""]
            text = json.dumps(value, indent=2, ensure_ascii=False)
            lines += [("   " + line) if line else "" for line in text.splitlines()]
            lines.append("")
    return "\n".join(lines)


def _rst_text(text: str) -> str:
    # Shown as plain text: a description's '*' or '`' must not start markup that breaks the build.
    escaped = text.replace("\\", "\\\\")
    for char in "*`|_[]":
        escaped = escaped.replace(char, "\\" + char)
    return "\n".join(line.strip() for line in escaped.splitlines())
