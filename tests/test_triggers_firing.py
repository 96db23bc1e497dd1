"""Completion triggers firing in the source's terminal transaction, on SQLite and PostgreSQL.

Exactly-once under double and concurrent re-evaluation, cancel vs terminate, condition_unmet and
condition_invalid, mapping refusals, chains and a cycle stopped at the depth cap, retention.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from flask_harvest.errors import InvalidFieldError
from flask_harvest.triggers import CompletionTrigger, Outcome, Passthrough, Projection, Static
from flask_harvest.triggers.conditions import Eq, GreaterThan
from flask_harvest.triggers.firing import (
    FireEvent,
    FireOutcome,
    SkipReason,
    TriggerFiring,
    target_workflow_id,
)
from flask_harvest.triggers.service import TriggerService
from flask_harvest.triggers.store import SqlTriggerStore
from flask_harvest.workflows import (
    Execution,
    ExecutionState,
    SqlWorkflowStore,
    WorkflowContext,
    WorkflowRegistry,
    WorkflowRunner,
)
from flask_harvest.workflows.service import WorkflowService

from .workflow_support import SQL_KINDS, Clock, Scheduled, workflow_store

S = ExecutionState


class Harness:
    """A runner, a trigger store and the firing hook on one database, with recorded events."""

    def __init__(
        self, store: SqlWorkflowStore, *, max_chain_depth: int = 16, max_input_bytes: int = 1000
    ) -> None:
        self.store = store
        self.registry = WorkflowRegistry()
        self.clock = Clock()
        self.scheduled = Scheduled()
        self.runner = WorkflowRunner(
            store,
            self.registry,
            self.scheduled,
            max_input_bytes=max_input_bytes,
            heartbeat_interval=0,
            clock=self.clock,
        )
        store.on_started = self.runner.schedule_started
        self.triggers = SqlTriggerStore(store.engine)
        self.triggers.ensure_schema()
        self.events: list[FireEvent] = []
        self.firing = TriggerFiring(
            self.triggers,
            self.runner.start,
            knows=self.registry.__contains__,
            max_chain_depth=max_chain_depth,
            max_input_bytes=max_input_bytes,
            listener=self.events.append,
            clock=self.clock,
        )
        store.hooks.register(self.firing)
        workflows = WorkflowService(store, self.registry, self.runner, store.hooks)
        self.service = TriggerService(self.triggers, self.firing, workflows, clock=self.clock)
        self.inputs: dict[str, list[Any]] = {}

        for name in ("etl_ingest", "daily_report", "on_failure", "a", "b", "c"):
            self.recording(name)

    def recording(self, name: str, output: Any = None) -> None:
        """Register ``name`` as a workflow that records its input and returns ``output`` (or its input)."""

        def fn(ctx: WorkflowContext, data: Any) -> Any:
            self.inputs.setdefault(name, []).append(data)
            return data if output is None else output

        self.registry.workflow(name)(fn)

    def register(self, trigger: CompletionTrigger, **options: bool) -> CompletionTrigger:
        return self.service.register(trigger, **options)

    def run(self, name: str, data: Any = None) -> Execution:
        execution, _ = self.runner.start(name, data)
        self.scheduled.calls.remove((execution.execution_id, None))
        ended = self.runner.run(execution.execution_id)
        assert ended is not None
        return ended

    def drain(self) -> None:
        """Run every scheduled execution (and what their triggers start) until none is left."""
        while self.scheduled.calls:
            execution_id, _ = self.scheduled.calls.pop(0)
            self.runner.run(execution_id)

    def executions(self, name: str) -> list[Execution]:
        return self.store.list_executions(name=name)

    def outcomes(self) -> list[str]:
        return [e.outcome.value for e in self.events]


@pytest.fixture(params=SQL_KINDS)
def make(request: pytest.FixtureRequest) -> Iterator[Callable[..., Harness]]:
    """Builds harnesses on the database of the test's parameter."""
    made: list[Harness] = []

    def build(**options: Any) -> Harness:
        made.append(Harness(workflow_store(request, request.param), **options))
        return made[-1]

    yield build
    for harness in made:
        harness.firing.close()


@pytest.fixture
def h(make: Callable[..., Harness]) -> Harness:
    return make()


def test_a_completed_source_starts_its_target_with_the_projected_input(h: Harness) -> None:
    trigger = h.register(CompletionTrigger("etl_ingest", "daily_report", input_mapping=Projection("summary")))
    source = h.run("etl_ingest", {"summary": {"rows": 12000, "date": "2026-06-24"}, "raw": [1, 2]})
    [target] = h.executions("daily_report")
    assert target.workflow_id == f"completion-trigger-{trigger.id}-{source.execution_id}"
    assert target.workflow_id == target_workflow_id(trigger.id, source.execution_id)
    assert target.input == {"rows": 12000, "date": "2026-06-24"}
    assert target.trigger_depth == 1
    # Queued after commit, through the store's on_started.
    assert h.scheduled.calls == [(target.execution_id, None)]
    h.drain()
    assert h.inputs["daily_report"] == [{"rows": 12000, "date": "2026-06-24"}]
    [fire] = h.service.fires(trigger_id=trigger.id)
    assert (fire.source_exec_id, fire.outcome, fire.target_execution_id) == (
        source.execution_id,
        None,
        target.execution_id,
    )
    assert h.outcomes() == ["started"]
    assert h.firing.counters.fires["started"] == 1


def test_a_failed_source_starts_nothing_for_a_completed_trigger(h: Harness) -> None:
    h.register(CompletionTrigger("etl_ingest", "daily_report"))

    def boom(ctx: WorkflowContext, data: Any) -> Any:
        raise ValueError("disk full")

    h.registry._definitions.pop("etl_ingest")
    h.registry.workflow("etl_ingest")(boom)
    source = h.run("etl_ingest", {})
    assert source.state is S.FAILED
    assert h.executions("daily_report") == []
    assert h.service.fires() == []


def test_failure_routing_with_the_outcome_envelope(h: Harness) -> None:
    h.register(
        CompletionTrigger("etl_ingest", "on_failure", terminal_states=["Failed"], input_mapping=Outcome())
    )

    def boom(ctx: WorkflowContext, data: Any) -> Any:
        raise ValueError("disk full")

    h.registry._definitions.pop("etl_ingest")
    h.registry.workflow("etl_ingest")(boom)
    source = h.run("etl_ingest", {"x": 1})
    [target] = h.executions("on_failure")
    assert target.input == {
        "terminal_state": "FAILED",
        "source_exec_id": source.execution_id,
        "source_workflow_id": source.workflow_id,
        "source_workflow_name": "etl_ingest",
        "output": None,
        "error": "ValueError: disk full",
    }


def test_cancel_never_matches_terminated_and_terminate_never_matches_cancelled(h: Harness) -> None:
    on_cancel = h.register(
        CompletionTrigger("a", "b", terminal_states=["Cancelled"], input_mapping=Outcome("error"))
    )
    on_terminate = h.register(
        CompletionTrigger("a", "c", terminal_states=["Terminated"], input_mapping=Outcome("terminal_state"))
    )
    cancelled, _ = h.runner.start("a", {})
    h.store.request_cancel(cancelled.execution_id, "not needed", now=h.clock())
    terminated, _ = h.runner.start("a", {})
    h.store.terminate(terminated.execution_id, "stuck", now=h.clock())
    [b] = h.executions("b")
    [c] = h.executions("c")
    assert b.workflow_id == target_workflow_id(on_cancel.id, cancelled.execution_id)
    assert b.input == "not needed"
    assert c.workflow_id == target_workflow_id(on_terminate.id, terminated.execution_id)
    assert c.input == "TERMINATED"


def test_a_cancel_without_a_reason_has_a_null_error_in_the_envelope(h: Harness) -> None:
    # The seed: ``error`` carries the cancel reason only "when one was recorded".
    h.register(CompletionTrigger("a", "b", terminal_states=["Cancelled"], input_mapping=Outcome("error")))
    cancelled, _ = h.runner.start("a", {})
    h.store.request_cancel(cancelled.execution_id, None, now=h.clock())
    [b] = h.executions("b")
    assert b.input is None


def test_re_evaluating_twice_starts_exactly_one_target(h: Harness) -> None:
    trigger = h.register(CompletionTrigger("a", "b"))
    source = h.run("a", {"n": 1})
    assert h.service.evaluate(source.execution_id)[0].outcome is FireOutcome.DEDUPED
    assert h.service.evaluate(source.execution_id)[0].outcome is FireOutcome.DEDUPED
    assert len(h.executions("b")) == 1
    assert len(h.service.fires(trigger_id=trigger.id)) == 1
    assert h.outcomes() == ["started", "deduped", "deduped"]


def test_a_lost_ledger_row_still_collapses_on_the_deterministic_workflow_id(h: Harness) -> None:
    h.register(CompletionTrigger("a", "b"))
    source = h.run("a", {"n": 1})
    with h.store.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM harvest_completion_trigger_fires"))
    [event] = h.service.evaluate(source.execution_id)
    # The target is still open: start-or-load returns it rather than starting a second run.
    assert event.outcome is FireOutcome.DEDUPED
    assert len(h.executions("b")) == 1


def test_concurrent_re_evaluation_starts_exactly_one_target(h: Harness) -> None:
    trigger = h.register(CompletionTrigger("a", "b"))
    source, _ = h.runner.start("a", {"n": 1})
    # End the source with no trigger registered yet being seen: remove the ledger path by
    # registering afterwards is not possible, so end it through a store with no hooks.
    bare = SqlWorkflowStore(h.store.engine)
    bare.finish(source.execution_id, S.COMPLETED, output={"n": 1}, now=h.clock())
    assert h.executions("b") == []
    results: list[list[FireEvent]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def evaluate() -> None:
        try:
            barrier.wait()
            results.append(h.service.evaluate(source.execution_id))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=evaluate) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    outcomes = sorted(events[0].outcome.value for events in results)
    assert outcomes == ["deduped"] * 7 + ["started"]
    assert len(h.executions("b")) == 1
    assert len(h.service.fires(trigger_id=trigger.id)) == 1


def test_an_unmet_condition_records_the_skip_so_a_loosened_condition_never_late_fires(h: Harness) -> None:
    trigger = h.register(CompletionTrigger("a", "b", condition=GreaterThan("amount", 1000)))
    small = h.run("a", {"amount": 10})
    big = h.run("a", {"amount": 5000})
    assert [e.input for e in h.executions("b")] == [{"amount": 5000}]
    fires = {f.source_exec_id: f.outcome for f in h.service.fires(trigger_id=trigger.id)}
    assert fires == {small.execution_id: "condition_unmet", big.execution_id: None}
    assert h.firing.counters.skipped[(trigger.id, "condition_unmet")] == 1
    assert h.outcomes() == ["skipped", "started"]
    # Loosen the condition and re-evaluate: the skipped pair stays decided.
    h.register(CompletionTrigger("a", "b", condition=GreaterThan("amount", 0), id=trigger.id))
    [event] = h.service.evaluate(small.execution_id)
    assert event.outcome is FireOutcome.DEDUPED
    assert len(h.executions("b")) == 1


def test_a_corrupt_stored_condition_fails_closed(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    trigger = h.register(CompletionTrigger("a", "b", condition=Eq("region", "EU")))
    with h.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE harvest_completion_triggers SET condition = :c WHERE id = :id"),
            {
                "c": json.dumps({"type": "Matches", "data": {"path": "region", "value": ".*"}}),
                "id": trigger.id,
            },
        )
    source = h.run("a", {"region": "EU"})
    assert source.state is S.COMPLETED
    assert h.executions("b") == []
    assert h.service.fires() == []
    [event] = h.events
    assert (event.outcome, event.reason) == (FireOutcome.SKIPPED, SkipReason.CONDITION_INVALID)
    assert h.firing.counters.skipped[(trigger.id, "condition_invalid")] == 1
    warning = [r.getMessage() for r in caplog.records if "condition_invalid" in r.getMessage()]
    assert warning and trigger.id in warning[0] and source.execution_id in warning[0]
    # The pair was left undecided: once the condition is repaired, a re-evaluation fires it.
    h.register(CompletionTrigger("a", "b", condition=Eq("region", "EU"), id=trigger.id))
    assert h.service.evaluate(source.execution_id)[0].outcome is FireOutcome.STARTED
    assert len(h.executions("b")) == 1


def test_not_json_in_the_condition_column_fails_closed_too(h: Harness) -> None:
    trigger = h.register(CompletionTrigger("a", "b", condition=Eq("region", "EU")))
    with h.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE harvest_completion_triggers SET condition = '{not json' WHERE id = :id"),
            {"id": trigger.id},
        )
    assert h.run("a", {"region": "EU"}).state is S.COMPLETED
    assert h.executions("b") == []
    assert [e.reason for e in h.events] == [SkipReason.CONDITION_INVALID]


def test_a_mapped_input_over_the_limit_is_not_started(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    trigger = h.register(CompletionTrigger("a", "b", input_mapping=Static({"blob": "x" * 2000})))
    source = h.run("a", {})
    assert source.state is S.COMPLETED
    assert h.executions("b") == []
    [fire] = h.service.fires()  # the failed start is in the ledger, for operators to see
    assert (fire.outcome, fire.failed_start, fire.target_execution_id) == ("payload_too_large", True, None)
    assert h.outcomes() == ["payload_too_large"]
    assert any(trigger.id in r.getMessage() and "bytes" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("field", ["source_workflow_name", "target_workflow_name"])
def test_registration_refuses_a_workflow_name_that_is_not_registered(h: Harness, field: str) -> None:
    names = {"source_workflow_name": "a", "target_workflow_name": "b", field: "not_registered"}
    with pytest.raises(InvalidFieldError) as refused:
        h.register(CompletionTrigger(names["source_workflow_name"], names["target_workflow_name"]))
    assert refused.value.field == field
    assert "'not_registered'" in refused.value.message and "a, b, c" in refused.value.message
    assert h.service.list_triggers() == []


def test_an_unknown_target_is_validation_failed_in_the_ledger_until_it_can_start(h: Harness) -> None:
    trigger = h.register(CompletionTrigger("a", "not_registered"), allow_unknown_workflows=True)
    source = h.run("a", {})
    assert source.state is S.COMPLETED
    assert h.outcomes() == ["validation_failed"]
    [fire] = h.service.fires()
    assert (fire.trigger_id, fire.source_exec_id) == (trigger.id, source.execution_id)
    assert (fire.outcome, fire.failed_start, fire.target_execution_id) == ("validation_failed", True, None)
    # Evaluated again while the target is still unknown: the same row, still failed.
    assert [e.outcome.value for e in h.service.evaluate(source.execution_id)] == ["validation_failed"]
    assert [f.outcome for f in h.service.fires()] == ["validation_failed"]
    # Once this process knows the target, an evaluation takes the row over and starts it.
    h.recording("not_registered")
    [started] = h.service.evaluate(source.execution_id)
    assert started.outcome is FireOutcome.STARTED
    [fire] = h.service.fires()
    assert (fire.outcome, fire.target_execution_id) == (None, started.target_execution_id)
    assert [e.outcome.value for e in h.service.evaluate(source.execution_id)] == ["deduped"]


def test_a_three_stage_chain(h: Harness) -> None:
    h.register(CompletionTrigger("a", "b", input_mapping=Passthrough()))
    h.register(CompletionTrigger("b", "c", input_mapping=Projection("n")))
    h.run("a", {"n": 7})
    h.drain()
    [b] = h.executions("b")
    [c] = h.executions("c")
    assert (b.trigger_depth, c.trigger_depth) == (1, 2)
    assert c.input == 7
    assert c.state is S.COMPLETED


def test_a_cycle_stops_at_the_chain_depth_cap(make: Callable[..., Harness]) -> None:
    h = make(max_chain_depth=5)
    h.register(CompletionTrigger("a", "b"))
    h.register(CompletionTrigger("b", "a"))
    h.run("a", {"n": 1})
    h.drain()
    runs = h.executions("a") + h.executions("b")
    assert len(runs) == 6  # depths 0 to 5
    assert max(e.trigger_depth for e in runs) == 5
    assert h.outcomes() == ["started"] * 5 + ["chain_depth_exceeded"]
    assert [f.outcome for f in h.service.fires() if f.outcome] == ["chain_depth_exceeded"]


def test_a_rolled_back_terminal_transition_reports_nothing(h: Harness) -> None:
    h.register(CompletionTrigger("a", "b"))
    source, _ = h.runner.start("a", {})

    def fail(conn: sa.Connection, execution: Execution) -> None:
        raise RuntimeError("a later hook failed")

    h.store.hooks.register(fail)
    with pytest.raises(RuntimeError):
        h.store.finish(source.execution_id, S.COMPLETED, output={}, now=h.clock())
    assert h.events == []
    assert h.executions("b") == []
    assert h.service.fires() == []


def test_retention_purges_old_fires_of_gone_sources_only(h: Harness) -> None:
    h.register(CompletionTrigger("a", "b"))
    kept = h.run("a", {})
    gone = h.run("a", {})
    with h.store.engine.begin() as conn:
        conn.execute(
            sa.text("DELETE FROM harvest_workflow_executions WHERE execution_id = :id"),
            {"id": gone.execution_id},
        )
    assert h.service.purge_fires() == 0  # no horizon: nothing is purged
    h.service.retention_seconds = 60
    assert h.service.purge_fires() == 0  # not old enough yet
    h.clock.advance(seconds=61)
    assert h.service.purge_fires() == 1
    assert [f.source_exec_id for f in h.service.fires()] == [kept.execution_id]


def test_deleting_a_trigger_deletes_its_fires(h: Harness) -> None:
    trigger = h.register(CompletionTrigger("a", "b"))
    h.run("a", {})
    h.service.delete(trigger.id)
    assert h.service.fires() == []
    assert h.service.list_triggers() == []


def test_a_corrupt_mapping_is_validation_failed_only_for_matching_states(h: Harness) -> None:
    trigger = h.register(CompletionTrigger("a", "b", terminal_states=["Completed"]))
    with h.store.engine.begin() as conn:
        conn.execute(
            sa.text(
                'UPDATE harvest_completion_triggers SET input_mapping = \'{"type": "Copy"}\' WHERE id = :id'
            ),
            {"id": trigger.id},
        )
    cancelled, _ = h.runner.start("a", {})
    h.store.request_cancel(cancelled.execution_id, None, now=h.clock())
    assert h.events == []
    assert h.run("a", {}).state is S.COMPLETED
    assert h.outcomes() == ["validation_failed"]
    assert h.executions("b") == []
    assert h.service.fires() == []


def test_a_stored_row_with_text_that_is_not_unicode_never_wedges_the_source(h: Harness) -> None:
    # Rows written by hand (or another build) whose JSON escapes decode to lone surrogates: the
    # mapping cannot be encoded as the target's input, the condition's path is not a path.
    mapped = h.register(CompletionTrigger("a", "b", input_mapping=Static("ok")))
    guarded = h.register(CompletionTrigger("a", "c", condition=Eq("region", "EU")))
    with h.store.engine.begin() as conn:
        update = sa.text("UPDATE harvest_completion_triggers SET {} = :v WHERE id = :id")
        conn.execute(
            sa.text(str(update).format("input_mapping")),
            {"v": '{"type": "Static", "data": "\\ud800"}', "id": mapped.id},
        )
        conn.execute(
            sa.text(str(update).format("condition")),
            {"v": '{"type": "Eq", "data": {"path": "\\udfff", "value": 1}}', "id": guarded.id},
        )
    source = h.run("a", {"region": "EU"})
    assert source.state is S.COMPLETED
    assert h.executions("b") == [] and h.executions("c") == []
    assert sorted(h.outcomes()) == ["skipped", "validation_failed"]
    assert h.service.fires() == []
