"""Bounded counts: how many rows match each of several conditions, counting at most ``cap`` of
each, in one statement (one round trip).

Each count is ``SELECT count(*) FROM (SELECT 1 FROM t WHERE cond LIMIT :cap)``: with an index that
leads with the condition's columns it reads at most ``cap`` index entries, so its cost does not
grow with the table (what a metrics scrape or a dashboard panel needs at millions of rows).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from sqlalchemy import Integer, Select, Table, bindparam, func, literal, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

__all__ = ["bounded_count", "bounded_counts"]

#: Counts per statement: SQLite allows 2,000 result columns; stay well under it.
_PER_STATEMENT = 200
#: Statements kept built, by their caller's key (a scrape asks the same counts every time).
_KEPT = 64
_built: dict[Hashable, list[Select[Any]]] = {}


def _statement(table: Table, conditions: Sequence[ColumnElement[bool]]) -> Select[Any]:
    cap = bindparam("cap", type_=Integer)
    counts = []
    for index, condition in enumerate(conditions):
        bounded = select(literal(1)).select_from(table).where(condition).limit(cap).subquery()
        counts.append(select(func.count()).select_from(bounded).scalar_subquery().label(f"c{index}"))
    return select(*counts)


def bounded_count(conn: Connection, query: Select[Any], *, cap: int) -> int:
    """How many rows ``query`` returns, reading at most ``cap`` of them (a count equal to ``cap``
    means "at least"): a list page's total, whose filters are parameters (so, unlike
    :func:`bounded_counts`' statements, it is not kept built; SQLAlchemy caches its compiled form)."""
    bounded = query.limit(bindparam("cap", type_=Integer)).subquery()
    return int(
        conn.execute(select(func.count()).select_from(bounded), {"cap": max(0, int(cap))}).scalar_one()
    )


def bounded_counts(
    conn: Connection,
    table: Table,
    conditions: Callable[[], Sequence[ColumnElement[bool]]],
    *,
    cap: int,
    key: Hashable,
) -> list[int]:
    """Return, for each of ``conditions()``, how many rows of ``table`` match it, counting at most
    ``cap`` (a count equal to ``cap`` means "at least").

    The statements are built once per ``key`` (which must name ``table`` and the conditions): the
    same SQL text every time, so SQLAlchemy's compiled cache and the driver's prepared statements
    spare the planning of tens of subqueries on each scrape.
    """
    statements = _built.get(key)
    if statements is None:
        every = list(conditions())
        statements = [
            _statement(table, every[start : start + _PER_STATEMENT])
            for start in range(0, len(every), _PER_STATEMENT)
        ]
        if len(_built) >= _KEPT:
            _built.clear()
        _built[key] = statements
    result: list[int] = []
    for statement in statements:
        row = conn.execute(statement, {"cap": max(0, int(cap))}).one()
        result.extend(int(count) for count in row)
    return result
