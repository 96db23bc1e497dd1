"""The one place bad input is recognised, before it reaches a parser, a database or an encoder.

Every edge uses it: the admin HTTP helpers (bodies, query strings, path ids), the marshmallow
schemas, DLQ cursors, the CLI, the receiver kit and :func:`~flask_harvest.webhooks.payload.encode_payload`.
Pure: no Flask, SQL or network. What it refuses, and why:

- NUL characters: PostgreSQL cannot store them in text, so one reaching the database would look
  like an outage (a driver error) instead of bad input.
- Lone surrogates (``"\\ud800"`` in JSON, undecodable bytes in ``sys.argv``): they cannot be
  encoded as UTF-8, so they would fail in the database driver, the log or the socket.
- JSON nested deeper than :data:`MAX_JSON_DEPTH`: Python's parser and encoder recurse, so the
  depth is counted first, without recursion.
- Datetimes that leave the representable range once converted to UTC.
- Ids (of subscriptions, deliveries, workflow runs, triggers) with a control character: an id is
  echoed in logs, terminals and headers, where ESC or BEL would act instead of showing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import IO, Any

from .errors import InvalidFieldError

#: The deepest JSON accepted anywhere (admin bodies, event payloads, received webhooks): far beyond
#: any real document, far below the interpreter's recursion limit.
MAX_JSON_DEPTH = 128

NUL_MESSAGE = "must not contain NUL characters"
SURROGATE_MESSAGE = "must be valid Unicode text (no lone surrogates or undecodable bytes)"
DEPTH_MESSAGE = f"is nested too deeply (more than {MAX_JSON_DEPTH} levels)"
CONTROL_MESSAGE = "must not contain control characters"

#: C0 controls, DEL and C1 controls (Unicode category Cc).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def text_problem(value: str, *, nul: bool = False) -> str | None:
    """Return why ``value`` cannot be stored and sent as text, or ``None`` if it can.

    :param nul: allow NUL characters (text that is JSON-escaped before it is stored).
    """
    if not nul and "\x00" in value:
        return NUL_MESSAGE
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return SURROGATE_MESSAGE
    return None


def check_text(value: str, field: str, *, nul: bool = False) -> str:
    """Return ``value`` if :func:`text_problem` finds nothing, else raise :class:`InvalidFieldError`.

    The message never shows the value: it may be a secret.
    """
    problem = text_problem(value, nul=nul)
    if problem is not None:
        raise InvalidFieldError(field, problem)
    return value


def id_problem(value: object, *, max_chars: int | None = None) -> str | None:
    """Return why ``value`` cannot be an id (of any stored object), or ``None`` if it can be one.

    An id is a non-empty string of at most ``max_chars`` characters, that :func:`text_problem`
    accepts, with no control character. A lookup by such a value finds nothing without asking the
    database (whose driver would fail on a NUL or a lone surrogate); creation refuses it.
    """
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if max_chars is not None and len(value) > max_chars:
        return f"must be at most {max_chars} characters"
    if _CONTROL.search(value):
        # NUL is a control character too: say so in the words text_problem uses.
        return NUL_MESSAGE if "\x00" in value else CONTROL_MESSAGE
    return text_problem(value)


def check_id(value: object, field: str, *, max_chars: int | None = None) -> str:
    """Return ``value`` if :func:`id_problem` finds nothing, else raise :class:`InvalidFieldError`
    naming ``field`` (for creation, where a bad id is the caller's mistake, not an unknown one)."""
    problem = id_problem(value, max_chars=max_chars)
    if problem is not None or not isinstance(value, str):  # the second only narrows the type
        raise InvalidFieldError(field, problem or "must be a string")
    return value


def json_text_depth(raw: bytes | str) -> int:
    """Return how deeply the JSON text ``raw`` nests arrays and objects, without parsing it.

    Brackets inside strings do not count. The text need not be valid JSON: this runs before the
    parser, to keep a recursive parser from ever seeing a document too deep for it.
    """
    text = raw if isinstance(raw, str) else raw.decode("latin-1")  # one char per byte; ASCII kept
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        # Which value wins differs between parsers: a proxy that checked the first one and this
        # code that used the last would disagree about the same request.
        raise ValueError("an object has the same key twice")
    return found


def parse_json(raw: bytes | str, field: str = "body") -> Any:
    """Parse strict JSON text: UTF-8, at most :data:`MAX_JSON_DEPTH` deep, no NaN or Infinity,
    no object with the same key twice.

    :raises InvalidFieldError: naming ``field``, for any of those, or text that is not JSON.
    """
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidFieldError(field, "is not UTF-8 encoded JSON") from None
    # Fewer brackets than the limit cannot nest past it: the scan is for the rare rest.
    brackets = raw.count("[") + raw.count("{")
    if brackets > MAX_JSON_DEPTH and json_text_depth(raw) > MAX_JSON_DEPTH:
        raise InvalidFieldError(field, DEPTH_MESSAGE)
    try:
        return json.loads(raw, parse_constant=_refuse_constant, object_pairs_hook=_refuse_duplicate_keys)
    except RecursionError:  # unreachable past the depth check; kept as a last line
        raise InvalidFieldError(field, DEPTH_MESSAGE) from None
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, integers too long to convert
        raise InvalidFieldError(field, f"is not valid JSON ({str(exc).splitlines()[0]})") from None


def check_json_value(value: Any, field: str, *, nul: bool = False) -> Any:
    """Return ``value`` if every string in it (keys too) is text and it is at most
    :data:`MAX_JSON_DEPTH` deep, else raise :class:`InvalidFieldError` naming ``field``.

    Walks without recursion, so any depth is safe to check. Containers are dicts (any mapping),
    lists, tuples, sets and frozensets; other values are not looked into.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            check_text(item, field, nul=nul)
        elif isinstance(item, Mapping | list | tuple | set | frozenset):
            if depth >= MAX_JSON_DEPTH:
                raise InvalidFieldError(field, DEPTH_MESSAGE)
            if isinstance(item, Mapping):
                stack.extend((key, depth) for key in item)
                stack.extend((child, depth + 1) for child in item.values())
            else:
                stack.extend((child, depth + 1) for child in item)
    return value


def to_utc(value: datetime, field: str) -> datetime:
    """Return the aware ``value`` in UTC.

    :raises InvalidFieldError: it is naive, or out of range once converted
        (``9999-12-31T23:59:59-12:00``, ``0001-01-01T00:00:00+14:00``).
    """
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidFieldError(field, "must have a time zone (such as Z or +02:00)")
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:
        raise InvalidFieldError(field, "is out of range once converted to UTC") from None


def check_number(value: object, field: str, *, low: float, high: float, integer: bool = False) -> float:
    """Return ``value`` if it is a number (an ``int`` when ``integer``) from ``low`` to ``high``.

    ``True``, NaN (which fails every comparison) and values too large to turn into a duration are
    refused here rather than as an ``OverflowError`` or an endless loop further in.

    :raises InvalidFieldError: it is not such a number.
    """
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if number is None or (integer and not isinstance(number, int)) or not low <= number <= high:
        kind = "an integer" if integer else "a number"
        raise InvalidFieldError(field, f"must be {kind} from {low:g} to {high:g}")
    return number


def read_limited(stream: IO[bytes], length: int | None, limit: int, *, chunk_size: int) -> bytes | None:
    """Return a request body of at most ``limit`` bytes from ``stream``, or ``None`` if it is larger.

    A declared ``length`` over the limit is refused before anything is read; a body with no
    length (chunked) is read ``chunk_size`` bytes at a time, one byte past the limit at most. The
    caller turns ``None`` into its own error (the admin API's 413, the receiver's refusal).
    """
    if length is not None and length > limit:
        return None
    chunks, size = [], 0
    while chunk := stream.read(min(chunk_size, limit + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return None
    return b"".join(chunks)
