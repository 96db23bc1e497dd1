"""Ordered delivery per key: the ordering key's checks, the per-subscription policy and the
head-of-line rule. Pure: the stores apply the same rule, the SQL store as a query.

A delivery dispatched with an ordering key gets a *position* in its key's line: the key's sequence
number at dispatch (taken under a row lock, so dispatches of one key are numbered in commit order),
and its id to break ties. A delivery of a key may be attempted only while every earlier delivery of
the same subscription and key is done: delivered, skipped, or dead-lettered under the ``skip``
policy. ``PENDING`` and ``INFLIGHT`` deliveries always hold the line, so a retry, a lease lost to a
killed worker or a delivery given back for a limit never lets a later one overtake.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Protocol

from ..errors import InvalidFieldError
from ..outbound.attempt import DeliveryState

#: The longest ordering key, in characters.
MAX_ORDERING_KEY_LENGTH = 128

#: The states of deliveries that may hold their key's line (which of them do depends on the
#: policy for ``DLQ``). The SQL store's partial index keeps exactly these rows.
LINE_STATES = (DeliveryState.PENDING, DeliveryState.INFLIGHT, DeliveryState.DLQ)


class OrderingPolicy(str, enum.Enum):
    """What a subscription's ordered key does when its head is dead-lettered."""

    #: The key waits for an operator: the dead-lettered delivery is replayed and succeeds, or is
    #: skipped. The default: a later event never reaches the receiver before an earlier one.
    BLOCK = "block"
    #: The key moves on: the next delivery of the key is attempted.
    SKIP = "skip"


#: The policy of a subscription that sets none (and of rows saved by earlier versions).
DEFAULT_ORDERING_POLICY = OrderingPolicy.BLOCK


def validate_ordering_key(value: object, field_name: str = "ordering_key") -> str | None:
    """Return ``value`` if it is an ordering key (or ``None``: unordered), else raise.

    A key is a string of 1 to :data:`MAX_ORDERING_KEY_LENGTH` printable characters (no control
    characters, no line breaks), without leading or trailing spaces.

    :raises InvalidFieldError: the message says what is wrong, and shows at most the key's start.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidFieldError(field_name, "must be a string or null")
    if not value:
        raise InvalidFieldError(field_name, "must not be empty (leave it out for unordered delivery)")
    if len(value) > MAX_ORDERING_KEY_LENGTH:
        raise InvalidFieldError(field_name, f"must be at most {MAX_ORDERING_KEY_LENGTH} characters")
    if not value.isprintable():
        raise InvalidFieldError(
            field_name, "must be printable characters only (no control characters or line breaks)"
        )
    if value != value.strip():
        raise InvalidFieldError(field_name, "must not start or end with a space")
    return value


def validate_ordering_policy(value: object, field_name: str = "ordering_policy") -> OrderingPolicy:
    """Return ``value`` as a policy (a member or its value), else raise :class:`InvalidFieldError`."""
    try:
        return OrderingPolicy(value)
    except (ValueError, TypeError):
        allowed = ", ".join(policy.value for policy in OrderingPolicy)
        raise InvalidFieldError(field_name, f"must be one of {allowed}") from None


class Positioned(Protocol):
    """What the rule reads of a delivery."""

    @property
    def id(self) -> str: ...
    @property
    def subscription_id(self) -> str: ...
    @property
    def state(self) -> DeliveryState: ...
    @property
    def ordering_key(self) -> str | None: ...
    @property
    def ordering_seq(self) -> int | None: ...


def position(delivery: Positioned) -> tuple[int, str]:
    """A delivery's place in its key's line: its sequence number, then its id."""
    return (delivery.ordering_seq or 0, delivery.id)


def holds_line(state: DeliveryState, policy: OrderingPolicy) -> bool:
    """Whether a delivery in ``state`` keeps the later deliveries of its key waiting."""
    if state in (DeliveryState.PENDING, DeliveryState.INFLIGHT):
        return True
    return state is DeliveryState.DLQ and policy is OrderingPolicy.BLOCK


def releases_line(state: DeliveryState, policy: OrderingPolicy) -> bool:
    """Whether a delivery that ended in ``state`` lets the next delivery of its key go."""
    return state in (DeliveryState.DELIVERED, DeliveryState.SKIPPED, DeliveryState.DLQ) and not holds_line(
        state, policy
    )


def at_head(delivery: Positioned, line: Iterable[Positioned], policy: OrderingPolicy) -> bool:
    """Whether ``delivery`` may be attempted as far as ordering goes: it has no key, or no earlier
    delivery of its subscription and key (among ``line``) holds the line."""
    key = delivery.ordering_key
    if key is None:
        return True
    mine = position(delivery)
    return not any(
        other.ordering_key == key
        and other.subscription_id == delivery.subscription_id
        and position(other) < mine
        and holds_line(DeliveryState(other.state), policy)
        for other in line
    )


def next_in_line(line: Iterable[Positioned], policy: OrderingPolicy) -> Positioned | None:
    """The ``PENDING`` delivery of one subscription and key that may be attempted next (``None``
    if the line is empty or held): the earliest delivery that holds the line, if it is pending."""
    for delivery in sorted(line, key=position):
        if holds_line(DeliveryState(delivery.state), policy):
            return delivery if delivery.state is DeliveryState.PENDING else None
    return None
