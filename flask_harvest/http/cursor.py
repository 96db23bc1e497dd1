"""Opaque keyset cursors: a ``(time, id)`` position, as the actuator and the dashboard page lists."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime

from .._input import id_problem, to_utc
from ..errors import InvalidFieldError

#: The longest cursor accepted (a timestamp and an id, encoded).
MAX_CURSOR_CHARS = 512


def encode_position(when: datetime, row_id: str) -> str:
    """Return the opaque cursor of the position ``(when, row_id)``."""
    raw = f"{when.isoformat()}|{row_id}".encode("utf-8", "surrogatepass")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_position(
    cursor: str, *, message: str = "is not a cursor this API returned"
) -> tuple[datetime, str]:
    """Return the position an :func:`encode_position` cursor stands for.

    :raises InvalidFieldError: (field ``cursor``) the cursor was not made by :func:`encode_position`.
    """
    if not isinstance(cursor, str) or len(cursor) > MAX_CURSOR_CHARS:
        raise InvalidFieldError("cursor", message)
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        stamp, _, row_id = raw.partition("|")
        when = to_utc(datetime.fromisoformat(stamp), "cursor")
    except (binascii.Error, UnicodeError, ValueError):  # InvalidFieldError is a ValueError
        raise InvalidFieldError("cursor", message) from None
    if id_problem(row_id) is not None:
        raise InvalidFieldError("cursor", message)
    return when, row_id
