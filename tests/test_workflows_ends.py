"""Runs that end at once on one process share a transaction: each end gives what it gives alone.

The rule is the same as for checkpoints (tests/test_workflows_checkpoints.py): a batch of ends, in
one transaction, must land exactly the ends that land one by one, with the same rows and the same
writes of the terminal hooks; a hook that raises fails only its own run's end.
"""

from __future__ import annotations

import contextvars
import itertools
import threading
from dataclasses import dataclass
from datetime import timedelta

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest.workflows import Execution, ExecutionState, SqlWorkflowStore
from flask_harvest.workflows._schema import executions_table
from flask_harvest.workflows._store_core import _End, _Ended
from flask_harvest.workflows.models import encode_json

from .properties import BUDGET
from .workflow_support import SQL_KINDS, START, run_counts, runs_table, workflow_store

S = ExecutionState
LEASE = 30.0
RUNS = 4
STATES = [S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMED_OUT, S.TERMINATED]
#: Tells apart the runs of one test's examples (its store outlives them).
_examples = itertools.count()
#: The hook refuses to end a run whose input carries this.
_REFUSE = "refuse"


@pytest.fixture(params=SQL_KINDS)
def store(request: pytest.FixtureRequest) -> SqlWorkflowStore:
    made = workflow_store(request, request.param)
    made.hooks.register(_hook)
    return made


def _hook(conn: sa.Connection, execution: Execution) -> None:
    """A terminal hook that writes in the end's transaction, and raises for refused runs."""
    conn.execute(runs_table.insert().values(label=f"ended {execution.workflow_id}"))
    if isinstance(execution.input, dict) and execution.input.get(_REFUSE):
        raise RuntimeError(f"the hook refuses {execution.workflow_id}")


@dataclass(frozen=True)
class Run:
    """How a run stands when its ends arrive."""

    ended: bool
    refused: bool


@dataclass(frozen=True)
class End:
    run: int
    stale: bool  # under a token that is not the run's
    leased: bool  # under the run's token (else: no token, as an operator's end)
    state: int


RUN = st.builds(
    Run, ended=st.integers(0, 3).map(lambda n: n == 0), refused=st.integers(0, 3).map(lambda n: n == 0)
)
END = st.builds(
    End,
    run=st.integers(0, RUNS - 1),
    stale=st.integers(0, 4).map(lambda n: n == 0),
    leased=st.booleans(),
    state=st.integers(0, len(STATES) - 1),
)


def _set_up(store: SqlWorkflowStore, runs: list[Run], label: str) -> list[tuple[str, str]]:
    """Start and claim one execution per run, shaped as ``runs`` say; their (id, token)."""
    made = []
    for number, run in enumerate(runs):
        execution, _ = store.start(
            "refund", {"n": number, _REFUSE: run.refused}, f"{label}-{number}", now=START
        )
        claimed = store.claim(execution.execution_id, now=START, lease_seconds=LEASE)
        assert claimed is not None and claimed.lease_token is not None
        if run.ended:
            with store.engine.begin() as conn:  # no hook refuses what the set-up ends
                conn.execute(
                    sa.update(executions_table)
                    .where(executions_table.c.execution_id == execution.execution_id)
                    .values(state=S.FAILED.value, lease_token=None, completed_at=START)
                )
        made.append((execution.execution_id, claimed.lease_token))
    return made


def _args(made: list[tuple[str, str]], end: End) -> tuple[str, ExecutionState, str | None, str | None]:
    execution_id, token = made[end.run]
    state = STATES[end.state]
    chosen = "not-the-token" if end.stale else token if end.leased else None
    return execution_id, state, chosen, f"ended {state.value}" if state is not S.COMPLETED else None


def _alone(store: SqlWorkflowStore, made: list[tuple[str, str]], ends: list[End]) -> list[object]:
    """Each end in a transaction of its own, as before ends were grouped (the caller's
    transaction path, which builds its statement per call)."""
    results: list[object] = []
    later = START + timedelta(seconds=5)
    for end in ends:
        execution_id, state, token, error = _args(made, end)
        try:
            with store.engine.begin() as conn:
                ended = store.finish(
                    execution_id,
                    state,
                    output={"run": end.run},
                    error=error,
                    now=later,
                    token=token,
                    conn=conn,
                )
        except RuntimeError as exc:
            results.append(str(exc).replace("alone", "?"))
            continue
        results.append(None if ended is None else _shape(ended))
    return results


def _grouped(store: SqlWorkflowStore, made: list[tuple[str, str]], ends: list[End]) -> list[object]:
    """All the ends handed to the group's write as one batch."""
    later = START + timedelta(seconds=5)
    batch = []
    for end in ends:
        execution_id, state, token, error = _args(made, end)
        output = encode_json({"run": end.run}, field="output") if state is S.COMPLETED else None
        batch.append(_End(execution_id, state, output, error, later, token, contextvars.copy_context()))
    results: list[object] = []
    for result in store._terminal._write_grouped(batch):
        if isinstance(result, Exception):
            assert isinstance(result, RuntimeError)
            results.append(str(result).replace("grouped", "?"))
        else:
            assert isinstance(result, _Ended)
            results.append(None if result.execution is None else _shape(result.execution))
    return results


def _shape(execution: Execution) -> tuple[object, ...]:
    return (execution.state, execution.output, execution.error, execution.completed_at, execution.lease_token)


def _rows(store: SqlWorkflowStore, made: list[tuple[str, str]], label: str) -> list[object]:
    """What the ends may have changed, per run in order (ids and labels left out)."""
    columns = executions_table.c
    with store.engine.connect() as conn:
        rows = [
            tuple(
                conn.execute(
                    sa.select(
                        columns.state,
                        columns.output,
                        columns.error,
                        columns.completed_at,
                        columns.lease_token.is_(None),  # the tokens themselves differ
                    ).where(columns.execution_id == execution_id)
                ).one()
            )
            for execution_id, _ in made
        ]
    counts = run_counts(store.engine)
    hooks = [counts.get(f"ended {label}-{number}", 0) for number in range(len(made))]
    return [*rows, hooks]


def _expected(runs: list[Run], ends: list[End]) -> list[bool]:
    """The rule, independent of the SQL: which ends land (an open run, under its token or none,
    whose hook does not refuse it)."""
    open_ = [not run.ended for run in runs]
    landed = []
    for end in ends:
        lands = open_[end.run] and not end.stale and not runs[end.run].refused
        if lands:
            open_[end.run] = False
        landed.append(lands)
    return landed


@BUDGET
@given(runs=st.lists(RUN, min_size=RUNS, max_size=RUNS), ends=st.lists(END, max_size=8))
def test_ends_in_one_transaction_give_what_each_alone_gives(
    store: SqlWorkflowStore, runs: list[Run], ends: list[End]
) -> None:
    tag = next(_examples)
    alone_runs = _set_up(store, runs, f"alone-{tag}")
    grouped_runs = _set_up(store, runs, f"grouped-{tag}")
    alone = _alone(store, alone_runs, ends)
    grouped = _grouped(store, grouped_runs, ends)
    assert grouped == alone
    assert [isinstance(result, tuple) for result in grouped] == _expected(runs, ends)
    assert _rows(store, grouped_runs, f"grouped-{tag}") == _rows(store, alone_runs, f"alone-{tag}")


def test_ends_of_threads_at_once_each_get_their_own_result(store: SqlWorkflowStore) -> None:
    runs = [Run(number % 5 == 0, number % 4 == 1) for number in range(12)]
    made = _set_up(store, runs, "threads")
    results: dict[int, object] = {}
    barrier = threading.Barrier(len(made))

    def end(number: int, execution_id: str, token: str) -> None:
        barrier.wait()
        try:
            ended = store.finish(execution_id, S.COMPLETED, output=number, now=START, token=token)
            results[number] = None if ended is None else ended.output
        except RuntimeError as exc:
            results[number] = str(exc)

    threads = [threading.Thread(target=end, args=(n, *pair)) for n, pair in enumerate(made)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == {
        n: None if run.ended else f"the hook refuses threads-{n}" if run.refused else n
        for n, run in enumerate(runs)
    }
    # A refused end rolled back its hook's write; the others' committed with them.
    counts = run_counts(store.engine)
    assert [counts.get(f"ended threads-{n}", 0) for n in range(len(runs))] == [
        0 if run.ended or run.refused else 1 for run in runs
    ]


def test_the_hooks_of_a_grouped_end_run_in_its_callers_context(store: SqlWorkflowStore) -> None:
    seen: list[str] = []
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="none")

    def hook(conn: sa.Connection, execution: Execution) -> None:
        seen.append(marker.get())

    store.hooks.register(hook)
    made = _set_up(store, [Run(False, False)] * 2, "context")
    batch = []
    for number, (execution_id, token) in enumerate(made):
        marker.set(f"caller {number}")
        batch.append(_End(execution_id, S.FAILED, None, "no", START, token, contextvars.copy_context()))
    marker.set("writer")
    store._terminal._write_grouped(batch)
    assert sorted(seen) == ["caller 0", "caller 1"]  # in id order
