"""The pure ordering rule and the ordering key's checks (flask_harvest.webhooks.ordering)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from flask import Flask
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import DeliveryState, get_engine
from flask_harvest.errors import InvalidFieldError
from flask_harvest.webhooks.ordering import (
    MAX_ORDERING_KEY_LENGTH,
    OrderingPolicy,
    at_head,
    holds_line,
    next_in_line,
    position,
    validate_ordering_key,
    validate_ordering_policy,
)
from flask_harvest.webhooks.stores.memory import InMemoryOutboundWebhookHandler

from .pipeline import make_app
from .test_store_contract import make_subscription


@dataclass(frozen=True)
class Row:
    id: str
    subscription_id: str
    state: DeliveryState
    ordering_key: str | None
    ordering_seq: int | None


rows = st.lists(
    st.builds(
        Row,
        id=st.uuids().map(lambda u: f"msg_{u.hex}"),
        subscription_id=st.sampled_from(["sub_a", "sub_b"]),
        state=st.sampled_from(list(DeliveryState)),
        ordering_key=st.sampled_from(["k1", "k2", None]),
        ordering_seq=st.integers(1, 20),
    ),
    max_size=30,
    unique_by=lambda r: r.id,
)
policies = st.sampled_from(list(OrderingPolicy))


@given(rows, policies)
def test_at_most_one_pending_delivery_per_line_is_at_its_head(
    line: list[Row], policy: OrderingPolicy
) -> None:
    heads: dict[tuple[str, str], list[Row]] = {}
    for row in line:
        if row.ordering_key is not None and row.state is DeliveryState.PENDING and at_head(row, line, policy):
            heads.setdefault((row.subscription_id, row.ordering_key), []).append(row)
    assert all(len(found) == 1 for found in heads.values())


@given(rows, policies)
def test_a_head_has_nothing_before_it_that_holds_the_line(line: list[Row], policy: OrderingPolicy) -> None:
    for row in line:
        if row.ordering_key is None:
            assert at_head(row, line, policy)
            continue
        if at_head(row, line, policy):
            for other in line:
                if (other.subscription_id, other.ordering_key) == (row.subscription_id, row.ordering_key):
                    assert not (position(other) < position(row) and holds_line(other.state, policy))


@given(rows, policies)
def test_next_in_line_is_the_pending_head(line: list[Row], policy: OrderingPolicy) -> None:
    one = [r for r in line if r.subscription_id == "sub_a" and r.ordering_key == "k1"]
    chosen = next_in_line(one, policy)
    pending_heads = [r for r in one if r.state is DeliveryState.PENDING and at_head(r, one, policy)]
    assert pending_heads == ([chosen] if chosen is not None else [])


def test_a_dead_letter_holds_the_line_only_under_block() -> None:
    assert holds_line(DeliveryState.DLQ, OrderingPolicy.BLOCK)
    assert not holds_line(DeliveryState.DLQ, OrderingPolicy.SKIP)
    for state in (DeliveryState.PENDING, DeliveryState.INFLIGHT):
        assert all(holds_line(state, policy) for policy in OrderingPolicy)
    for state in (DeliveryState.DELIVERED, DeliveryState.SKIPPED):
        assert not any(holds_line(state, policy) for policy in OrderingPolicy)


@given(st.text(min_size=1, max_size=MAX_ORDERING_KEY_LENGTH))
def test_a_key_is_printable_text_without_outer_spaces(text: str) -> None:
    ok = text.isprintable() and text == text.strip()
    if ok:
        assert validate_ordering_key(text) == text
    else:
        with pytest.raises(InvalidFieldError) as caught:
            validate_ordering_key(text)
        assert caught.value.field == "ordering_key"


@pytest.mark.parametrize(
    "bad", ["", "x" * (MAX_ORDERING_KEY_LENGTH + 1), "a\nb", "a\x00b", " lead", 42, b"bytes", ["k"], "\ud800"]
)
def test_bad_keys_are_refused_with_a_clear_error(bad: object) -> None:
    with pytest.raises(InvalidFieldError, match="ordering_key"):
        validate_ordering_key(bad)


@given(st.one_of(st.text(max_size=10), st.integers(), st.none()))
def test_a_policy_is_block_or_skip(value: object) -> None:
    if value in ("block", "skip"):
        assert validate_ordering_policy(value).value == value
    else:
        with pytest.raises(InvalidFieldError, match="ordering_policy: must be one of block, skip"):
            validate_ordering_policy(value)


@given(st.one_of(st.text(max_size=200), st.integers(), st.binary(max_size=5)))
def test_dispatch_refuses_a_bad_key_and_writes_nothing(value: object) -> None:
    try:
        validate_ordering_key(value)
    except InvalidFieldError:
        pass
    else:
        return
    store = InMemoryOutboundWebhookHandler()
    store.add_subscription(make_subscription())
    app: Flask = make_app(store)
    with app.app_context(), pytest.raises(InvalidFieldError, match="ordering_key"):
        get_engine().manager.dispatch("order.created", {"id": 1}, ordering_key=value)  # type: ignore[arg-type]
    assert store.list_deliveries() == []
