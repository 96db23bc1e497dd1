"""Event topics: what a topic and a subscription's topic pattern may be, and which topics a
pattern selects. Pure: no Flask, SQL or network."""

from __future__ import annotations

import re

from ..errors import InvalidFieldError

__all__ = ["RESERVED_PREFIX", "topic_matches", "validate_topic"]

#: The topics of flask-harvest's own events (the operational notifications) start with it.
RESERVED_PREFIX = "harvest."

_TOPIC_SEGMENT = re.compile(r"[A-Za-z0-9_\-:]+")


def validate_topic(topic: str, *, pattern: bool, field_name: str = "topic") -> str:
    """Return ``topic`` if it is a dot-separated topic, else raise :class:`InvalidFieldError`.

    With ``pattern`` true, ``*`` may stand for a segment (see :func:`topic_matches`).
    """
    if not isinstance(topic, str) or not topic:
        raise InvalidFieldError(field_name, "a topic must be a non-empty string such as 'order.created'")
    for segment in topic.split("."):
        if segment == "*" and pattern:
            continue
        if not _TOPIC_SEGMENT.fullmatch(segment):
            allowed = "letters, digits, '_', '-', ':'" + (" or a lone '*'" if pattern else "")
            raise InvalidFieldError(
                field_name, f"{topic!r} is not a topic: each dot-separated part must be {allowed}"
            )
    return topic


def topic_matches(pattern: str, topic: str) -> bool:
    """Return whether a subscription's topic ``pattern`` selects the event ``topic``.

    Topics are dot-separated. A ``*`` segment matches any one segment, and a trailing ``*`` matches
    one or more: ``order.*`` selects ``order.created`` and ``order.item.added`` but not ``order``;
    ``*`` alone selects every topic.
    """
    wanted = pattern.split(".")
    given = topic.split(".")
    for index, segment in enumerate(wanted):
        last = index == len(wanted) - 1
        if index >= len(given):
            return False
        if segment == "*":
            if last:
                return True
            continue
        if segment != given[index]:
            return False
    return len(wanted) == len(given)
