"""What a dashboard list page renders: its rows, the cursor of the next page, and its pager (first,
previous and next links and "51-100 of 1,000+", with an en dash).

The cursors and the keyset walks behind them belong to the services the pages call
(``WebhookOperations``, ``WorkflowService``, ``TriggerService``), which the admin APIs share. A
keyset cursor only goes forward, so a page's link carries the cursors of the pages before it (its
*trail*, the last :data:`TRAIL_KEPT`) and its number; the total is a bounded count, never a
``COUNT(*)`` of a table: the service's own (:data:`Count`, one statement that reads at most
:data:`COUNT_CAP` index entries) where it has one, else :func:`capped_count` over its pages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from flask import request, url_for

from .._input import text_problem
from ..errors import InvalidFieldError

T = TypeVar("T")
__all__ = [
    "COUNT_CAP", "PAGE_SIZE", "PAGING_ARGS", "TRAIL_KEPT",
    "Count", "Page", "Pager", "capped_count", "pager", "range_text",
]  # fmt: skip
#: Rows on one dashboard list page.
PAGE_SIZE = 50
#: A list's total is counted up to this many rows; more reads "1,000+".
COUNT_CAP = 1000
#: Pages back that *Previous* can reach (each is a cursor in the link); *First* always works.
TRAIL_KEPT = 20
#: The highest page number a link may carry.
MAX_PAGE_NUMBER = 1_000_000
#: The query parameters of a page's position (the rest are the list's filters).
PAGING_ARGS = frozenset({"cursor", "page", "trail"})
#: Rows read per step of a count (the services' largest page).
_COUNT_STEP = 500
# url_for's own arguments: a query argument of one of these names would be taken as it (a 500 for
# "endpoint", an absolute link for "_external"), so a page's links never carry them.
_URL_FOR_ARGS = frozenset({"endpoint", "_anchor", "_method", "_scheme", "_external"})
#: Marks each entry of a trail: a cursor never holds it (cursors are base64url), and the first
#: page's entry is empty.
_MARK = "~"

#: ``fetch(cursor, limit)``: one page of a list with its filters, and the next page's cursor.
Fetch = Callable[[str | None, int], tuple[Sequence[Any], str | None]]
#: ``count(cap)``: how many rows the list with its filters has, counting at most ``cap``.
Count = Callable[[int], int]


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list and the cursor of the next (``None`` on the last page)."""

    items: list[T]
    next_cursor: str | None


@dataclass(frozen=True)
class Pager:
    """A list page's position and links (each ``None`` where there is nowhere to go)."""

    first: str | None
    previous: str | None
    next: str | None
    text: str


def capped_count(fetch: Fetch, cap: int = COUNT_CAP) -> tuple[int, bool]:
    """Count a list's rows from its start, at most ``cap``: ``(count, capped)``, ``capped`` when
    there are more. Reads at most ``cap`` rows plus one page's probe, in pages of the service."""
    counted, cursor = 0, None
    while True:
        items, cursor = fetch(cursor, min(_COUNT_STEP, cap - counted) or 1)
        counted += len(items)
        if cursor is None:
            return min(counted, cap), counted > cap
        if counted >= cap:
            return cap, True


def range_text(number: int, shown: int, total: int, capped: bool, page_size: int = PAGE_SIZE) -> str:
    """``51\u2013100 of 1,000+`` for page ``number`` showing ``shown`` rows. Pure."""
    of = f"{total:,}+" if capped else f"{total:,}"
    if shown == 0:
        return f"0 of {of}"
    start = (number - 1) * page_size + 1
    return f"{start:,}\u2013{start + shown - 1:,} of {of}"


def _trail(value: str | None) -> list[str]:
    if not value:
        return []
    return value.split(_MARK)[1:]


def _read_position() -> tuple[int, list[str]]:
    """The page number and trail of the current request's link (422 for text no link holds)."""
    number_text = request.args.get("page") or "1"
    trail_text = request.args.get("trail") or ""
    if not number_text.isascii() or not number_text.isdigit() or not 1 <= int(number_text) <= MAX_PAGE_NUMBER:
        raise InvalidFieldError("page", f"must be a page number from 1 to {MAX_PAGE_NUMBER:,}")
    problem = text_problem(trail_text) if trail_text else None
    if problem is not None or len(trail_text) > 2048 * 8 or (trail_text and not trail_text.startswith(_MARK)):
        raise InvalidFieldError("trail", problem or "is not a trail a page link holds")
    return int(number_text), _trail(trail_text)


def pager(
    endpoint: str,
    args: Mapping[str, str],
    cursor: str | None,
    page: Page[Any],
    fetch: Fetch,
    count: Count | None = None,
) -> Pager:
    """The pager of the current list page: ``endpoint`` with the filters ``args``, at ``cursor``
    (``None`` on the first page), showing ``page``; ``count`` counts the same list, or else
    ``fetch`` reads it for the count (up to :data:`COUNT_CAP` rows, each built as the page's)."""
    number, trail = _read_position()
    if cursor is None:
        number, trail = 1, []  # the first page, whatever else the link says
    kept = {key: value for key, value in args.items() if value and key not in _URL_FOR_ARGS}

    def link(at: str | None, page_number: int, entries: list[str]) -> str:
        values: dict[str, Any] = dict(kept)
        if at:
            values.update(cursor=at, page=page_number, trail="".join(_MARK + e for e in entries))
        return url_for(endpoint, **values)

    if cursor is None and page.next_cursor is None:
        total, capped = len(page.items), False  # the whole list is on this page: nothing to count
    elif count is not None:
        counted = count(COUNT_CAP + 1)  # one past the cap tells "1,000+" from "1,000"
        total, capped = min(counted, COUNT_CAP), counted > COUNT_CAP
    else:
        total, capped = capped_count(fetch)
    return Pager(
        first=link(None, 1, []) if cursor is not None else None,
        previous=(link(trail[-1] or None, number - 1, trail[:-1]) if trail and number > 1 else None),
        next=(
            link(page.next_cursor, number + 1, [*trail, cursor or ""][-TRAIL_KEPT:])
            if page.next_cursor is not None
            else None
        ),
        text=range_text(number, len(page.items), total, capped),
    )
