"""The workflow service and handles on SQLite and PostgreSQL: start with a policy by name, status,
``result()`` for every ending (and while open), listing with filters and cursors."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from flask_harvest.errors import InvalidFieldError
from flask_harvest.workflows import (
    ExecutionNotFoundError,
    ExecutionState,
    UnknownWorkflowError,
    WorkflowContext,
    WorkflowIdReusedError,
)
from flask_harvest.workflows.hooks import TerminalHooks
from flask_harvest.workflows.service import WorkflowFailedError, WorkflowService

from .test_workflows_runner import Harness
from .workflow_support import SQL_KINDS, workflow_store

S = ExecutionState


@pytest.fixture(params=SQL_KINDS)
def h(request: pytest.FixtureRequest) -> Harness:
    harness = Harness(workflow_store(request, request.param))
    harness.registry.workflow("double")(lambda ctx, value: value * 2)

    def boom(ctx: WorkflowContext, value: Any) -> Any:
        raise ValueError("no refunds on Sundays")

    harness.registry.workflow("boom")(boom)
    return harness


def service(h: Harness) -> WorkflowService:
    return WorkflowService(h.store, h.registry, h.runner, TerminalHooks())


def test_result_returns_the_output_once_completed(h: Harness) -> None:
    handle, created = service(h).start("double", 21, workflow_id="order-1")
    assert created and handle.workflow_id == "order-1"
    assert handle.status() is S.PENDING
    h.runner.run(handle.execution_id)
    assert handle.status() is S.COMPLETED
    assert handle.result(timeout=0) == 42


def test_result_while_open_raises_timeout_error(h: Harness) -> None:
    handle, _ = service(h).start("double", 1)
    with pytest.raises(TimeoutError, match="still Pending"):
        handle.result(timeout=0)


def test_result_without_a_timeout_waits_until_the_run_ends(h: Harness) -> None:
    handle, _ = service(h).start("double", 5)
    ran = threading.Event()

    def finish_later() -> None:
        ran.wait()
        h.runner.run(handle.execution_id)

    worker = threading.Thread(target=finish_later)
    worker.start()
    try:
        ran.set()
        assert handle.result(timeout=None) == 10
    finally:
        worker.join()


@pytest.mark.parametrize("ending", ["failed", "cancelled", "terminated"])
def test_result_raises_workflow_failed_for_every_other_ending(h: Harness, ending: str) -> None:
    svc = service(h)
    handle, _ = svc.start("boom" if ending == "failed" else "double", 1)
    if ending == "failed":
        h.runner.run(handle.execution_id)
    elif ending == "cancelled":
        handle.cancel("customer withdrew")
    else:
        handle.terminate("operator stop")
    with pytest.raises(WorkflowFailedError) as caught:
        handle.result(timeout=0)
    expected = {
        "failed": (S.FAILED, "ValueError: no refunds on Sundays"),
        "cancelled": (S.CANCELLED, "customer withdrew"),
        "terminated": (S.TERMINATED, "operator stop"),
    }[ending]
    assert (caught.value.execution.state, caught.value.execution.error) == expected


def test_start_takes_the_policy_by_name_and_refuses_unknown_ones(h: Harness) -> None:
    svc = service(h)
    first, _ = svc.start("double", 1, workflow_id="k")
    h.runner.run(first.execution_id)
    with pytest.raises(WorkflowIdReusedError):
        svc.start("double", 1, workflow_id="k", policy="AllowDuplicateFailedOnly")
    with pytest.raises(InvalidFieldError) as caught:
        svc.start("double", 1, workflow_id="k", policy="TerminateIfRunning")
    assert caught.value.field == "policy"
    with pytest.raises(UnknownWorkflowError):
        svc.start("nope", 1)


def test_listing_filters_and_pages_with_opaque_cursors(h: Harness) -> None:
    svc = service(h)
    started = []
    for n in range(5):
        h.clock.advance(seconds=1)
        handle, _ = svc.start("double" if n % 2 else "boom", n)
        started.append(handle.execution_id)
    seen: list[str] = []
    cursor = None
    while True:
        page, cursor = svc.list_executions(cursor=cursor, limit=2)
        seen.extend(e.execution_id for e in page)
        if cursor is None:
            break
    assert seen == started[::-1]
    doubles, _ = svc.list_executions(name="double")
    assert [e.execution_id for e in doubles] == [started[3], started[1]]
    pending, _ = svc.list_executions(state="Pending", limit=500)
    assert len(pending) == 5
    for bad in ({"state": "Done"}, {"cursor": "not-a-cursor"}, {"limit": 0}, {"limit": 501}):
        with pytest.raises(InvalidFieldError):
            svc.list_executions(**bad)


def test_unknown_execution_ids_are_not_found(h: Harness) -> None:
    svc = service(h)
    for unknown in ("", "0" * 36, "x" * 1000):
        with pytest.raises(ExecutionNotFoundError):
            svc.get(unknown)
        with pytest.raises(ExecutionNotFoundError):
            svc.steps(unknown)


# -- Temporal's id reuse semantics: the LAST closed run decides ------------------------------------


def test_allow_duplicate_failed_only_looks_at_the_last_run_only(h: Harness) -> None:
    svc = service(h)
    completed, _ = svc.start("double", 1, workflow_id="k")
    h.runner.run(completed.execution_id)
    h.clock.advance(seconds=1)
    failed, _ = svc.start("boom", 1, workflow_id="k")  # AllowDuplicate
    h.runner.run(failed.execution_id)
    h.clock.advance(seconds=1)
    # The last run failed: allowed, although an earlier one completed (as in Temporal).
    third, created = svc.start("double", 2, workflow_id="k", policy="AllowDuplicateFailedOnly")
    assert created and third.execution_id not in (completed.execution_id, failed.execution_id)
    h.runner.run(third.execution_id)
    h.clock.advance(seconds=1)
    with pytest.raises(WorkflowIdReusedError) as caught:
        svc.start("double", 3, workflow_id="k", policy="AllowDuplicateFailedOnly")
    assert caught.value.previous_execution_id == third.execution_id


# -- ctx.sleep's argument ----------------------------------------------------------------------------


@pytest.mark.parametrize("duration", [float("nan"), float("inf"), -1, True, "5", 10**12])
def test_a_sleep_of_no_sensible_duration_fails_the_run_with_a_clear_error(h: Harness, duration: Any) -> None:
    def nap(ctx: WorkflowContext, value: Any) -> Any:
        ctx.sleep(duration)
        return "woke"

    h.registry.workflow("nap")(nap)
    handle, _ = service(h).start("nap", None)
    done = h.runner.run(handle.execution_id)
    assert done is not None and done.state is S.FAILED
    assert done.error is not None and done.error.startswith("InvalidFieldError: duration")
    assert h.store.list_steps(handle.execution_id) == []
