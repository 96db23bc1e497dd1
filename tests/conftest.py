"""Shared fixtures: the real services (PostgreSQL, SQLite, Redis) and a store of each kind.

``HARVEST_TEST_DATABASE_URL`` and ``HARVEST_TEST_REDIS_URL`` point at the services. A service that
does not answer skips the tests that need it, except under ``CI=true``, where it fails them.

PostgreSQL tests run in the ``harvest_test`` database (created if missing), in a schema of their
own per test session, so concurrent test runs against one server do not see each other's rows.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
import redis
import sqlalchemy as sa
from hypothesis import settings
from sqlalchemy.engine import URL

from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.stores import InMemoryOutboundWebhookHandler, OutboundWebhookHandler
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore, metadata

from .pipeline import close_apps

DATABASE_URL = os.environ.get(
    "HARVEST_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("HARVEST_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
TEST_DATABASE = "harvest_test"
IN_CI = os.environ.get("CI", "").lower() == "true"

# Under CI every property test draws the same examples on every run (derandomized, no example
# database): a run that passed once passes again, and a red run is a regression, never the luck
# of a draw. A local run explores fresh examples each time (HARVEST_PROPERTY_EXAMPLES for more).
settings.register_profile("ci", derandomize=True, database=None)
if IN_CI:
    settings.load_profile("ci")


def service_unavailable(name: str, target: str, exc: BaseException) -> NoReturn:
    """Skip the test when ``name`` does not answer, or fail it under ``CI=true``."""
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    message = f"{name} at {target} is not reachable ({type(exc).__name__}: {first_line})"
    if IN_CI:
        pytest.fail(f"{message}; CI=true requires every service", pytrace=False)
    pytest.skip(message)


# -- PostgreSQL ----------------------------------------------------------------------------------


def _create_database_if_missing(base_url: URL, name: str) -> None:
    # CREATE DATABASE cannot run in a transaction, hence AUTOCOMMIT on the base database.
    engine = sa.create_engine(base_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            exists = conn.execute(
                sa.text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}
            ).scalar()
            if not exists:
                try:
                    conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
                except sa.exc.DBAPIError:
                    # Another test run created it between our check and our CREATE.
                    if not conn.execute(
                        sa.text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}
                    ).scalar():
                        raise
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[URL]:
    """A URL of the ``harvest_test`` database whose ``search_path`` is this session's own schema."""
    base_url = sa.make_url(DATABASE_URL)
    try:
        _create_database_if_missing(base_url, TEST_DATABASE)
    except sa.exc.OperationalError as exc:
        service_unavailable("PostgreSQL", base_url.render_as_string(hide_password=True), exc)
    database_url = base_url.set(database=TEST_DATABASE)
    schema = f"harvest_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield database_url.update_query_dict({"options": f"-csearch_path={schema}"})
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.dispose()


@pytest.fixture(scope="session")
def _postgres_session_engine(postgres_url: URL) -> Iterator[sa.Engine]:
    engine = sa.create_engine(postgres_url, pool_size=10, max_overflow=10)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def postgres_engine(_postgres_session_engine: sa.Engine) -> sa.Engine:
    """The session's PostgreSQL engine, with the harvest tables present and empty."""
    engine = _postgres_session_engine
    # create_all first: a test may have dropped a table on purpose.
    metadata.create_all(engine, checkfirst=True)
    names = ", ".join(f'"{table.name}"' for table in metadata.sorted_tables)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"TRUNCATE {names} RESTART IDENTITY")
    return engine


# -- SQLite --------------------------------------------------------------------------------------


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[sa.Engine]:
    """An engine on a fresh SQLite file (a file, not ``:memory:``, so threads share it)."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'harvest.db'}")
    metadata.create_all(engine)
    try:
        yield engine
    finally:
        engine.dispose()


# -- Redis ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The test Redis URL, once it has answered a PING."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        service_unavailable("Redis", REDIS_URL, exc)
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def redis_conn(redis_url: str) -> Iterator[redis.Redis]:
    """A client on the test Redis database, emptied before the test."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    try:
        yield client
    finally:
        client.close()


# -- stores --------------------------------------------------------------------------------------

# HARVEST_TEST_DB=sqlite or =postgres (tox's database factor) keeps the SQL tests to that one.
_ONLY_DB = os.environ.get("HARVEST_TEST_DB", "")
STORE_KINDS = [
    pytest.param("memory", id="memory"),
    *([pytest.param("sqlite", id="sqlite")] if _ONLY_DB in ("", "sqlite") else []),
    *(
        [pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)]
        if _ONLY_DB in ("", "postgres")
        else []
    ),
]


def _make_store(request: pytest.FixtureRequest, kind: str) -> OutboundWebhookHandler:
    if kind == "memory":
        return InMemoryOutboundWebhookHandler()
    # Looked up lazily so the memory tests never need a database.
    engine = request.getfixturevalue(f"{kind}_engine")
    return SqlOutboundWebhookStore(engine)


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest) -> OutboundWebhookHandler:
    """An empty store of each kind: ``memory``, ``sqlite`` and ``postgres``."""
    return _make_store(request, request.param)


@pytest.fixture(params=[p for p in STORE_KINDS if p.id != "memory"])
def sql_store(request: pytest.FixtureRequest) -> SqlOutboundWebhookStore:
    """An empty SQL store on ``sqlite`` and on ``postgres``."""
    made = _make_store(request, request.param)
    assert isinstance(made, SqlOutboundWebhookStore)
    return made


@pytest.fixture(autouse=True)
def _close_test_apps() -> Iterator[None]:
    """Stop the job backends of apps a test made, so their threads outlive no test."""
    yield
    close_apps()


@pytest.fixture(autouse=True)
def _restore_signal_handlers() -> Iterator[None]:
    """Put back the SIGINT and SIGTERM handlers after each test: an RQ worker run in the test's
    process installs its own, and RQ before 2.0 leaves them behind, so a later signal would raise
    its ``StopRequested`` in some other test."""
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    yield
    for number, handler in handlers.items():
        signal.signal(number, handler)


@pytest.fixture
def receiver(harvest_receiver: CapturingReceiver) -> CapturingReceiver:
    """The package's own ``harvest_receiver`` fixture (its pytest plugin), under a shorter name."""
    return harvest_receiver
