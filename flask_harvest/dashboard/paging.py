"""Keyset pagination for dashboard lists: an opaque cursor for a ``(time, id)`` position.

A list page asks its store for ``limit + 1`` rows strictly after the cursor's position, in the
list's order (an index walk, never ``OFFSET`` or ``COUNT(*)``), shows ``limit`` of them and links
the next page with the cursor of the last row shown.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from .._cursor import MAX_CURSOR_CHARS, decode_position, encode_position

T = TypeVar("T")
__all__ = ["MAX_CURSOR_CHARS", "PAGE_SIZE", "Page", "decode_cursor", "encode_cursor", "paginate"]
#: Rows on one dashboard list page.
PAGE_SIZE = 50


def encode_cursor(when: datetime, row_id: str) -> str:
    """Return the opaque cursor of the position ``(when, row_id)``."""
    return encode_position(when, row_id)


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Return the position an :func:`encode_cursor` cursor stands for.

    :raises InvalidFieldError: the cursor was not made by :func:`encode_cursor`.
    """
    return decode_position(cursor, message="is not a cursor this page made")


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list and the cursor of the next (``None`` on the last page)."""

    items: list[T]
    next_cursor: str | None


def paginate(
    fetch: Callable[[int, tuple[datetime, str] | None], Sequence[T]],
    position: Callable[[T], tuple[datetime, str]],
    *,
    cursor: str | None,
    limit: int = PAGE_SIZE,
) -> Page[T]:
    """Return a page: ``fetch(limit + 1, after)`` gives the rows after the cursor's position, and
    ``position(row)`` the key of a row, which becomes the next page's cursor."""
    after = decode_cursor(cursor) if cursor else None
    rows = list(fetch(limit + 1, after))
    items = rows[:limit]
    next_cursor = encode_cursor(*position(items[-1])) if len(rows) > limit and items else None
    return Page(items, next_cursor)
