"""Shard databases for the tests: three PostgreSQL databases beside the test database (created
when missing, emptied for each test), or SQLite files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from flask_harvest._sql import metadata

from .conftest import DATABASE_URL, service_unavailable

SHARDS = 3


def shard_database_names(count: int = SHARDS) -> list[str]:
    """Databases named after the test database, so that concurrent runs on other test databases
    never share shards."""
    base = sa.make_url(DATABASE_URL).database or "test"
    return [f"{base}_harvest_shard{index}" for index in range(count)]


def _admin() -> sa.Engine:
    return sa.create_engine(sa.make_url(DATABASE_URL), isolation_level="AUTOCOMMIT")


def allow_connections(name: str, allowed: bool) -> None:
    """Let a shard's database take connections again, or refuse them and end the ones it has."""
    admin = _admin()
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(
                f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"true" if allowed else "false"}'
            )
            if not allowed:
                conn.execute(
                    sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"),
                    {"name": name},
                )
    finally:
        admin.dispose()


def postgres_shards(count: int = SHARDS) -> list[str]:
    """The URLs of ``count`` empty PostgreSQL shard databases (created when missing)."""
    base = sa.make_url(DATABASE_URL)
    admin = _admin()
    urls: list[str] = []
    try:
        with admin.connect() as conn:
            for name in shard_database_names(count):
                if not conn.execute(
                    sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}
                ).scalar():
                    conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
                conn.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    except sa.exc.OperationalError as exc:
        service_unavailable("PostgreSQL", base.render_as_string(hide_password=True), exc)
    finally:
        admin.dispose()
    for name in shard_database_names(count):
        url = base.set(database=name)
        engine = sa.create_engine(url)
        try:
            metadata.drop_all(engine)
        finally:
            engine.dispose()
        urls.append(url.render_as_string(hide_password=False))
    return urls


@pytest.fixture
def pg_shards() -> Iterator[list[str]]:
    """Three empty PostgreSQL shard databases (their URLs, shard 0 first)."""
    urls = postgres_shards()
    yield urls
    for name in shard_database_names():
        allow_connections(name, True)


@pytest.fixture
def sqlite_shards(tmp_path: Path) -> list[str]:
    """Three SQLite files as shards."""
    return [f"sqlite:///{tmp_path / f'shard{index}.db'}" for index in range(SHARDS)]
