"""The pure parts of workflows: states, the JSON gate, the registry."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest.errors import ConfigurationError, InvalidFieldError, NotFoundError
from flask_harvest.workflows import (
    ExecutionState,
    InputTooLargeError,
    UnknownWorkflowError,
    WorkflowContext,
    WorkflowRegistry,
)
from flask_harvest.workflows.models import Execution, decode_json, encode_json, utcnow

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5),
    max_leaves=30,
)

not_json = st.one_of(
    st.sets(st.integers(), min_size=1),
    st.binary(),
    st.tuples(st.integers()),
    st.dictionaries(st.integers(), st.integers(), min_size=1),
    st.sampled_from([math.nan, math.inf, -math.inf, object()]),
)


def test_terminal_states() -> None:
    outcomes = ["Completed", "Failed", "Cancelled", "TimedOut", "Terminated"]
    assert [s.value for s in ExecutionState if s.outcome] == outcomes
    # ContinuedAsNew closes the row but is not how the logical run ended.
    assert [s.value for s in ExecutionState if s.terminal] == [*outcomes, "ContinuedAsNew"]
    assert not ExecutionState.PENDING.terminal and not ExecutionState.RUNNING.outcome


@given(json_values)
def test_every_json_value_round_trips(value: Any) -> None:
    assert decode_json(encode_json(value, field="input")) == value


@given(json_values, st.integers(min_value=0, max_value=200))
def test_the_size_limit_is_on_the_utf8_encoding(value: Any, limit: int) -> None:
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    if size <= limit:
        assert decode_json(encode_json(value, field="input", max_bytes=limit)) == value
    else:
        with pytest.raises(InputTooLargeError) as caught:
            encode_json(value, field="input", max_bytes=limit)
        assert (caught.value.size, caught.value.limit) == (size, limit)


@given(not_json)
def test_what_is_not_json_is_refused_with_the_field_named(value: Any) -> None:
    with pytest.raises(InvalidFieldError, match=r"^input: is not a JSON value"):
        encode_json(value, field="input")
    with pytest.raises(InvalidFieldError):
        encode_json({"nested": [value]}, field="input")


def test_a_too_deep_value_is_refused() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(InvalidFieldError):
        encode_json(deep, field="input")


def test_the_registry_knows_its_workflows() -> None:
    registry = WorkflowRegistry()

    @registry.workflow("refund", timeout=timedelta(minutes=10))
    def refund(ctx: WorkflowContext, value: Any) -> Any:
        return value

    assert registry.get("refund").fn is refund and registry.get("refund").timeout == timedelta(minutes=10)
    assert "refund" in registry and registry.names() == ["refund"] and len(registry) == 1
    registry.workflow("refund")(refund)  # the same function again (a module imported twice) is fine
    with pytest.raises(UnknownWorkflowError) as caught:
        registry.get("ship")
    assert isinstance(caught.value, NotFoundError) and caught.value.name == "ship"


@pytest.mark.parametrize(
    ("name", "timeout"),
    [("", None), (" ", None), ("x" * 256, None), ("ok", timedelta(0)), ("ok", timedelta(seconds=-1))],
)
def test_the_registry_refuses_bad_definitions(name: str, timeout: timedelta | None) -> None:
    with pytest.raises(ConfigurationError):
        WorkflowRegistry().workflow(name, timeout=timeout)


def test_a_name_cannot_be_taken_twice() -> None:
    registry = WorkflowRegistry()
    registry.workflow("refund")(lambda ctx, value: 1)
    with pytest.raises(ConfigurationError, match="already registered"):
        registry.workflow("refund")(lambda ctx, value: 2)


@pytest.mark.parametrize(
    ("state", "fork_mode", "notifies"),
    [
        (ExecutionState.COMPLETED, None, True),
        (ExecutionState.FAILED, None, True),
        (ExecutionState.CONTINUED_AS_NEW, None, False),
        (ExecutionState.RUNNING, None, False),
        (ExecutionState.COMPLETED, "live", True),
        (ExecutionState.COMPLETED, "recorded", False),
        (ExecutionState.TERMINATED, "live_quiet", False),
    ],
)
def test_which_ends_notify_callbacks_and_triggers(
    state: ExecutionState, fork_mode: str | None, notifies: bool
) -> None:
    execution = Execution("e", "w", "k", None, state, created_at=utcnow(), fork_mode=fork_mode)
    assert execution.notifies is notifies
