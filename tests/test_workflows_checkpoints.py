"""Checkpoints of several runs in one transaction (``checkpoint_many``, and ``checkpoint`` through
the store's group commit) on SQLite and PostgreSQL: each result is what the run's checkpoint
alone gives."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from datetime import timedelta

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest.errors import InvalidFieldError
from flask_harvest.workflows import ExecutionState, SqlWorkflowStore
from flask_harvest.workflows._schema import executions_table, steps_table
from flask_harvest.workflows.store import Checkpoint, LeaseView

from .properties import BUDGET
from .workflow_support import SQL_KINDS, START, workflow_store

S = ExecutionState
LEASE = 30.0
RUNS = 4
#: Tells apart the runs of one test's examples (its store outlives them).
_examples = itertools.count()


@pytest.fixture(params=SQL_KINDS)
def store(request: pytest.FixtureRequest) -> SqlWorkflowStore:
    return workflow_store(request, request.param)


@dataclass(frozen=True)
class Run:
    """How a run stands when the checkpoints arrive."""

    ended: bool
    cancel: bool
    deadline: bool
    written: frozenset[int]  # positions checkpointed already


@dataclass(frozen=True)
class Item:
    run: int
    stale: bool
    seq: int
    renew: bool
    error: bool


RUN = st.builds(
    Run,
    ended=st.booleans(),
    cancel=st.booleans(),
    deadline=st.booleans(),
    written=st.frozensets(st.integers(0, 2), max_size=2),
)
ITEM = st.builds(
    Item,
    run=st.integers(0, RUNS - 1),
    stale=st.integers(0, 4).map(lambda n: n == 0),
    seq=st.integers(0, 2),
    renew=st.booleans(),
    error=st.booleans(),
)


def _set_up(store: SqlWorkflowStore, runs: list[Run], label: str) -> list[tuple[str, str]]:
    """Start and claim one execution per run, shaped as ``runs`` say; their (id, token)."""
    made = []
    for number, run in enumerate(runs):
        deadline = START + timedelta(seconds=1) if run.deadline else None
        execution, _ = store.start("refund", {"n": number}, f"{label}-{number}", now=START, deadline=deadline)
        claimed = store.claim(execution.execution_id, now=START, lease_seconds=LEASE)
        assert claimed is not None and claimed.lease_token is not None
        for seq in sorted(run.written):
            assert store.record_step(
                execution.execution_id, claimed.lease_token, seq, "old", output=seq, now=START
            )
        if run.cancel:
            store.request_cancel(execution.execution_id, "please", now=START)
        if run.ended:
            assert store.finish(execution.execution_id, S.FAILED, error="x", now=START) is not None
        made.append((execution.execution_id, claimed.lease_token))
    return made


def _checkpoints(made: list[tuple[str, str]], items: list[Item]) -> list[Checkpoint]:
    later = START + timedelta(seconds=5)
    return [
        Checkpoint(
            made[item.run][0],
            "not-the-token" if item.stale else made[item.run][1],
            item.seq,
            "step",
            later,
            output={"seq": item.seq, "run": item.run},
            error="ValueError: no" if item.error else None,
            lease_seconds=LEASE if item.renew else None,
        )
        for item in items
    ]


def _state(store: SqlWorkflowStore, made: list[tuple[str, str]]) -> list[object]:
    """What the checkpoints may have changed, per run in order (ids left out)."""
    with store.engine.connect() as conn:
        found: list[object] = []
        for execution_id, _ in made:
            expires = conn.execute(
                sa.select(executions_table.c.lease_expires_at).where(
                    executions_table.c.execution_id == execution_id
                )
            ).scalar()
            steps = conn.execute(
                sa.select(steps_table.c.seq, steps_table.c.name, steps_table.c.output, steps_table.c.error)
                .where(steps_table.c.execution_id == execution_id)
                .order_by(steps_table.c.seq)
            ).all()
            found.append((expires, [tuple(step) for step in steps]))
    return found


def _expected(runs: list[Run], items: list[Item]) -> list[LeaseView | None]:
    """The rule, independent of the SQL: a checkpoint lands while its run runs under its token
    and its position is free; it returns the run's cancel request and deadline."""
    written = {number: set(run.written) for number, run in enumerate(runs)}
    results: list[LeaseView | None] = []
    for item in items:
        run = runs[item.run]
        if run.ended or item.stale or item.seq in written[item.run]:
            results.append(None)
            continue
        written[item.run].add(item.seq)
        deadline = START + timedelta(seconds=1) if run.deadline else None
        results.append(LeaseView(run.cancel, "please" if run.cancel else None, deadline))
    return results


@BUDGET
@given(runs=st.lists(RUN, min_size=RUNS, max_size=RUNS), items=st.lists(ITEM, max_size=12))
def test_many_checkpoints_in_one_transaction_give_what_each_alone_gives(
    store: SqlWorkflowStore, runs: list[Run], items: list[Item]
) -> None:
    tag = next(_examples)
    alone_runs = _set_up(store, runs, f"alone-{tag}")
    grouped_runs = _set_up(store, runs, f"grouped-{tag}")
    alone = [
        store.checkpoint(
            c.execution_id,
            c.token,
            c.seq,
            c.name,
            output=c.output,
            error=c.error,
            now=c.now,
            lease_seconds=c.lease_seconds,
        )
        for c in _checkpoints(alone_runs, items)
    ]
    grouped = store.checkpoint_many(_checkpoints(grouped_runs, items))
    assert grouped == alone == _expected(runs, items)
    assert _state(store, grouped_runs) == _state(store, alone_runs)


def test_a_bad_output_writes_none_of_the_checkpoints(store: SqlWorkflowStore) -> None:
    made = _set_up(store, [Run(False, False, False, frozenset())] * 2, "bad")
    good, bad = _checkpoints(made, [Item(0, False, 0, False, False), Item(1, False, 0, False, False)])
    with pytest.raises(InvalidFieldError, match="step 'step' result"):
        store.checkpoint_many(
            [good, Checkpoint(bad.execution_id, bad.token, 0, "step", bad.now, output={1j})]
        )
    assert store.list_steps(good.execution_id) == []


def test_a_batch_racing_a_terminate_waits_for_it_and_only_that_run_is_refused(
    store: SqlWorkflowStore,
) -> None:
    made = _set_up(store, [Run(False, False, False, frozenset())] * 2, "race")
    items = _checkpoints(made, [Item(0, False, 0, False, False), Item(1, False, 0, True, False)])
    results: list[list[LeaseView | None]] = []
    racer = threading.Thread(target=lambda: results.append(store.checkpoint_many(items)))
    with store.engine.begin() as conn:
        assert store.finish(made[1][0], S.TERMINATED, error="stop", now=START, conn=conn)
        racer.start()
        racer.join(0.5)
        # The batch waits for the terminate's transaction instead of slipping in beside it.
        assert racer.is_alive()
    racer.join(10)
    assert results == [[LeaseView(False, None, None), None]]
    assert [s.seq for s in store.list_steps(made[0][0])] == [0]
    assert store.list_steps(made[1][0]) == []


def test_checkpoints_of_threads_at_once_each_get_their_own_result(store: SqlWorkflowStore) -> None:
    runs = [Run(number % 3 == 0, number % 2 == 0, False, frozenset()) for number in range(12)]
    made = _set_up(store, runs, "threads")
    items = [Item(number, False, 0, number % 4 == 0, False) for number in range(12)]
    checkpoints = _checkpoints(made, items)
    results: dict[int, LeaseView | None] = {}
    barrier = threading.Barrier(len(checkpoints))

    def write(number: int, c: Checkpoint) -> None:
        barrier.wait()
        results[number] = store.checkpoint(
            c.execution_id, c.token, c.seq, c.name, output=c.output, now=c.now, lease_seconds=c.lease_seconds
        )

    threads = [threading.Thread(target=write, args=pair) for pair in enumerate(checkpoints)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [results[n] for n in range(len(items))] == _expected(runs, items)
