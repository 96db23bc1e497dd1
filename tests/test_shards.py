"""Workflow shards: the routing rules (documented vectors), ids that name their shard, runs that
land and run on their shard's database, reads across shards, and the start-up layout check."""

from __future__ import annotations

import inspect
import subprocess
import sys
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from hypothesis import given, settings
from hypothesis import strategies as st

from flask_harvest import workflow_service
from flask_harvest.errors import ConfigurationError
from flask_harvest.shards import MAX_SHARDS, encode_id, new_id, new_id_beside, shard_for_key, shard_of_id
from flask_harvest.workflows import ExecutionState
from flask_harvest.workflows._schema import executions_table
from flask_harvest.workflows.sharded import CrossShardStartError, ShardedWorkflowStore

from .shard_support import pg_shards, sqlite_shards
from .workflow_app import make_workflow_app, wait_for

__all__ = ["pg_shards", "sqlite_shards"]

S = ExecutionState

#: The routing vectors docs/shards.rst lists: (workflow_id, shards, shard).
VECTORS = [
    ("order-1", 2, 0),
    ("order-1", 3, 2),
    ("order-1", 8, 4),
    ("order-2", 3, 1),
    ("invoice-42", 4, 2),
    ("invoice-42", 8, 6),
    ("", 3, 1),
    ("émile", 4, 3),
]


@pytest.mark.parametrize(("key", "count", "shard"), VECTORS)
def test_routing_matches_the_documented_vectors(key: str, count: int, shard: int) -> None:
    assert shard_for_key(key, count) == shard


def test_routing_is_the_same_in_another_process() -> None:
    """No per-process salt (Python's ``hash`` has one): a fresh interpreter routes alike."""
    keys = [f"key-{i}" for i in range(50)]
    code = (
        "import sys, json; from flask_harvest.shards import shard_for_key; "
        "print(json.dumps([shard_for_key(k, 5) for k in json.loads(sys.argv[1])]))"
    )
    import json

    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(keys)], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == [shard_for_key(k, 5) for k in keys]
    assert len(set(json.loads(out))) == 5  # fifty keys reach every one of five shards


@given(st.integers(0, MAX_SHARDS - 1))
def test_an_id_names_the_shard_it_was_made_on(shard: int) -> None:
    made = new_id(shard)
    assert len(made) <= 36  # the column's width since the first release
    assert shard_of_id(made, MAX_SHARDS) == shard
    assert shard_of_id(new_id_beside(made), MAX_SHARDS) == shard
    if shard > 0:
        assert shard_of_id(made, shard) is None  # a shard the deployment does not have


@given(st.text(max_size=40))
def test_any_text_routes_somewhere_or_nowhere_without_error(text: str) -> None:
    """Unmarked ids (every id of an unsharded deployment) are on the default shard."""
    found = shard_of_id(text, 3)
    assert found is None or 0 <= found < 3
    assert 0 <= shard_for_key(text, 3) < 3
    if not text.startswith("s"):
        assert found == 0


def test_unsharded_ids_stay_plain_uuids() -> None:
    plain = new_id(None)
    assert str(uuid.UUID(plain)) == plain
    assert new_id_beside(plain) != plain and uuid.UUID(new_id_beside(plain))
    assert encode_id(None, plain) == plain


def _rows_on(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return set(conn.execute(sa.select(executions_table.c.execution_id)).scalars())
    finally:
        engine.dispose()


def _sharded_app(urls: list[str], **config: Any) -> Flask:
    return make_workflow_app(urls[0], HARVEST_WORKFLOW_SHARDS=urls, **config)


@pytest.mark.parametrize("kind", ["postgresql", "sqlite"])
def test_runs_land_and_run_on_the_shard_their_workflow_id_routes_to(
    kind: str, request: pytest.FixtureRequest
) -> None:
    urls: list[str] = request.getfixturevalue("pg_shards" if kind == "postgresql" else "sqlite_shards")
    app = _sharded_app(urls)
    with app.app_context():
        service = workflow_service()
        assert isinstance(service.store, ShardedWorkflowStore)
        handles = [service.start("three_steps", i, workflow_id=f"order-{i}")[0] for i in range(12)]
    for handle in handles:
        wait_for(app, handle.execution_id, lambda state, steps: state is S.COMPLETED)
    placed: dict[int, set[str]] = {0: set(), 1: set(), 2: set()}
    for i, handle in enumerate(handles):
        shard = shard_for_key(f"order-{i}", 3)
        assert handle.execution_id.startswith(f"s{shard}-")
        placed[shard].add(handle.execution_id)
    for shard, url in enumerate(urls):
        assert _rows_on(url) == placed[shard]
    assert all(placed.values()), "twelve ids reach every one of three shards"


def test_lists_and_counts_across_shards_are_the_union(pg_shards: list[str]) -> None:
    app = _sharded_app(pg_shards)
    with app.app_context():
        service = workflow_service()
        started = [service.start("three_steps", i, workflow_id=f"w-{i}")[0].execution_id for i in range(9)]
        for execution_id in started:
            wait_for(app, execution_id, lambda state, steps: state is S.COMPLETED)
        store = service.store
        seen: list[str] = []
        cursor = None
        while True:
            page = store.list_executions(cursor=cursor, limit=2)
            if not page:
                break
            seen += [e.execution_id for e in page]
            cursor = (page[-1].created_at, page[-1].execution_id)
        assert sorted(seen) == sorted(started)
        every = store.list_executions(limit=100)
        keys = [(e.created_at, e.execution_id) for e in every]
        assert keys == sorted(keys, reverse=True)
        assert store.count_states(cap=1000)[S.COMPLETED] == 9
        assert store.count_states(cap=4)[S.COMPLETED] == 4  # capped counts stay "at least"
        assert store.count_executions(cap=1000) == 9
        assert store.count_executions(state=S.COMPLETED, cap=5) == 5
        for execution_id in started:
            assert store.get(execution_id) is not None
            assert store.get_by_workflow_id(store.get(execution_id).workflow_id) is not None  # type: ignore[union-attr]


def test_a_start_in_a_transaction_on_another_shard_is_refused(pg_shards: list[str]) -> None:
    app = _sharded_app(pg_shards)
    with app.app_context():
        store = workflow_service().store
        assert isinstance(store, ShardedWorkflowStore)
        key = next(f"k{i}" for i in range(100) if shard_for_key(f"k{i}", 3) == 1)
        with (
            store.shards.engines[0].begin() as conn,
            pytest.raises(CrossShardStartError, match="routes to shard 1"),
        ):
            store.start("echo", 1, key, conn=conn, now=_now())
        assert store.get_by_workflow_id(key) is None


def _now() -> Any:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


def test_a_changed_shard_list_is_refused_at_start_up(pg_shards: list[str]) -> None:
    _sharded_app(pg_shards)
    with pytest.raises(ConfigurationError, match="HARVEST_WORKFLOW_SHARDS changed"):
        make_workflow_app(pg_shards[0], HARVEST_WORKFLOW_SHARDS=pg_shards[:2])
    with pytest.raises(ConfigurationError, match="HARVEST_WORKFLOW_SHARDS changed"):
        make_workflow_app(pg_shards[0], HARVEST_WORKFLOW_SHARDS=[pg_shards[1], pg_shards[0], pg_shards[2]])
    _sharded_app(pg_shards)  # the same list again is fine


def test_a_database_with_runs_of_its_own_cannot_become_a_shard(pg_shards: list[str]) -> None:
    app = make_workflow_app(pg_shards[1])
    with app.app_context():
        workflow_service().start("echo", 1)
    with pytest.raises(ConfigurationError, match="holds workflow runs made before it was a shard"):
        _sharded_app(pg_shards)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "", "postgresql://", "mysql://x/y", "nope"]), max_size=4))
def test_shard_settings_are_checked(entries: list[str]) -> None:
    from flask_harvest.config import load_settings

    valid = all(e in ("", "postgresql://") for e in entries)
    if not valid:
        with pytest.raises(ConfigurationError, match="HARVEST_WORKFLOW_SHARDS"):
            load_settings({"HARVEST_WORKFLOW_SHARDS": entries}, {})
        return
    loaded = load_settings({"HARVEST_WORKFLOW_SHARDS": entries}, {})
    assert loaded.workflow_shards.count(",") == max(len(entries) - 1, 0)


def test_one_shard_of_several_cannot_be_used_alone(pg_shards: list[str]) -> None:
    _sharded_app(pg_shards)
    with pytest.raises(ConfigurationError, match="is shard 1 of 3"):
        make_workflow_app(pg_shards[1])


def test_the_sharded_store_routes_every_call_of_the_single_store() -> None:
    """Every public method of SqlWorkflowStore is routed by ShardedWorkflowStore: none falls
    through to the base, which would act on shard 0 alone."""
    from flask_harvest.workflows.store import SqlWorkflowStore

    public = {
        name
        for name, value in vars(SqlWorkflowStore).items()
        if not name.startswith("_") and not isinstance(value, staticmethod)
    }
    assert public - set(vars(ShardedWorkflowStore)) == set()
    assert "started_in" in vars(SqlWorkflowStore)  # per-connection, the same on every shard
    assert inspect.signature(ShardedWorkflowStore.start).parameters.keys() == (
        inspect.signature(SqlWorkflowStore.start).parameters.keys()
    )


@pytest.mark.parametrize(
    "bad",
    [
        "postgresql://user:hunter2@host:notaport/db",
        "sqlite+nosuchdriver:///x.db",
        "postgresql+nosuchdriver://user:hunter2@h/db",
    ],
)
def test_an_unusable_shard_url_is_a_configuration_error_without_its_password(
    bad: str, pg_shards: list[str]
) -> None:
    with pytest.raises(ConfigurationError, match="HARVEST_WORKFLOW_SHARDS entry 1") as caught:
        make_workflow_app(pg_shards[0], HARVEST_WORKFLOW_SHARDS=[pg_shards[0], bad])
    assert "hunter2" not in str(caught.value)


def _unrouted(base: type, sharded: type) -> set[str]:
    public = {n for n, v in vars(base).items() if not n.startswith("_") and not isinstance(v, staticmethod)}
    return public - set(vars(sharded))


def test_the_sharded_callback_store_routes_every_call_of_the_single_store() -> None:
    from flask_harvest.callbacks.sharded import ShardedCallbackStore
    from flask_harvest.callbacks.store import SqlCallbackStore

    assert _unrouted(SqlCallbackStore, ShardedCallbackStore) == set()


def test_the_sharded_trigger_store_leaves_only_shard_0_reads_and_calls_on_a_connection() -> None:
    """What the sharded trigger store does not route either reads shard 0 (definitions are read
    there), writes one database it is asked to, or works in the caller's transaction (on the
    source's shard)."""
    from flask_harvest.triggers.sharded import ShardedTriggerStore
    from flask_harvest.triggers.store import SqlTriggerStore

    shard_0_reads = {"get", "list_triggers"}
    one_database = {"put", "mirror"}
    in_the_callers_transaction = {
        "fire_decided",
        "for_source",
        "record_fire",
        "set_target",
        "started_outbox",
        "take_outbox",
        "write_outbox",
    }
    for name in in_the_callers_transaction:
        assert "conn" in inspect.signature(getattr(SqlTriggerStore, name)).parameters, name
    assert (
        _unrouted(SqlTriggerStore, ShardedTriggerStore)
        == shard_0_reads | one_database | in_the_callers_transaction
    )


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(), st.lists(st.text(), max_size=5), st.integers(), st.floats(), st.none()))
def test_any_shard_setting_loads_or_is_a_configuration_error(value: object) -> None:
    """Hostile values (NUL, lone surrogates, huge numbers, any text) never escape as anything but
    a ConfigurationError naming the setting."""
    from flask_harvest.config import load_settings, shard_urls

    refusal = ""
    try:
        loaded = load_settings({"HARVEST_WORKFLOW_SHARDS": value}, {})
    except ConfigurationError as exc:
        refusal = str(exc)
    if refusal:
        assert "HARVEST_WORKFLOW_SHARDS" in refusal
        return
    for url in shard_urls(loaded):
        assert url.split("://")[0].split("+")[0] in ("postgresql", "sqlite")


@given(st.lists(st.one_of(st.text(max_size=40), st.integers(), st.none()), max_size=20))
def test_grouping_ids_by_shard_keeps_every_id_once_in_order(identifiers: list[object]) -> None:
    from flask_harvest._shard_set import ShardSet

    shards = ShardSet([sa.create_engine(f"sqlite:///file{i}.db") for i in range(3)])
    texts = [i for i in identifiers if isinstance(i, str)]
    groups = shards.group(texts)
    assert sorted(i for ids in groups.values() for i in ids) == sorted(texts)
    for shard, ids in groups.items():
        assert 0 <= shard < 3 and ids == [i for i in texts if shards.for_id(i) == shard]
    assert all(0 <= shards.for_id(i) < 3 for i in identifiers)
