"""The one SQL base of every store: :class:`SqlDatabase`, the one ``MetaData`` and a column type.

Every store (webhooks, their outbox, workflows, completion callbacks, completion triggers) reaches
its database through a :class:`SqlDatabase`: the dialect's INSERT (for ``ON CONFLICT``), short
transactions, autocommit reads, table creation, and driver errors turned into
:class:`~flask_harvest.errors.StoreError` without the statements' bound values.

Every table is declared on :data:`metadata`, so one ``create_all`` creates them all and Alembic (or
Flask-Migrate) autogenerates migrations for them all from one object.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    DateTime,
    Dialect,
    Engine,
    MetaData,
    Table,
    TypeDecorator,
    and_,
    inspect,
    or_,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError, StatementError
from sqlalchemy.pool import SingletonThreadPool, StaticPool
from sqlalchemy.schema import CreateColumn, CreateIndex, CreateTable

from ._fork import in_each_child
from .errors import ConfigurationError, StoreError

__all__ = [
    "SqlDatabase",
    "UTCDateTime",
    "after_position",
    "create_tables",
    "metadata",
    "schema_sql",
    "store_error",
]

#: The dialects flask-harvest runs on, with each one's INSERT (whose ``on_conflict_*`` it uses).
_INSERTS: dict[str, Callable[..., Any]] = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}
_SCHEMA_HINT = "create the tables with ensure_schema()"


class UTCDateTime(TypeDecorator[datetime]):
    """A ``DateTime`` stored as naive UTC and always read back as an aware UTC datetime.

    Naive UTC is the one representation every backend keeps alike: SQLite has no time zone type
    and drops ``tzinfo``, so aware values would come back naive there and compare wrongly.
    A naive value given to it is taken to be UTC already.
    """

    impl = DateTime(timezone=False)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None or value.tzinfo is None:
            return value
        return value.astimezone(timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return value.replace(tzinfo=timezone.utc) if value is not None else None


# Named constraints make Alembic's diffs stable across backends; indexes are named explicitly.
metadata = MetaData(
    naming_convention={
        "pk": "pk_%(table_name)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    }
)


def store_error(
    action: str, exc: SQLAlchemyError, engine: Engine, *, hint: str = "", secrets: Sequence[str] = ()
) -> StoreError:
    """Return a :class:`StoreError` saying what failed, without the statement's bound values.

    Bound values are inputs, payloads and secrets: the message keeps the first line of the driver's
    error, and the database password and ``secrets`` are masked. Raise it ``from exc``.

    :param hint: appended when the error says a ``harvest_`` table is missing.
    """
    if isinstance(exc, StatementError):
        # The cause ends up in tracebacks and logs: keep its SQL, drop the bound values.
        exc.hide_parameters = True
        cause: BaseException = exc.orig if exc.orig is not None else exc
    else:
        cause = exc
    lines = str(cause).strip().splitlines() if isinstance(cause, Exception) else []
    detail = f"{type(cause).__name__}: {lines[0][:300]}" if lines else type(cause).__name__
    message = f"could not {action} in {engine.dialect.name}: {detail}"
    if hint and "harvest_" in detail and ("no such table" in detail or "does not exist" in detail):
        message += f"; {hint}"
    for hidden in (engine.url.password, *secrets):
        if hidden:
            message = message.replace(str(hidden), "***")
    return StoreError(message)


def after_position(
    when: ColumnElement[datetime], ident: ColumnElement[str], position: tuple[datetime, str]
) -> ColumnElement[bool]:
    """The condition ``(when, ident) > position`` of an ascending keyset walk, spelled out so every
    backend can use a ``(when, ident)`` index for it."""
    stamp, last_id = position
    return or_(when > stamp, and_(when == stamp, ident > last_id))


def schema_sql(tables: Sequence[Table], dialect: str = "postgresql") -> str:
    """Return the DDL that creates ``tables`` and their indexes where they are absent.

    Compiled from the ``Table`` objects, so it always matches what the stores expect.

    :param dialect: a SQLAlchemy dialect name such as ``postgresql`` or ``sqlite``.
    :returns: ``CREATE TABLE IF NOT EXISTS`` and ``CREATE INDEX IF NOT EXISTS`` statements, each
        ending in ``;``.
    """
    compiled_for = URL.create(dialect).get_dialect()()
    statements = []
    for table in [t for t in metadata.sorted_tables if t in tables]:
        statements.append(str(CreateTable(table, if_not_exists=True).compile(dialect=compiled_for)))
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            statements.append(str(CreateIndex(index, if_not_exists=True).compile(dialect=compiled_for)))
    # The compiler leaves a space at the end of each column line; drop it for tidy files.
    tidy = ("\n".join(line.rstrip() for line in s.strip().splitlines()) + ";" for s in statements)
    return "\n\n".join(tidy) + "\n"


def drop_indexes_sql(names: Sequence[str]) -> str:
    """Return ``DROP INDEX IF EXISTS`` statements for indexes of earlier versions (``names``), to
    follow :func:`schema_sql`'s output: run once no process of the earlier version is left."""
    return "".join(f"\nDROP INDEX IF EXISTS {name};\n" for name in names)


def create_tables(engine: Engine, tables: Sequence[Table], *, what: str, hint: str = "") -> None:
    """Create ``tables`` and their indexes where they do not exist yet (existing ones are left alone).

    A column or an index that a newer version declares on a table that already exists is added
    too (by name), so an upgrade gets it without a migration of its own: new columns are always
    nullable or have a server default, so adding one never rewrites or refuses existing rows.

    :param what: names the tables in the error (``the webhook tables``).
    :raises StoreError: the database refused.
    """
    try:
        metadata.create_all(engine, tables=list(tables), checkfirst=True)
        _add_missing_columns(engine, tables)
        _create_missing_indexes(engine, tables)
    except SQLAlchemyError as exc:
        raise store_error(f"create {what}", exc, engine, hint=hint) from exc


def _add_missing_columns(engine: Engine, tables: Sequence[Table]) -> None:
    # One catalogue read per table; ADD COLUMN of a nullable column (or one with a server
    # default) is instant on PostgreSQL and SQLite alike.
    inspector = inspect(engine)
    preparer = engine.dialect.identifier_preparer
    statements = []
    for table in tables:
        present = {found["name"] for found in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in present:
                spec = CreateColumn(column).compile(dialect=engine.dialect)
                statements.append(f"ALTER TABLE {preparer.format_table(table)} ADD COLUMN {spec}")
    if statements:
        with engine.begin() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)


def _create_missing_indexes(engine: Engine, tables: Sequence[Table]) -> None:
    # create_all only indexes the tables it creates. Reading the names first keeps a start-up on
    # an up-to-date database to one catalogue query, and IF NOT EXISTS lets processes that start
    # together during an upgrade both succeed.
    inspector = inspect(engine)
    missing = [
        index
        for table in tables
        for index in table.indexes
        if index.name not in {found["name"] for found in inspector.get_indexes(table.name)}
    ]
    if missing:
        with engine.begin() as conn:
            for index in sorted(missing, key=lambda i: str(i.name)):
                conn.execute(CreateIndex(index, if_not_exists=True))


@contextmanager
def read_connection(engine: Engine, action: str, *, hint: str = "") -> Iterator[Connection]:
    """A connection for a read that needs no transaction of its own: each statement commits on
    its own (autocommit), so the read costs its statements' round trips and no BEGIN or COMMIT.

    For reads whose statements need not see one snapshot: a dashboard panel's counts, a page of a
    list (a view of the dashboard's overview sent two of these round trips per read before: bench
    S16).

    :raises StoreError: the database refused (``action`` and ``hint`` as :func:`store_error`'s).
    """
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            yield conn
    except SQLAlchemyError as exc:
        raise store_error(action, exc, engine, hint=hint) from exc


class SqlDatabase:
    """One database as a store uses it: a store holds one and runs every statement through it.

    A store never opens a connection of its own: it asks for :meth:`transaction` or :meth:`read`,
    so the error handling lives here once, and whatever decides which database a row lives in
    (several databases, one per shard) only has to hand the store the right ``SqlDatabase``.

    :param engine: a SQLAlchemy engine on PostgreSQL or SQLite (a file database, so that threads
        and processes share it).
    :param owner: names the store in the error for another dialect.
    :param hint: added to an error that says a ``harvest_`` table is missing.
    :raises ConfigurationError: the engine is neither PostgreSQL nor SQLite.
    """

    def __init__(self, engine: Engine, *, owner: str, hint: str = _SCHEMA_HINT) -> None:
        if engine.dialect.name not in _INSERTS:
            raise ConfigurationError(f"{owner} supports PostgreSQL and SQLite, not {engine.dialect.name!r}")
        self.engine = engine
        self.hint = hint
        #: PostgreSQL: data-modifying CTEs, ``RETURNING`` everywhere, ``FOR UPDATE SKIP LOCKED``.
        self.postgres = engine.dialect.name == "postgresql"
        #: The dialect's ``INSERT``, for ``on_conflict_do_nothing`` and ``on_conflict_do_update``.
        self.insert = _INSERTS[engine.dialect.name]

    def __repr__(self) -> str:
        return f"<SqlDatabase {self.engine.url.render_as_string(hide_password=True)}>"

    def error(self, action: str, exc: SQLAlchemyError, *, secrets: Sequence[str] = ()) -> StoreError:
        """:func:`store_error` for this database: raise it ``from exc``."""
        return store_error(action, exc, self.engine, hint=self.hint, secrets=secrets)

    @contextmanager
    def transaction(
        self, action: str, conn: Connection | None = None, *, secrets: Sequence[str] = ()
    ) -> Iterator[Connection]:
        """Yield ``conn`` (the caller's transaction) or a new transaction that commits when the
        block ends; a driver error becomes :class:`StoreError` saying ``could not {action}``.

        :param secrets: values masked in the error message besides the database password.
        """
        try:
            if conn is not None:
                yield conn
            else:
                with self.engine.begin() as own:
                    yield own
        except SQLAlchemyError as exc:
            raise self.error(action, exc, secrets=secrets) from exc

    def read(self, action: str) -> AbstractContextManager[Connection]:
        """A connection for reads in autocommit (:func:`read_connection`): no BEGIN or COMMIT."""
        return read_connection(self.engine, action, hint=self.hint)

    def one_statement(self, action: str) -> AbstractContextManager[Connection]:
        """A connection in autocommit for a write that is one statement (atomic on its own): it
        costs that statement's round trip and no BEGIN or COMMIT (:func:`read_connection`)."""
        return read_connection(self.engine, action, hint=self.hint)

    def create_tables(self, tables: Sequence[Table], *, what: str) -> None:
        """Create ``tables`` and their indexes where missing (:func:`create_tables`)."""
        create_tables(self.engine, tables, what=what, hint=self.hint)


def new_pool_in_each_child(engine: Engine) -> None:
    """Give every process forked from this one a connection pool of its own for ``engine``.

    SQLAlchemy's documented pattern, ``engine.dispose(close=False)`` in the child: the child
    forgets the parent's pooled connections without closing them (closing would end the parent's
    sessions) and opens its own on first use. Unlike disposing once after creating the tables, it
    also covers connections the parent pools later (its own reads, a sweep), and costs the parent
    nothing. An in-memory SQLite database lives in its one connection (``StaticPool``,
    ``SingletonThreadPool``): a fresh pool would be an empty database, and there is no socket to
    share, so its pool is kept.
    """
    if not isinstance(engine.pool, (StaticPool, SingletonThreadPool)):
        in_each_child(engine, _new_pool)


def _new_pool(engine: Engine) -> None:
    engine.dispose(close=False)
