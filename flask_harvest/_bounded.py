"""Bounded counts: how many rows match each of several conditions, counting at most ``cap`` of
each, in one statement (one round trip).

Each count is ``SELECT count(*) FROM (SELECT 1 FROM t WHERE cond LIMIT :cap)``: with an index that
leads with the condition's columns it reads at most ``cap`` index entries, so its cost does not
grow with the table (what a metrics scrape or a dashboard panel needs at millions of rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Integer, Select, Table, bindparam, func, literal, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

__all__ = ["bounded_counts"]

#: Counts per statement: SQLite allows 2,000 result columns; stay well under it.
_PER_STATEMENT = 200


def _statement(table: Table, conditions: Sequence[ColumnElement[bool]]) -> Select[Any]:
    cap = bindparam("cap", type_=Integer)
    counts = []
    for index, condition in enumerate(conditions):
        bounded = select(literal(1)).select_from(table).where(condition).limit(cap).subquery()
        counts.append(select(func.count()).select_from(bounded).scalar_subquery().label(f"c{index}"))
    return select(*counts)


def bounded_counts(
    conn: Connection, table: Table, conditions: Sequence[ColumnElement[bool]], *, cap: int
) -> list[int]:
    """Return, for each condition, how many rows of ``table`` match it, counting at most ``cap``
    (a count equal to ``cap`` means "at least")."""
    result: list[int] = []
    for start in range(0, len(conditions), _PER_STATEMENT):
        chunk = conditions[start : start + _PER_STATEMENT]
        row = conn.execute(_statement(table, chunk), {"cap": max(0, int(cap))}).one()
        result.extend(int(count) for count in row)
    return result
