"""Completion triggers across workflow shards, on PostgreSQL shard databases.

Each test names the rule it checks: same-shard starts in the source's transaction, cross-shard
starts through the outbox (at least once, deduped at the target), the outbox's sweeper step under a
killed worker, a target shard that is down and two drainers at once, fire retention, and trigger
definitions on every shard.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_harvest import get_engine, signals, workflow_service
from flask_harvest._shard_set import ShardSet
from flask_harvest.shards import shard_for_key
from flask_harvest.sweeper import SweepError, SweepReport
from flask_harvest.triggers import CompletionTrigger
from flask_harvest.triggers._schema import fires_table, outbox_table, triggers_table
from flask_harvest.triggers.firing import FireEvent, FireOutcome, target_workflow_id
from flask_harvest.triggers.outbox import TriggerOutbox
from flask_harvest.triggers.sharded import ShardedTriggerStore
from flask_harvest.triggers.store import OutboxStart
from flask_harvest.workflows import ExecutionState, WorkflowRegistry, WorkflowRunner
from flask_harvest.workflows._schema import executions_table
from flask_harvest.workflows.sharded import ShardedWorkflowStore

from .shard_support import allow_connections, pg_shards, shard_database_names
from .workflow_app import AUTH, PREFIX, gate, make_workflow_app, wait_for, wait_in_step
from .workflow_support import Scheduled

__all__ = ["pg_shards"]

S = ExecutionState
ROOT = Path(__file__).resolve().parents[1]
#: Long enough for a loaded machine; the loops end as soon as their condition holds.
PATIENCE = 120.0


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _until(what: str, done: Callable[[], bool], *, every: float = 0.05) -> None:
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(every)
    raise AssertionError(f"never happened: {what}")


def _query(url: str, statement: Any) -> list[Any]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(statement).all())
    finally:
        engine.dispose()


def _runs_of(urls: list[str], workflow_id: str) -> list[str]:
    """Every run with ``workflow_id`` on every shard."""
    query = sa.select(executions_table.c.execution_id).where(executions_table.c.workflow_id == workflow_id)
    return [row.execution_id for url in urls for row in _query(url, query)]


def _outbox(urls: list[str]) -> list[Any]:
    return [row for url in urls for row in _query(url, sa.select(outbox_table))]


def _source_shard(execution_id: str) -> int:
    return int(execution_id.split("-", 1)[0][1:])


def _target_shard(trigger_id: str, execution_id: str, count: int = 3) -> int:
    return shard_for_key(target_workflow_id(trigger_id, execution_id), count)


def _sweep(app: Flask) -> SweepReport:
    """One sweep; a step another shard's outage failed still reports what the others did."""
    try:
        return get_engine(app).sweep()
    except SweepError as exc:
        return exc.report


@pytest.fixture
def fired() -> Iterator[list[FireEvent]]:
    events: list[FireEvent] = []

    def receiver(sender: Any, event: FireEvent, outcome: str) -> None:
        events.append(event)

    signals.completion_trigger_fired.connect(receiver)
    yield events
    signals.completion_trigger_fired.disconnect(receiver)


def _check_fire(
    app: Flask, urls: list[str], trigger: CompletionTrigger, source_id: str, fired: list[FireEvent]
) -> str:
    """Check how the completed source's target started; return ``same`` or ``cross``."""
    wid = target_workflow_id(trigger.id, source_id)
    target_shard = shard_for_key(wid, 3)
    source_shard = _source_shard(source_id)
    _until("the target started", lambda: bool(_runs_of(urls, wid)))
    _until("the outbox is empty", lambda: not _outbox(urls))

    def mine() -> list[FireOutcome]:
        return [e.outcome for e in list(fired) if e.source_exec_id == source_id]

    def named() -> str | None:
        rows = _query(urls[source_shard], sa.select(fires_table))
        found: str | None = next(row.target_execution_id for row in rows if row.source_exec_id == source_id)
        return found

    runs = _runs_of(urls, wid)
    assert len(runs) == 1
    if target_shard == source_shard:
        assert mine() == [FireOutcome.STARTED]
        assert runs[0].startswith(f"s{source_shard}-")
        assert named() == runs[0]  # written in the source's transaction
        kind = "same"
    else:
        _until("the start was reported", lambda: FireOutcome.STARTED in mine())
        assert mine() == [FireOutcome.DEFERRED, FireOutcome.STARTED]
        assert runs[0].startswith(f"s{target_shard}-")
        _until("the ledger row names the target", lambda: named() == runs[0])
        kind = "cross"
    wait_for(app, runs[0], lambda state, steps: state is S.COMPLETED)
    return kind


def test_same_shard_targets_start_in_the_transaction_and_others_through_the_outbox_once(
    pg_shards: list[str], fired: list[FireEvent]
) -> None:
    """Rules: same-shard in-transaction starts; cross-shard out-of-band starts (an outbox row
    written beside the fire, the start made after the commit, the row deleted); exactly one target
    run either way."""
    trigger = CompletionTrigger("echo", "three_steps")
    app = make_workflow_app(pg_shards[0], HARVEST_WORKFLOW_SHARDS=pg_shards, triggers=[trigger])
    seen = {"same": 0, "cross": 0}
    for i in range(64):
        if seen["same"] >= 2 and seen["cross"] >= 2:
            break
        with app.app_context():
            source = workflow_service().start("echo", {"n": i}, workflow_id=f"src-{i}")[0]
        wait_for(app, source.execution_id, lambda state, steps: state is S.COMPLETED)
        seen[_check_fire(app, pg_shards, trigger, source.execution_id, fired)] += 1
    assert seen["same"] >= 2 and seen["cross"] >= 2, seen
    # Nothing is left for the sweeper, which starts nothing again.
    report = _sweep(app)
    assert report.trigger_starts == 0 and report.trigger_starts_waiting == 0


# -- a worker killed between the source's commit and the target's start --------------------------

KILLED_WORKER = textwrap.dedent(
    """
    import json, os, signal, sys
    import sqlalchemy as sa
    from flask_harvest._shard_set import ShardSet
    from flask_harvest.jobs.base import JobBackend
    from flask_harvest.triggers.firing import TriggerFiring
    from flask_harvest.triggers.outbox import TriggerOutbox
    from flask_harvest.triggers.sharded import ShardedTriggerStore
    from flask_harvest.workflows import WorkflowRegistry, WorkflowRunner
    from flask_harvest.workflows.sharded import ShardedWorkflowStore

    class NoJobs(JobBackend):
        def enqueue(self, refs): pass
        def schedule(self, ref): pass
        def live_jobs(self, refs): return set()

    class KilledAfterCommit(TriggerOutbox):
        def deliver(self, shard, row_id):
            rows = self.store.on_shard(shard).engine.connect().exec_driver_sql(
                "SELECT count(*) FROM harvest_completion_trigger_outbox").scalar()
            print(f"committed with {rows} outbox row(s); killed before the target start", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    urls, execution_id = json.loads(sys.argv[1]), sys.argv[2]
    shards = ShardSet([sa.create_engine(url) for url in urls])
    store = ShardedWorkflowStore(shards)
    registry = WorkflowRegistry()
    registry.workflow("source")(lambda ctx, data: {"total": data["n"] * 2})
    registry.workflow("target")(lambda ctx, data: data)
    runner = WorkflowRunner(store, registry, NoJobs(), lease_seconds=1.0, heartbeat_interval=0)
    triggers = ShardedTriggerStore(shards)
    firing = TriggerFiring(
        triggers, runner.start, knows=registry.__contains__, max_chain_depth=16,
        max_input_bytes=10000, cross_shard=KilledAfterCommit(triggers, shards, runner.start),
    )
    store.hooks.register(firing)
    runner.run(execution_id)
    print("not killed", flush=True)
    """
)


class Deployment:
    """The workflow and trigger stores of the shards, built without Flask, and the outbox."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.shards = ShardSet([sa.create_engine(url) for url in urls])
        self.store = ShardedWorkflowStore(self.shards)
        self.store.ensure_schema()
        self.registry = WorkflowRegistry()
        self.registry.workflow("source")(lambda ctx, data: {"total": data["n"] * 2})
        self.registry.workflow("target")(lambda ctx, data: data)
        self.runner = WorkflowRunner(self.store, self.registry, Scheduled(), heartbeat_interval=0)
        self.triggers = ShardedTriggerStore(self.shards)
        self.triggers.ensure_schema()
        self.events: list[FireEvent] = []
        self.outbox = TriggerOutbox(
            self.triggers,
            self.shards,
            self.runner.start,
            listener=self.events.append,
            known=self.registry.names,
        )

    def close(self) -> None:
        for engine in self.shards.engines:
            engine.dispose()


@pytest.fixture
def deployment(pg_shards: list[str]) -> Iterator[Deployment]:
    built = Deployment(pg_shards)
    yield built
    built.close()


def test_a_worker_killed_after_the_source_commit_leaves_one_target_after_the_sweep(
    deployment: Deployment,
) -> None:
    """Rule: cross-shard delivery is at least once, deduped at the target: a worker killed between
    the source's commit and the target's start leaves the outbox row, and the sweeper's outbox step
    starts exactly one target run and empties the outbox."""
    d = deployment
    trigger = CompletionTrigger("source", "target")
    d.triggers.upsert(trigger, now=_now())
    # A source whose target routes to another shard (its execution id decides).
    for i in range(64):
        source = d.runner.start("source", {"n": i}, workflow_id=f"kill-{i}")[0]
        if _target_shard(trigger.id, source.execution_id) != _source_shard(source.execution_id):
            break
    else:
        raise AssertionError("no source in 64 had a target on another shard")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = subprocess.run(
        [sys.executable, "-c", KILLED_WORKER, json.dumps(d.urls), source.execution_id],
        capture_output=True,
        text=True,
        env=env,
        timeout=PATIENCE,
        check=False,
    )
    assert worker.returncode == -9, worker.stdout + worker.stderr
    assert "committed with 1 outbox row(s)" in worker.stdout
    ended = d.store.get(source.execution_id)
    assert ended is not None and ended.state is S.COMPLETED
    wid = target_workflow_id(trigger.id, source.execution_id)
    assert _runs_of(d.urls, wid) == []
    assert len(_outbox(d.urls)) == 1

    drained = d.outbox.enforce_completion_triggers_outbox()
    assert (drained.started, drained.left) == (1, 0)
    runs = _runs_of(d.urls, wid)
    assert len(runs) == 1 and _outbox(d.urls) == []
    assert [e.outcome for e in d.events] == [FireOutcome.STARTED]
    # Another sweep has nothing to do.
    assert d.outbox.enforce_completion_triggers_outbox().started == 0
    assert _runs_of(d.urls, wid) == runs


def _write_starts(
    d: Deployment, count: int, *, source_shard: int = 0, name: str = "target", first: int = 0
) -> list[OutboxStart]:
    """``count`` waiting cross-shard starts on ``source_shard`` (with their fire rows), as a source's
    terminal transaction writes them."""
    starts = []
    store = d.triggers.on_shard(source_shard)
    with store.db.transaction("write starts") as conn:
        for i in range(first, first + count):
            source_exec_id = f"s{source_shard}-{i:032x}"
            wid = target_workflow_id("t-1", source_exec_id)
            start = OutboxStart(
                source_exec_id=source_exec_id,
                trigger_id="t-1",
                target_shard=shard_for_key(wid, 3),
                target_workflow_name=name,
                target_workflow_id=wid,
                target_input=json.dumps({"i": i}),
                queue_name=None,
                concurrency_key=None,
                concurrency_limit=None,
                priority=None,
                max_workflow_input_bytes=10000,
                trigger_depth=1,
                created_at=_now(),
            )
            store.record_fire(conn, source_exec_id, "t-1", outcome=None, now=_now())
            store.write_outbox(conn, start)
            starts.append(start)
    return starts


def test_two_drainers_at_once_start_each_target_once(deployment: Deployment) -> None:
    """Rule: the outbox sweeper takes rows with FOR UPDATE SKIP LOCKED, so two drainers at once
    never take one row; with the deterministic workflow_id, each target has exactly one run."""
    d = deployment
    starts = _write_starts(d, 30)
    barrier = threading.Barrier(2)
    results: list[int] = []

    def drain() -> None:
        barrier.wait()
        results.append(d.outbox.enforce_completion_triggers_outbox().started)

    threads = [threading.Thread(target=drain) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(results) == len(starts)
    assert _outbox(d.urls) == []
    for start in starts:
        assert len(_runs_of(d.urls, start.target_workflow_id)) == 1
    outcomes = [e.outcome for e in d.events]
    assert outcomes == [FireOutcome.STARTED] * len(starts)


def test_a_repeated_start_of_an_ended_target_loads_it(deployment: Deployment) -> None:
    """Rule: a start the outbox repeats (its row's delete was lost) collapses into the one target
    run, even when that run has ended since (it is loaded, never started again)."""
    d = deployment
    [start] = _write_starts(d, 1)
    assert d.outbox.enforce_completion_triggers_outbox().started == 1
    [run] = _runs_of(d.urls, start.target_workflow_id)
    d.store.finish(run, S.COMPLETED, output=None, now=_now())
    with d.triggers.on_shard(0).db.transaction("write it again") as conn:
        d.triggers.write_outbox(conn, start)
    assert d.outbox.enforce_completion_triggers_outbox().started == 1
    assert _runs_of(d.urls, start.target_workflow_id) == [run]
    assert [e.outcome for e in d.events] == [FireOutcome.STARTED, FireOutcome.DEDUPED]
    assert _outbox(d.urls) == []


def test_a_fire_is_kept_while_its_start_waits_in_the_outbox(deployment: Deployment) -> None:
    """Rule: retention keeps a fire row while its outbox row exists or its source execution does."""
    d = deployment
    [start] = _write_starts(d, 1, source_shard=1)
    later = _now() + timedelta(days=1)
    assert d.triggers.purge_fires(before=later) == 0  # the start waits: the fire stays
    with d.triggers.on_shard(1).db.transaction("drop the start") as conn:
        conn.execute(sa.delete(outbox_table))
    assert d.triggers.purge_fires(before=later) == 1  # no source execution, no start: purged
    assert _query(d.urls[1], sa.select(fires_table)) == []
    assert start.source_exec_id.startswith("s1-")


# -- a target shard that is down --------------------------------------------------------------


def test_a_target_shard_down_for_30_seconds_gets_its_start_once_it_is_back(
    pg_shards: list[str],
) -> None:
    """Rule: cross-shard starts are at least once: with the target's shard refusing connections,
    the source still completes and its outbox row stays; runs on the other shards keep completing;
    once the shard is back the sweeper starts the target exactly once."""
    trigger = CompletionTrigger("gated", "echo")
    app = make_workflow_app(pg_shards[0], HARVEST_WORKFLOW_SHARDS=pg_shards, triggers=[trigger])
    names = shard_database_names()
    for i in range(64):
        name = f"down-{i}-{time.monotonic_ns()}"
        release = gate(name)
        with app.app_context():
            source = workflow_service().start("gated", {"gate": name}, workflow_id=f"down-{i}")[0]
        wait_in_step(name)
        source_shard = _source_shard(source.execution_id)
        target_shard = _target_shard(trigger.id, source.execution_id)
        if target_shard != source_shard:
            break
        release.set()
        wait_for(app, source.execution_id, lambda state, steps: state is S.COMPLETED)
    else:
        raise AssertionError("no source in 64 had a target on another shard")
    wid = target_workflow_id(trigger.id, source.execution_id)
    others = [k for k in range(3) if k != target_shard]
    allow_connections(names[target_shard], False)
    refused_at = time.monotonic()
    try:
        release.set()
        wait_for(app, source.execution_id, lambda state, steps: state is S.COMPLETED)
        waiting = _query(pg_shards[source_shard], sa.select(outbox_table))
        assert [row.target_workflow_id for row in waiting] == [wid]
        # Runs on the shards that are up keep completing while the target's shard is down.
        keys = [k for k in (f"meanwhile-{j}" for j in range(100)) if shard_for_key(k, 3) in others][:4]
        with app.app_context():
            meanwhile = [workflow_service().start("three_steps", 1, workflow_id=k)[0] for k in keys]
        for run in meanwhile:
            wait_for(app, run.execution_id, lambda state, steps: state is S.COMPLETED)
        while time.monotonic() - refused_at < 30:
            report = _sweep(app)
            assert report.trigger_starts == 0
            assert len(_query(pg_shards[source_shard], sa.select(outbox_table))) == 1
            time.sleep(1)
    finally:
        allow_connections(names[target_shard], True)
    started = 0

    def drained() -> bool:
        nonlocal started
        started += _sweep(app).trigger_starts
        return started > 0

    _until("the target started once its shard was back", drained, every=0.5)
    assert started == 1
    runs = _runs_of(pg_shards, wid)
    assert len(runs) == 1 and runs[0].startswith(f"s{target_shard}-")
    assert _outbox(pg_shards) == []
    wait_for(app, runs[0], lambda state, steps: state is S.COMPLETED)
    assert _sweep(app).trigger_starts == 0
    assert _runs_of(pg_shards, wid) == runs


# -- definitions on every shard ------------------------------------------------------------------


def _definitions(urls: list[str]) -> list[set[str]]:
    return [{row.id for row in _query(url, sa.select(triggers_table))} for url in urls]


def test_registration_reaches_every_shard_and_the_sweeper_repairs_one_that_was_down(
    pg_shards: list[str],
) -> None:
    """Rule: the admin API's registrations propagate to every shard; GET reads shard 0; a shard
    that was down during a registration or a deletion is made to match shard 0 by the sweeper."""
    app = make_workflow_app(pg_shards[0], HARVEST_WORKFLOW_SHARDS=pg_shards)
    client = app.test_client()

    def post(source: str, target: str) -> str:
        body = {"source_workflow_name": source, "target_workflow_name": target}
        response = client.post(f"{PREFIX}/admin/completion-triggers", json=body, headers=AUTH)
        assert response.status_code == 201, response.get_json()
        ident: str = response.get_json()["id"]
        return ident

    first = post("echo", "three_steps")
    assert _definitions(pg_shards) == [{first}] * 3
    names = shard_database_names()
    allow_connections(names[2], False)
    try:
        second = post("boom", "echo")  # shard 2 is skipped with a warning, not an error
        assert _definitions(pg_shards[:2]) == [{first, second}] * 2
        listed = client.get(f"{PREFIX}/admin/completion-triggers", headers=AUTH).get_json()
        assert {t["id"] for t in listed} == {first, second}
        assert client.delete(f"{PREFIX}/admin/completion-triggers/{first}", headers=AUTH).status_code == 204
        assert _definitions(pg_shards[:2]) == [{second}] * 2
    finally:
        allow_connections(names[2], True)
    assert _definitions(pg_shards)[2] == {first}  # what it held when it went down
    repaired = 0

    def repair() -> bool:
        nonlocal repaired
        repaired += _sweep(app).triggers_repaired
        return _definitions(pg_shards)[2] == {second}

    _until("shard 2 matches shard 0", repair, every=0.5)
    assert repaired == 2  # one written, one deleted
    assert _sweep(app).triggers_repaired == 0
    rows = [_query(url, sa.select(triggers_table)) for url in pg_shards]
    assert rows[2] == rows[0]  # every column, timestamps too


def test_starts_of_a_workflow_this_process_does_not_know_never_crowd_out_the_others(
    deployment: Deployment,
) -> None:
    """Rows whose target workflow no process here knows (a deployment rolling out) wait for one
    that does, and a drain's batch takes only the rows it can start."""
    d = deployment
    retired = _write_starts(d, 3, name="retired")
    known = _write_starts(d, 2, first=3)
    d.outbox.batch = 2
    drained = d.outbox.enforce_completion_triggers_outbox()
    assert drained.started == 2
    for start in known:
        assert len(_runs_of(d.urls, start.target_workflow_id)) == 1
    assert sorted(row.target_workflow_name for row in _outbox(d.urls)) == ["retired"] * len(retired)
