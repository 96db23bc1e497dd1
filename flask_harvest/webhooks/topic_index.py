"""Index keys of topic patterns, so a store finds a topic's subscriptions without reading them all.

A subscription's pattern is stored under :func:`pattern_key`; an event's topic is looked up under
:func:`topic_keys`, the keys of every pattern that could select it (for ``a.b``: ``a.b``, ``a.*``,
``*.b``, ``*.*`` and ``*``). A store selects the subscriptions filed under those keys and keeps
those whose patterns :func:`~flask_harvest.webhooks.topics.topic_matches` accepts, so the result is
exactly the matcher's.

The candidates of a topic of n segments number 2^n + 2^(n-1) - 1, since a ``*`` may stand anywhere,
so keys look at a bounded head: a pattern of more than :data:`KEY_SEGMENTS` segments is filed
under its first :data:`KEY_SEGMENTS` segments and :data:`LONG_MARK`, and a segment longer than
:data:`KEY_SEGMENT_LENGTH` under a digest. Such keys select a superset, which the matcher then
narrows; every other pattern's key is a candidate exactly when the pattern matches. Pure: no
Flask, SQL or network.
"""

from __future__ import annotations

import functools
import hashlib
import itertools

#: Segments of a pattern that its key keeps; longer patterns share keys with their head.
KEY_SEGMENTS = 6
#: The longest segment a key keeps as it is; longer ones become :data:`_DIGEST_MARK` and a digest.
KEY_SEGMENT_LENGTH = 64
#: The last segment of the key of a pattern longer than :data:`KEY_SEGMENTS` segments. Topic
#: segments never contain ``#``, so no pattern's own key can look like it.
LONG_MARK = "#"
# Likewise '=' never occurs in a segment, so a digest never equals a kept segment.
_DIGEST_MARK = "="
_WILDCARD = "*"
#: The longest key: :data:`KEY_SEGMENTS` segments of at most :data:`KEY_SEGMENT_LENGTH`
#: characters, their dots, and the long mark.
MAX_KEY_LENGTH = KEY_SEGMENTS * (KEY_SEGMENT_LENGTH + 1) + len(LONG_MARK)


def _segment(segment: str) -> str:
    if len(segment) <= KEY_SEGMENT_LENGTH:
        return segment
    # A bounded stand-in: a btree index refuses entries of a few kilobytes, and topics are unbounded.
    return _DIGEST_MARK + hashlib.sha256(segment.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def pattern_key(pattern: str) -> str:
    """Return the key a subscription's (valid) topic ``pattern`` is filed under."""
    segments = [_segment(s) for s in pattern.split(".")]
    if len(segments) > KEY_SEGMENTS:
        segments = [*segments[:KEY_SEGMENTS], LONG_MARK]
    return ".".join(segments)


# Dispatch asks for the same few topics again and again. Bounded: at most 127 keys of at most
# MAX_KEY_LENGTH characters per topic, so a few megabytes however hostile the topics.
@functools.lru_cache(maxsize=256)
def topic_keys(topic: str) -> tuple[str, ...]:
    """Return the keys of every pattern that could select the (valid) event ``topic``.

    Per :func:`~flask_harvest.webhooks.topics.topic_matches`: a pattern of as many segments as the
    topic, each one the topic's or ``*``; a shorter pattern whose last segment is ``*`` (which
    matches the rest), the others the topic's or ``*``; and, for a topic longer than
    :data:`KEY_SEGMENTS`, the long keys of its head.
    """
    segments = [_segment(s) for s in topic.split(".")]
    count = len(segments)
    keys: list[str] = []
    # Shorter patterns ending in '*': the head before it is the topic's or '*', segment by segment.
    for length in range(1, min(count, KEY_SEGMENTS + 1)):
        keys.extend(_variants(segments[: length - 1], (_WILDCARD,)))
    if count <= KEY_SEGMENTS:
        keys.extend(_variants(segments, ()))
    else:
        keys.extend(_variants(segments[:KEY_SEGMENTS], (LONG_MARK,)))
    return tuple(keys)


def _variants(head: list[str], tail: tuple[str, ...]) -> list[str]:
    """Every join of ``head`` with any of its segments replaced by ``*``, followed by ``tail``."""
    choices = [(segment, _WILDCARD) if segment != _WILDCARD else (segment,) for segment in head]
    return [".".join((*chosen, *tail)) for chosen in itertools.product(*choices)]
