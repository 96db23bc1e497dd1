"""Every flask-harvest table, for migrations: one :data:`metadata` and the DDL that creates it all.

Give :data:`metadata` to Alembic (or Flask-Migrate) as a ``target_metadata`` to autogenerate
migrations for the webhook, outbox, workflow, completion-trigger and shard-map tables, or apply
:func:`schema_sql`'s DDL yourself.
Each store's ``ensure_schema()`` creates only its own tables.
"""

from __future__ import annotations

from sqlalchemy import Table

from . import _sql
from ._shard_set import shard_map_table
from ._sql import metadata
from .callbacks._schema import CALLBACK_TABLES
from .triggers._schema import TRIGGER_TABLES
from .webhooks.stores._schema import RETIRED_INDEXES, WEBHOOK_TABLES
from .workflows._schedule_store import SCHEDULE_TABLES
from .workflows._schema import WORKFLOW_TABLES

__all__ = ["ALL_TABLES", "metadata", "schema_sql"]

#: Every table flask-harvest keeps.
ALL_TABLES: tuple[Table, ...] = (
    *WEBHOOK_TABLES,
    *WORKFLOW_TABLES,
    *SCHEDULE_TABLES,
    *CALLBACK_TABLES,
    *TRIGGER_TABLES,
    shard_map_table,
)


def schema_sql(dialect: str = "postgresql") -> str:
    """Return the DDL that creates every flask-harvest table and index where it is absent, and
    drops the indexes of earlier versions that they replace.

    :param dialect: a SQLAlchemy dialect name such as ``postgresql`` or ``sqlite``.
    """
    return _sql.schema_sql(ALL_TABLES, dialect) + _sql.drop_indexes_sql(RETIRED_INDEXES)
