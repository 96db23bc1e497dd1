"""Hypothesis settings and hostile-input strategies shared by the property tests.

The budget is fixed and modest (:data:`BUDGET`), so the suite stays fast and CI runs the same
number of examples every time; ``HARVEST_PROPERTY_EXAMPLES`` raises it for a longer local hunt.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: Examples per property test.
EXAMPLES = int(os.environ.get("HARVEST_PROPERTY_EXAMPLES", "60"))

#: The settings of every property test here: fixtures are reset by the test itself, so the
#: function-scoped fixture check does not apply.
BUDGET = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: Characters that broke something once: NUL, lone surrogates (what a non-UTF-8 argv byte
#: becomes), path and URL syntax, a right-to-left mark.
SPECIALS = ["\x00", "\ud800", "\udfff", "\udcff", "/", "%", "?", "#", "..", " ", "\u202e", "\n", "é"]

#: Text with the specials mixed in, short enough to stay fast.
TEXT = st.lists(st.one_of(st.text(max_size=6), st.sampled_from(SPECIALS)), max_size=5).map("".join)


def quoted(text: str, safe: str = "/") -> str:
    """``text`` percent-encoded for a URL path, lone surrogates too (as the bytes a client sends)."""
    return urllib.parse.quote(text.encode("utf-8", "surrogatepass"), safe=safe)


#: Numbers a JSON parser or a 32-bit column may not expect.
NUMBERS = st.one_of(
    st.integers(),
    st.sampled_from([0, -1, 2**31, 2**63, 10**400, -(10**400)]),
    st.floats(allow_nan=True, allow_infinity=True),
)


def deep(depth: int) -> Any:
    """A list nested ``depth`` levels deep, built without recursion."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


#: Odd datetimes: the first and last days, with the widest offsets.
DATETIMES = st.one_of(
    st.datetimes(timezones=st.just(timezone.utc)),
    st.sampled_from(
        [
            datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-12))),
            datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))),
            datetime(2026, 1, 1),  # naive
        ]
    ),
)

#: JSON-like values with hostile leaves.
JSON: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | NUMBERS | TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=8,
)

DEPTHS = st.sampled_from([100, 128, 129, 1_000, 20_000])

#: Python values for a payload: JSON-like, or nested far too deep for a recursive encoder.
PAYLOADS = JSON | DEPTHS.map(deep)


#: The ISO 8601 texts an API may be given for a datetime.
DATETIME_TEXTS = st.one_of(
    TEXT,
    st.sampled_from(
        [
            "9999-12-31T23:59:59-12:00",
            "0001-01-01T00:00:00+14:00",
            "2026-01-01T00:00:00",
            "2026-01-01T00:00:00Z",
            "2026-02-30T00:00:00Z",
        ]
    ),
)


def json_text(value: Any) -> str:
    """``value`` as JSON text, lone surrogates as ``\\ud800`` escapes, NaN as ``NaN``."""
    return json.dumps(value, allow_nan=True)


def nested_text(depth: int, key: str = "description") -> str:
    """A JSON object whose ``key`` holds arrays nested ``depth`` deep, as text."""
    return json.dumps({key: None}).replace("null", "[" * depth + "]" * depth)


#: Request body texts: hostile JSON, deep JSON, and text that is not JSON at all.
BODY_TEXTS = st.one_of(
    JSON.map(json_text),
    st.dictionaries(TEXT, JSON, max_size=4).map(json_text),
    DEPTHS.map(nested_text),
    TEXT,
)
