"""The statements an operation sends, and the plans PostgreSQL runs for them: S13 and S16 show
them (bench/README.md) to prove each is a bounded index walk."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import sqlalchemy as sa
from flask import Flask

from flask_harvest import get_engine


@contextmanager
def captured(engine: sa.Engine) -> Iterator[list[tuple[str, Any]]]:
    """The statements (and their parameters) sent on ``engine`` inside the block."""
    sent: list[tuple[str, Any]] = []

    def listen(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        sent.append((statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", listen)
    try:
        yield sent
    finally:
        sa.event.remove(engine, "before_cursor_execute", listen)


def plans(
    app: Flask, operation: Callable[[Flask], None], touching: str = "harvest_webhook_deliveries"
) -> list[str]:
    """EXPLAIN ANALYZE of each statement ``operation`` sends that reads ``touching``, as the
    generic plan a prepared statement runs (psycopg prepares a statement on its fifth use), or as
    the custom plan where the store asked for one (``SET LOCAL plan_cache_mode``), in a
    transaction rolled back."""
    engine = get_engine(app).store.capabilities.engine
    assert engine is not None
    with app.app_context(), captured(engine) as sent:
        operation(app)
    shown = []
    mode = "force_generic_plan"
    for statement, parameters in sent:
        asked = _MODE.search(statement)
        if asked:
            mode = asked.group(1)
            continue
        if touching not in statement:
            continue
        if isinstance(parameters, list | tuple) and parameters and isinstance(parameters[0], dict):
            parameters = parameters[0]
        shown.append(" ".join(statement.split()) + "\n" + generic_plan(engine, statement, parameters, mode))
        mode = "force_generic_plan"
    return shown


_MODE = re.compile(r"SET LOCAL plan_cache_mode = (\w+)")


def generic_plan(
    engine: sa.Engine, statement: str, parameters: dict[str, Any], mode: str = "force_generic_plan"
) -> str:
    """The generic plan of ``statement`` (psycopg's ``%(name)s`` parameters; or the plan ``mode``
    gives), executed with ``parameters`` in a transaction that is rolled back."""
    names: list[str] = []

    def numbered(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    prepared = _PARAMETER.sub(numbered, statement)
    with engine.connect() as conn:
        conn.exec_driver_sql(f"SET LOCAL plan_cache_mode = {mode}")
        conn.exec_driver_sql(f"PREPARE bench_plan AS {prepared}")
        # EXECUTE's arguments as literals (psycopg renders them client-side): the server could
        # not type them as parameters of the EXPLAIN.
        raw = conn.connection.driver_connection
        assert isinstance(raw, psycopg.Connection)
        arguments = psycopg.ClientCursor(raw).mogrify(", ".join(f"%({name})s" for name in names), parameters)
        execute = f"EXECUTE bench_plan({arguments})" if names else "EXECUTE bench_plan"
        rows = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, COSTS OFF) {execute}").all()
        conn.exec_driver_sql("DEALLOCATE bench_plan")
        conn.rollback()
    return "\n".join(row[0] for row in rows)


_PARAMETER = re.compile(r"%\((\w+)\)s")
