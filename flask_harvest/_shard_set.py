"""The databases of ``HARVEST_WORKFLOW_SHARDS``: their engines, their layout check, and which of them
are reachable now.

The routing rules themselves are pure (:mod:`flask_harvest.shards`). This module is their SQL edge:
one ``harvest_shard_map`` row on each database records its place in the list, so a start-up with a
changed list (shards reordered, added or removed, a shard that already held runs of its own) is
refused before anything is routed the new way; and a shard whose database fails is left alone for
a while (:meth:`ShardSet.each`) so that it slows nothing on the others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TypeVar

from sqlalchemy import Column, Connection, Engine, Integer, Table, inspect, select

from ._sql import SqlDatabase, UTCDateTime, metadata
from ._time import utcnow
from .errors import ConfigurationError, StoreError
from .shards import MAX_SHARDS, shard_for_key, shard_of_id

__all__ = ["ShardSet", "check_unsharded", "shard_map_table"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: One row on each shard: its place in the list and the list's length when it was first used.
shard_map_table = Table(
    "harvest_shard_map",
    metadata,
    Column("shard", Integer, primary_key=True),
    Column("shard_count", Integer, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
)

#: How long a shard whose database failed is skipped by sweeps, at first and at most (seconds).
_FIRST_PAUSE = 1.0
_LONGEST_PAUSE = 30.0


class ShardSet:
    """The shard databases, in ``HARVEST_WORKFLOW_SHARDS`` order (shard 0 first).

    :param engines: one engine per shard; all on the same dialect.
    :param owned: the engines made for the shards (disposed on close), not the app's own.
    :param clock: monotonic seconds (tests pass their own).
    :raises ConfigurationError: no engine, more than :data:`~flask_harvest.shards.MAX_SHARDS`, the
        same database twice, or dialects that differ.
    """

    def __init__(
        self,
        engines: Sequence[Engine],
        *,
        owned: Sequence[Engine] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not engines:
            raise ConfigurationError("HARVEST_WORKFLOW_SHARDS must list at least one database URL")
        if len(engines) > MAX_SHARDS:
            raise ConfigurationError(
                f"HARVEST_WORKFLOW_SHARDS lists {len(engines)} databases; at most {MAX_SHARDS}"
            )
        urls = [e.url.render_as_string(hide_password=False) for e in engines]
        for index, url in enumerate(urls):
            if urls.index(url) != index:
                raise ConfigurationError(
                    f"HARVEST_WORKFLOW_SHARDS lists the database of shard {urls.index(url)} again as "
                    f"shard {index}; each shard needs a database of its own"
                )
        dialects = {e.dialect.name for e in engines}
        if len(dialects) > 1:
            kinds = ", ".join(sorted(dialects))
            raise ConfigurationError(
                f"the shards of HARVEST_WORKFLOW_SHARDS must be one kind of database, not {kinds}"
            )
        self.engines = list(engines)
        self.owned = list(owned)
        self._clock = clock
        self._lock = threading.Lock()
        # shard -> (when it may be tried again, the pause that led there)
        self._paused: dict[int, tuple[float, float]] = {}

    def __repr__(self) -> str:
        urls = ", ".join(e.url.render_as_string(hide_password=True) for e in self.engines)
        return f"<ShardSet [{urls}]>"

    @property
    def count(self) -> int:
        return len(self.engines)

    def for_key(self, workflow_id: str) -> int:
        """The shard a ``workflow_id`` routes to."""
        return shard_for_key(workflow_id, self.count)

    def for_id(self, identifier: object) -> int:
        """The shard an execution (or callback delivery) id was made on; 0 for an id no shard made
        (where a lookup finds nothing, as any lookup of an unknown id)."""
        if not isinstance(identifier, str):
            return 0
        shard = shard_of_id(identifier, self.count)
        return 0 if shard is None else shard

    def group(self, identifiers: Sequence[str]) -> dict[int, list[str]]:
        """``identifiers`` by the shard each was made on (see :meth:`for_id`), in their order."""
        groups: dict[int, list[str]] = {}
        for identifier in identifiers:
            groups.setdefault(self.for_id(identifier), []).append(identifier)
        return groups

    def index_of(self, conn: Connection) -> int | None:
        """The shard whose database ``conn`` is on, or ``None`` if it is on none of them."""
        for index, engine in enumerate(self.engines):
            if conn.engine is engine:
                return index
        return None

    # -- reachability ------------------------------------------------------------------------

    def available(self, shard: int) -> bool:
        """Whether sweeps should try ``shard`` now (it has not failed lately)."""
        with self._lock:
            paused = self._paused.get(shard)
        return paused is None or self._clock() >= paused[0]

    def failed(self, shard: int, exc: BaseException) -> None:
        """Skip ``shard`` in sweeps for a while, twice as long as last time (up to 30 s)."""
        with self._lock:
            previous = self._paused.get(shard)
            pause = _FIRST_PAUSE if previous is None else min(previous[1] * 2, _LONGEST_PAUSE)
            self._paused[shard] = (self._clock() + pause, pause)
        log.warning("harvest: shard %d is unavailable (%s); trying it again in %.0f s", shard, exc, pause)

    def succeeded(self, shard: int) -> None:
        with self._lock:
            if self._paused.pop(shard, None) is not None:
                log.info("harvest: shard %d is available again", shard)

    def each(self, action: str, work: Callable[[int], T], *, only: Iterable[int] | None = None) -> list[T]:
        """Run ``work(shard)`` on every shard (or those in ``only``) that has not failed lately, and
        return the results of those that succeeded. A shard whose database fails
        (:class:`StoreError`) is skipped for a while (:meth:`failed`): a sweep neither waits for nor
        fails on a shard that is down."""
        results: list[T] = []
        for shard in range(self.count) if only is None else sorted(set(only)):
            if not self.available(shard):
                continue
            try:
                results.append(work(shard))
            except StoreError as exc:
                self.failed(shard, StoreError(f"could not {action}: {exc}"))
                continue
            self.succeeded(shard)
        return results

    # -- the layout check --------------------------------------------------------------------

    def check_layout(self, *, executions: Table, now: datetime | None = None) -> None:
        """Record each database's place in the list, or refuse a list that changed since.

        :param executions: the executions table: a database listed for the first time must hold no
            runs yet (its runs' ``workflow_id`` would route elsewhere now).
        :raises ConfigurationError: a shard was first used at another place, or with another number
            of shards, or holds runs made before it was a shard.
        """
        stamp = now or utcnow()
        for shard, engine in enumerate(self.engines):
            db = SqlDatabase(engine, owner="HARVEST_WORKFLOW_SHARDS")
            db.create_tables([shard_map_table], what="the shard map")
            where = engine.url.render_as_string(hide_password=True)
            with db.transaction("check the shard map") as conn:
                rows = conn.execute(select(shard_map_table)).all()
                if not rows:
                    if conn.execute(select(executions.c.execution_id).limit(1)).first() is not None:
                        raise ConfigurationError(
                            f"the database of shard {shard} ({where}) holds workflow runs made before it "
                            "was a shard: their workflow_id would now route to other shards. A sharded "
                            "deployment starts on empty databases"
                        )
                    conn.execute(
                        db.insert(shard_map_table).values(
                            shard=shard, shard_count=self.count, created_at=stamp
                        )
                    )
                    continue
                row = rows[0]
                if row.shard != shard or row.shard_count != self.count:
                    raise ConfigurationError(
                        f"HARVEST_WORKFLOW_SHARDS changed: the database listed as shard {shard} of "
                        f"{self.count} ({where}) was shard {row.shard} of {row.shard_count}. Runs route "
                        "by workflow_id to a shard and their ids name it, so a reordered, longer or "
                        "shorter list would lose them; restore the list (shards are added only to a "
                        "new deployment)"
                    )


def check_unsharded(engine: Engine) -> None:
    """Refuse to use a database alone that is one shard of several (its runs' siblings are on the
    other shards, and its ids and routing assume them).

    :raises ConfigurationError: the database's shard map says it is a shard of a longer list.
    """
    db = SqlDatabase(engine, owner="flask-harvest")
    with db.read("check the shard map") as conn:
        if not inspect(conn).has_table(shard_map_table.name):
            return
        row = conn.execute(select(shard_map_table)).first()
    if row is not None and row.shard_count > 1:
        where = engine.url.render_as_string(hide_password=True)
        raise ConfigurationError(
            f"the database {where} is shard {row.shard} of {row.shard_count}: set HARVEST_WORKFLOW_SHARDS "
            "to the list it was first used with"
        )
