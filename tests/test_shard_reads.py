"""Reading runs across shards: the HTTP API's list and its cursor, ``flask harvest workflows list``,
the dashboard's list and overview counts, all over three PostgreSQL shards and page by page; a
property test of the merged pages and counts over SQLite shards; and a run read by id with one
statement on its own shard."""

from __future__ import annotations

import json
import re
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from hypothesis import given, settings
from hypothesis import strategies as st

from flask_harvest import workflow_service
from flask_harvest._shard_set import ShardSet
from flask_harvest.dashboard.paging import PAGE_SIZE
from flask_harvest.shards import shard_for_key
from flask_harvest.workflows import Execution, ExecutionState
from flask_harvest.workflows.sharded import ShardedWorkflowStore

from .dashboard_client import PREFIX, SECRET_KEY, signed_in, text
from .shard_support import pg_shards
from .workflow_app import AUTH, TOKEN, make_workflow_app

__all__ = ["pg_shards"]

S = ExecutionState
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
RUNS = PAGE_SIZE + 7
#: Every fifth run is terminated; the others wait, never run (no job is queued for them).
TERMINATED = {i for i in range(RUNS) if i % 5 == 0}


def _store(app: Flask) -> ShardedWorkflowStore:
    with app.app_context():
        store = workflow_service().store
    assert isinstance(store, ShardedWorkflowStore)
    return store


def _fill(app: Flask) -> list[str]:
    """RUNS rows spread over the shards, some sharing a created_at (the order's tie-break is the
    id), written through the store so that no worker runs them; newest first."""
    store = _store(app)
    ids: list[str] = []
    for i in range(RUNS):
        now = T0 + timedelta(seconds=i // 3)
        execution, _ = store.start("echo", i, f"read-{i}", now=now)
        ids.append(execution.execution_id)
        if i in TERMINATED:
            store.terminate(execution.execution_id, now=now)
    assert {store.shards.for_id(i) for i in ids} == {0, 1, 2}
    created = {i: T0 + timedelta(seconds=n // 3) for n, i in enumerate(ids)}
    return sorted(ids, key=lambda i: (created[i], i), reverse=True)


@pytest.fixture
def app(pg_shards: list[str]) -> Flask:
    return make_workflow_app(
        pg_shards[0],
        with_triggers=False,
        HARVEST_WORKFLOW_SHARDS=pg_shards,
        HARVEST_DASHBOARD=True,
        SECRET_KEY=SECRET_KEY,
    )


def test_the_http_list_pages_through_every_shard(app: Flask) -> None:
    newest_first = _fill(app)
    client = app.test_client()
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        query = {"limit": 7, **({"cursor": cursor} if cursor else {})}
        response = client.get("/api/harvest/workflows", query_string=query, headers=AUTH)
        assert response.status_code == 200, response.get_data(as_text=True)
        body = response.get_json()
        seen += [e["execution_id"] for e in body["executions"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
        assert response.headers["X-Next-Cursor"] == cursor
    assert seen == newest_first and pages == -(-RUNS // 7)
    response = client.get(
        "/api/harvest/workflows", query_string={"state": "Terminated", "limit": 100}, headers=AUTH
    )
    assert {e["execution_id"] for e in response.get_json()["executions"]} == {
        i for i in newest_first if int(_input_of(app, i)) in TERMINATED
    }


def _input_of(app: Flask, execution_id: str) -> Any:
    with app.app_context():
        return workflow_service().get(execution_id).input


def test_the_cli_list_pages_through_every_shard(app: Flask) -> None:
    newest_first = _fill(app)
    runner = app.test_cli_runner()
    seen: list[str] = []
    cursor: str | None = None
    while True:
        args = ["harvest", "workflows", "list", "--limit", "10", "--json"]
        result = runner.invoke(args=args + (["--cursor", cursor] if cursor else []))
        assert result.exit_code == 0, result.output
        body = json.loads(result.output)
        seen += [e["execution_id"] for e in body["executions"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == newest_first
    result = runner.invoke(
        args=["harvest", "workflows", "list", "--state", "Pending", "--json", "--limit", "500"]
    )
    assert len(json.loads(result.output)["executions"]) == RUNS - len(TERMINATED)


def test_the_dashboard_lists_and_counts_every_shard(app: Flask) -> None:
    newest_first = _fill(app)
    client = app.test_client()
    signed_in(client, TOKEN)
    ids = re.compile(r'href="/harvest/workflows/(s[0-9]-[0-9a-f]{32})"')
    first = text(client.get(f"{PREFIX}/workflows"))
    found = re.search(r'id="next-page" href="([^"]+)"', first)
    assert found, "no next page"
    second = text(client.get(found.group(1).replace("&amp;", "&")))
    listed = list(dict.fromkeys(ids.findall(first))) + list(dict.fromkeys(ids.findall(second)))
    assert listed == newest_first and 'id="next-page"' not in second
    overview = text(client.get(f"{PREFIX}/"))
    for state, count in (
        ("Pending", RUNS - len(TERMINATED)),
        ("Terminated", len(TERMINATED)),
        ("Completed", 0),
    ):
        assert re.search(rf'id="executions-{state}"><div class="value"><a [^>]+>{count}</a>', overview), state


@contextmanager
def _statements(engines: list[sa.Engine]) -> Iterator[Counter[int]]:
    """Count the statements sent to each engine (by its shard) inside the block."""
    counts: Counter[int] = Counter()
    listeners = []
    for index, engine in enumerate(engines):

        def count(*_: Any, index: int = index) -> None:
            counts[index] += 1

        sa.event.listen(engine, "before_cursor_execute", count)
        listeners.append((engine, count))
    try:
        yield counts
    finally:
        for engine, fn in listeners:
            sa.event.remove(engine, "before_cursor_execute", fn)


def test_a_run_is_read_by_id_with_one_statement_on_its_shard(app: Flask) -> None:
    ids = _fill(app)
    store = _store(app)
    for execution_id in ids[:9]:
        shard = store.shards.for_id(execution_id)
        with _statements(store.shards.engines) as counts:
            assert store.get(execution_id) is not None
        assert counts == Counter({shard: 1}), execution_id
        with _statements(store.shards.engines) as counts:
            store.list_steps(execution_id)
        assert counts == Counter({shard: 1}), execution_id
    # An id no shard made is looked up on shard 0 alone and found nowhere.
    with _statements(store.shards.engines) as counts:
        assert store.get("s7-" + "0" * 32) is None
    assert set(counts) <= {0}


# -- the merged pages and counts, for any placement ------------------------------------------------

_KEYS = st.text(alphabet="abcdefgh-0123", min_size=1, max_size=8)


@settings(max_examples=25, deadline=None)
@given(
    runs=st.lists(st.tuples(_KEYS, st.integers(0, 3), st.booleans()), max_size=25),
    limit=st.integers(1, 6),
)
def test_paged_lists_are_the_union_of_the_shards_and_counts_their_sums(
    runs: list[tuple[str, int, bool]], limit: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        engines = [sa.create_engine(f"sqlite:///{Path(tmp) / f's{k}.db'}") for k in range(3)]
        store = ShardedWorkflowStore(ShardSet(engines))
        try:
            store.ensure_schema()
            for n, (key, second, terminate) in enumerate(runs):
                # Few distinct times: rows of several shards often share a created_at.
                now = T0 + timedelta(seconds=second)
                execution, _ = store.start("w" if n % 2 else "v", n, f"{key}-{n}", now=now)
                assert store.shards.for_id(execution.execution_id) == shard_for_key(f"{key}-{n}", 3)
                if terminate:
                    store.terminate(execution.execution_id, now=now)
            every = [e for sub in store.stores for e in sub.list_executions(limit=1000)]
            for name, state in ((None, None), ("w", None), (None, S.TERMINATED), ("v", S.PENDING)):
                expected = sorted(
                    (
                        e
                        for e in every
                        if (name is None or e.workflow_name == name) and (state is None or e.state is state)
                    ),
                    key=_position,
                    reverse=True,
                )
                assert _paged(store, name, state, limit) == [e.execution_id for e in expected]
            counts = Counter(e.state for e in every)
            assert store.count_states(cap=1000) == {s: counts.get(s, 0) for s in ExecutionState}
            capped = store.count_states(cap=2)
            assert all(capped[s] == min(counts.get(s, 0), 2) for s in ExecutionState)
            assert store.count_by_workflow(["v", "w"], cap=1000) == {
                pair: n for pair, n in Counter((e.workflow_name, e.state) for e in every).items()
            } | {pair: 0 for pair in _all_pairs() if pair not in {(e.workflow_name, e.state) for e in every}}
        finally:
            for engine in engines:
                engine.dispose()


def _position(execution: Execution) -> tuple[datetime, str]:
    return (execution.created_at, execution.execution_id)


def _all_pairs() -> list[tuple[str, ExecutionState]]:
    return [(name, state) for name in ("v", "w") for state in ExecutionState]


def _paged(
    store: ShardedWorkflowStore, name: str | None, state: ExecutionState | None, limit: int
) -> list[str]:
    seen: list[str] = []
    cursor: tuple[datetime, str] | None = None
    while True:
        page = store.list_executions(name=name, state=state, cursor=cursor, limit=limit)
        seen += [e.execution_id for e in page]
        if len(page) < limit:
            return seen
        cursor = _position(page[-1])
