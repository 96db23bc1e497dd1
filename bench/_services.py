"""The services every scenario uses: its own PostgreSQL database and Redis database 14.

``HARVEST_BENCH_DATABASE_URL`` and ``HARVEST_BENCH_REDIS_URL`` override the defaults (and
``HARVEST_BENCH_DBOS_URL`` the database of S8 and S9's DBOS baseline). The database
is created if it is missing; every scenario starts from empty tables and an empty Redis database.
"""

from __future__ import annotations

import os

import redis
import sqlalchemy as sa

DATABASE_URL = os.environ.get(
    "HARVEST_BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/harvest_bench"
)
REDIS_URL = os.environ.get("HARVEST_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
#: DBOS Transact's system database (S8, S9's baseline): a database of its own on the same server.
DBOS_DATABASE_URL = os.environ.get(
    "HARVEST_BENCH_DBOS_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/harvest_bench_dbos"
)


def ensure_database(database_url: str = DATABASE_URL) -> None:
    """Create the benchmark database if it does not exist (on the server's ``postgres`` database)."""
    url = sa.make_url(database_url)
    admin = sa.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(
                sa.text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": url.database}
            ).scalar()
            if not exists:
                conn.execute(sa.text(f'CREATE DATABASE "{url.database}"'))
    finally:
        admin.dispose()


def drop_database(database_url: str) -> None:
    """Drop a database of the benchmark's server (closing its connections), if it exists."""
    url = sa.make_url(database_url)
    admin = sa.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
    finally:
        admin.dispose()


def reset_database(engine: sa.Engine) -> None:
    """Create the harvest tables (and the benchmark's own) if needed, and empty them."""
    from flask_harvest.webhooks.stores.sql import metadata

    from ._app import db

    metadata.create_all(engine, checkfirst=True)
    db.metadata.create_all(engine, checkfirst=True)
    tables = [*metadata.sorted_tables, *db.metadata.sorted_tables]
    names = ", ".join(f'"{table.name}"' for table in tables)
    with engine.begin() as conn:
        conn.execute(sa.text(f"TRUNCATE {names} RESTART IDENTITY"))


def redis_client() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL)


def reset_redis() -> None:
    """Empty the benchmark's Redis database (14 by default; the tests use 15)."""
    client = redis_client()
    try:
        client.flushdb()
    finally:
        client.close()


def reset_all(engine: sa.Engine) -> None:
    reset_database(engine)
    reset_redis()
