"""Turning an event payload into the exact JSON text that is stored, signed and sent."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import json
import uuid
from typing import Any

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

    :raises InvalidFieldError: the payload cannot be represented as JSON.
    """
    if isinstance(payload, bytes | bytearray):
        try:
            text = bytes(payload).decode("utf-8")
            json.loads(text)
        except (UnicodeDecodeError, ValueError):
            raise InvalidFieldError("payload", "bytes must be UTF-8 encoded JSON") from None
        return text
    try:
        return json.dumps(
            payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_default
        )
    except (TypeError, ValueError) as exc:
        raise InvalidFieldError("payload", f"cannot be encoded as JSON ({exc})") from None
