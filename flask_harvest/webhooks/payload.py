"""Turning an event payload into the exact JSON text that is stored, signed and sent."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import json
import uuid
from typing import Any

from .._input import MAX_JSON_DEPTH, check_json_value, check_text, parse_json
from ..errors import InvalidFieldError


def _default(value: Any) -> Any:
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(type(value).__name__)


def encode_payload(payload: Any) -> str:
    """Serialise ``payload`` to compact JSON, once; these exact bytes go out on every attempt.

    Dicts, lists and JSON scalars are encoded as they are; datetimes, dates, UUIDs, decimals and
    dataclasses are converted. ``bytes`` are taken as already-encoded JSON and checked.

    Checked once, here, so that a delivery is never logged that no attempt could send: the text
    must be UTF-8 encodable (no lone surrogates) and at most
    :data:`~flask_harvest._input.MAX_JSON_DEPTH` deep, without NaN or Infinity.

    :raises InvalidFieldError: the payload cannot be represented as JSON.
    """
    if isinstance(payload, bytes | bytearray):
        try:
            text = bytes(payload).decode("utf-8")
            parse_json(text, "payload")
        except (UnicodeDecodeError, InvalidFieldError):
            message = f"bytes must be UTF-8 encoded JSON, at most {MAX_JSON_DEPTH} deep"
            raise InvalidFieldError("payload", message) from None
        return text
    # NUL is fine in a payload: the encoder escapes it as \u0000.
    check_json_value(payload, "payload", nul=True)
    try:
        text = json.dumps(
            payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_default
        )
    except RecursionError:  # a converted value (a dataclass) nested past the interpreter's limit
        raise InvalidFieldError("payload", "is nested too deeply") from None
    except (TypeError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InvalidFieldError("payload", f"cannot be encoded as JSON ({reason})") from None
    # A converted value (a dataclass, a set) may still hold a lone surrogate.
    return check_text(text, "payload", nul=True)
