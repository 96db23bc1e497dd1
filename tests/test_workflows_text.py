"""Text the database cannot store never reaches it as a driver error: names, ids, reasons, inputs,
step results and error messages with NUL characters, lone surrogates or absurd nesting are refused
as bad input (or, for what the engine writes itself, stored in a form the database accepts), on
SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from flask_harvest.errors import ConfigurationError, InvalidFieldError
from flask_harvest.workflows import (
    ExecutionNotFoundError,
    ExecutionState,
    SqlWorkflowStore,
    StepFailedError,
    UnknownWorkflowError,
    WorkflowContext,
    WorkflowRegistry,
)
from flask_harvest.workflows.hooks import TerminalHooks
from flask_harvest.workflows.models import encode_json
from flask_harvest.workflows.service import WorkflowService

from .test_workflows_runner import Harness
from .workflow_support import SQL_KINDS, START, SimulatedCrash, workflow_store

S = ExecutionState
BAD_TEXT = ["a\x00b", "a\ud800b", "\udc80"]
UNSTORABLE = ["a\ud800b", "\udc80"]


@pytest.fixture(params=SQL_KINDS)
def h(request: pytest.FixtureRequest) -> Harness:
    return Harness(workflow_store(request, request.param))


def service(h: Harness) -> WorkflowService:
    return WorkflowService(h.store, h.registry, h.runner, TerminalHooks())


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


# -- inputs and outputs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "\ud800",
        {"\udc80": 1},
        ["ok", {"k": "x\udfff"}],
        nested(5000),
        nested(200),
    ],
    ids=["lone-surrogate", "surrogate-key", "nested-surrogate", "nested-5000", "nested-200"],
)
def test_an_input_that_is_not_storable_json_is_refused_and_nothing_is_stored(h: Harness, value: Any) -> None:
    h.registry.workflow("echo")(lambda ctx, value: value)
    with pytest.raises(InvalidFieldError) as caught:
        h.runner.start("echo", value)
    assert caught.value.field == "input"
    assert h.store.list_executions() == []


def test_encode_json_refuses_depth_with_the_projects_depth_message() -> None:
    with pytest.raises(InvalidFieldError, match="nested too deeply"):
        encode_json(nested(5000), field="input")
    # NUL inside a JSON string is escaped in the text, so it is storable and comes back equal.
    assert encode_json({"a": "x\x00y"}, field="input") == '{"a":"x\\u0000y"}'


def test_a_step_result_with_a_lone_surrogate_fails_the_step_not_the_database(h: Harness) -> None:
    @h.registry.workflow("bad_result")
    def bad_result(ctx: WorkflowContext, value: Any) -> Any:
        try:
            ctx.step("make", lambda: "\ud800")
        except StepFailedError as exc:
            return exc.message
        return "unreachable"

    execution, _ = h.runner.start("bad_result", None)
    done = h.runner.run(execution.execution_id)
    assert done is not None and done.state is S.COMPLETED
    assert "InvalidFieldError" in done.output and "surrogate" in done.output
    [step] = h.store.list_steps(execution.execution_id)
    assert step.error == done.output


def test_an_output_with_a_lone_surrogate_fails_the_run(h: Harness) -> None:
    h.registry.workflow("bad_output")(lambda ctx, value: {"x": "\udc00"})
    execution, _ = h.runner.start("bad_output", None)
    done = h.runner.run(execution.execution_id)
    assert done is not None and done.state is S.FAILED
    assert done.error is not None and "surrogate" in done.error


# -- error messages the engine writes itself ------------------------------------------------------


@pytest.mark.parametrize("message", BAD_TEXT)
def test_a_step_error_with_unstorable_text_is_checkpointed_and_replayed_the_same(
    h: Harness, message: str
) -> None:
    crash = {"armed": True}
    seen: list[str] = []

    def charge() -> None:
        raise ValueError(message)

    def after() -> str:
        if crash.pop("armed", False):
            raise SimulatedCrash
        return "after"

    @h.registry.workflow("declined")
    def declined(ctx: WorkflowContext, value: Any) -> Any:
        try:
            ctx.step("charge", charge)
        except StepFailedError as exc:
            seen.append(exc.message)
        return [seen[-1], ctx.step("after", after)]

    execution, _ = h.runner.start("declined", None)
    with pytest.raises(SimulatedCrash):
        h.runner.run(execution.execution_id)
    h.recover()
    done = h.runner.run(execution.execution_id)
    assert done is not None and done.state is S.COMPLETED
    # The first run and the replay saw the same error, and it is storable text.
    assert seen[0] == seen[1]
    assert "\x00" not in seen[0]
    seen[0].encode("utf-8")
    assert seen[0].startswith("ValueError: a") or seen[0].startswith("ValueError: ")
    [step, _after] = h.store.list_steps(execution.execution_id)
    assert step.error == seen[0]


@pytest.mark.parametrize("message", BAD_TEXT)
def test_a_workflow_error_with_unstorable_text_ends_the_run_failed(h: Harness, message: str) -> None:
    def boom(ctx: WorkflowContext, value: Any) -> Any:
        raise RuntimeError(message)

    h.registry.workflow("boom")(boom)
    execution, _ = h.runner.start("boom", None)
    done = h.runner.run(execution.execution_id)
    assert done is not None and done.state is S.FAILED
    assert done.error is not None and done.error.startswith("RuntimeError: ")
    assert "\x00" not in done.error
    done.error.encode("utf-8")


def test_an_exception_whose_str_raises_still_fails_the_run(h: Harness) -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    def boom(ctx: WorkflowContext, value: Any) -> Any:
        ctx.step("step", lambda: (_ for _ in ()).throw(Unprintable()))
        return None

    h.registry.workflow("unprintable")(boom)
    execution, _ = h.runner.start("unprintable", None)
    done = h.runner.run(execution.execution_id)
    assert done is not None and done.state is S.FAILED
    assert done.error is not None and "Unprintable" in done.error


# -- names, ids and reasons from callers ----------------------------------------------------------


@pytest.mark.parametrize("workflow_id", BAD_TEXT)
def test_a_workflow_id_with_unstorable_text_is_refused(h: Harness, workflow_id: str) -> None:
    h.registry.workflow("echo")(lambda ctx, value: value)
    with pytest.raises(InvalidFieldError) as caught:
        h.runner.start("echo", 1, workflow_id=workflow_id)
    assert caught.value.field == "workflow_id"
    assert h.store.list_executions() == []


@pytest.mark.parametrize("name", BAD_TEXT)
def test_the_store_refuses_a_name_with_unstorable_text(h: Harness, name: str) -> None:
    with pytest.raises(InvalidFieldError) as caught:
        h.store.start(name, 1, now=START)
    assert caught.value.field == "name"


@pytest.mark.parametrize("name", BAD_TEXT)
def test_the_registry_refuses_a_name_with_unstorable_text(name: str) -> None:
    with pytest.raises(ConfigurationError):
        WorkflowRegistry().workflow(name)


@pytest.mark.parametrize("name", [["a"], {"a": 1}, None, 3])
def test_an_unhashable_or_non_text_name_is_unknown(h: Harness, name: Any) -> None:
    with pytest.raises(UnknownWorkflowError):
        service(h).start(name, 1)


@pytest.mark.parametrize("execution_id", BAD_TEXT)
def test_an_id_with_unstorable_text_is_simply_unknown(h: Harness, execution_id: str) -> None:
    svc = service(h)
    with pytest.raises(ExecutionNotFoundError):
        svc.get(execution_id)
    with pytest.raises(ExecutionNotFoundError):
        svc.cancel(execution_id)
    with pytest.raises(ExecutionNotFoundError):
        svc.terminate(execution_id)


@pytest.mark.parametrize("name", BAD_TEXT)
def test_a_listing_filter_with_unstorable_text_is_refused(h: Harness, name: str) -> None:
    with pytest.raises(InvalidFieldError) as caught:
        service(h).list_executions(name=name)
    assert caught.value.field == "name"


@pytest.mark.parametrize("reason", BAD_TEXT)
@pytest.mark.parametrize("action", ["cancel", "terminate"])
def test_a_reason_with_unstorable_text_is_refused_and_changes_nothing(
    h: Harness, reason: str, action: str
) -> None:
    h.registry.workflow("echo")(lambda ctx, value: value)
    execution, _ = h.runner.start("echo", 1)
    svc = service(h)
    with pytest.raises(InvalidFieldError) as caught:
        getattr(svc, action)(execution.execution_id, reason)
    assert caught.value.field == "reason"
    with pytest.raises(InvalidFieldError):
        getattr(h.store, "request_cancel" if action == "cancel" else "terminate")(
            execution.execution_id, reason, now=START
        )
    assert h.store.get(execution.execution_id) == execution


def test_store_get_of_an_unstorable_id_is_none(h: Harness) -> None:
    store: SqlWorkflowStore = h.store
    for bad in BAD_TEXT:
        assert store.get(bad) is None
        assert store.list_steps(bad) == []


@pytest.mark.parametrize("name", BAD_TEXT)
def test_a_step_name_with_unstorable_text_is_refused_in_the_workflow(h: Harness, name: str) -> None:
    @h.registry.workflow("bad_step")
    def bad_step(ctx: WorkflowContext, value: Any) -> Any:
        return ctx.step(name, lambda: 1)

    execution, _ = h.runner.start("bad_step", None)
    done = h.runner.run(execution.execution_id)
    assert done is not None and done.state is S.FAILED
    assert done.error is not None and done.error.startswith("InvalidFieldError: name")
    assert h.store.list_steps(execution.execution_id) == []
