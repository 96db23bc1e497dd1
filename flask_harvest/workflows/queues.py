"""Workflow queues: their declared limits, and the checks of a start's queue fields. Pure.

A queue bounds how many of its runs are ``Running`` at once (``concurrency``), how many first
starts it makes per period (``rate_limit``), and, per run, how many running runs may share its
``concurrency_key``. The limits are enforced where runs are claimed, in SQL
(:mod:`._queue_claims`); this module only says what they are.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .._input import text_problem
from ..errors import ConfigurationError, InvalidFieldError
from .errors import UnknownQueueError

__all__ = [
    "MAX_CONCURRENCY",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "QueueSpec",
    "QueueTable",
    "StartQueue",
    "check_priority",
    "parse_queue_settings",
    "queue_values",
]

#: The widest a queue name or concurrency key may be (its column's width).
MAX_KEY_LENGTH = 255
#: The most runs a queue (or a concurrency key) lets run at once.
MAX_CONCURRENCY = 100_000
#: Priorities run from this (first) ...
MIN_PRIORITY = -1_000_000
#: ... to this (last); the default is 0.
MAX_PRIORITY = 1_000_000
#: The most first starts a rate limit allows per period.
MAX_RATE_LIMIT = 1_000_000
#: The longest rate-limit period, in seconds (a day).
MAX_RATE_PERIOD = 86_400.0


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_key(field: str, value: object) -> str:
    """Return ``value`` if it is a queue name or concurrency key: 1 to 255 characters of text."""
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_LENGTH:
        raise InvalidFieldError(field, f"must be a string of 1 to {MAX_KEY_LENGTH} characters")
    problem = text_problem(value)
    if problem is not None:
        raise InvalidFieldError(field, problem)
    return value


def check_count(field: str, value: object, maximum: int = MAX_CONCURRENCY) -> int:
    """Return ``value`` if it is an integer from 1 to ``maximum``."""
    if not _is_int(value) or not 1 <= value <= maximum:  # type: ignore[operator]
        raise InvalidFieldError(field, f"must be an integer from 1 to {maximum}, not {value!r:.40}")
    return value  # type: ignore[return-value]


def check_priority(value: object, field: str = "priority") -> int:
    """Return ``value`` if it is a priority: an integer from -1,000,000 to 1,000,000."""
    if not _is_int(value) or not MIN_PRIORITY <= value <= MAX_PRIORITY:  # type: ignore[operator]
        raise InvalidFieldError(
            field, f"must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, not {value!r:.40}"
        )
    return value  # type: ignore[return-value]


def check_rate_limit(value: object, field: str = "rate_limit") -> tuple[int, float] | None:
    """Return ``(limit, seconds)`` from a pair such as ``(10, 1.0)``, or ``None`` for ``None``."""
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise InvalidFieldError(field, "must be a pair [limit, seconds], such as [10, 1.0]")
    limit, seconds = value
    check_count(f"{field}[0]", limit, MAX_RATE_LIMIT)
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or not 0 < seconds <= MAX_RATE_PERIOD
    ):
        raise InvalidFieldError(
            f"{field}[1]", f"must be a number of seconds over 0 and at most {MAX_RATE_PERIOD:g}"
        )
    return int(limit), float(seconds)


@dataclass(frozen=True)
class QueueSpec:
    """A declared queue.

    :param name: the queue's name (1 to 255 characters).
    :param concurrency: the most runs of the queue ``Running`` at once; ``None`` for no limit.
    :param rate_limit: ``(limit, seconds)``: at most ``limit`` first starts in any ``seconds``;
        ``None`` for no limit.
    """

    name: str
    concurrency: int | None = None
    rate_limit: tuple[int, float] | None = None

    @classmethod
    def build(cls, name: object, *, concurrency: object = None, rate_limit: object = None) -> QueueSpec:
        """Return a checked spec.

        :raises InvalidFieldError: a name, concurrency or rate limit out of range.
        """
        return cls(
            check_key("name", name),
            None if concurrency is None else check_count("concurrency", concurrency),
            check_rate_limit(rate_limit),
        )

    @property
    def limited(self) -> bool:
        """Whether the queue has a queue-wide limit (concurrency or rate)."""
        return self.concurrency is not None or self.rate_limit is not None

    def as_dict(self) -> dict[str, Any]:
        """The queue's limits as JSON."""
        return {
            "name": self.name,
            "concurrency": self.concurrency,
            "rate_limit": list(self.rate_limit) if self.rate_limit is not None else None,
        }


def parse_queue_settings(raw: str | Mapping[str, Any], *, key: str) -> dict[str, QueueSpec]:
    """Return the queues of the ``HARVEST_WORKFLOW_QUEUES`` setting: a mapping (or its JSON) of
    name to ``{"concurrency": n, "rate_limit": [limit, seconds]}``.

    :raises ConfigurationError: not such a mapping, an unknown field, or a value out of range.
    """
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ConfigurationError(f"{key} must be a JSON object of queues ({exc})") from None
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{key} must map queue names to their limits")
    specs: dict[str, QueueSpec] = {}
    for name, options in raw.items():
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ConfigurationError(f"{key}: queue {name!r:.80} must map to {{concurrency, rate_limit}}")
        unknown = set(options) - {"concurrency", "rate_limit"}
        if unknown:
            raise ConfigurationError(
                f"{key}: queue {name!r:.80} has unknown field(s) {', '.join(sorted(map(str, unknown)))}; "
                "known: concurrency, rate_limit"
            )
        try:
            spec = QueueSpec.build(
                name, concurrency=options.get("concurrency"), rate_limit=options.get("rate_limit")
            )
        except InvalidFieldError as exc:
            raise ConfigurationError(f"{key}: queue {name!r:.80}: {exc}") from None
        specs[spec.name] = spec
    return specs


class QueueTable:
    """The declared queues, by name: those of the settings first, then those declared in code.

    :param configured: the queues of ``HARVEST_WORKFLOW_QUEUES`` (they win over code's).
    :param declared: the queues declared in code (:meth:`declare`), shared with other tables.
    """

    def __init__(
        self, configured: Mapping[str, QueueSpec] | None = None, declared: QueueTable | None = None
    ) -> None:
        self._specs: dict[str, QueueSpec] = dict(configured or {})
        self._declared = declared

    def declare(self, spec: QueueSpec) -> QueueSpec:
        """Add (or replace) a queue declared in code and return it."""
        self._specs[spec.name] = spec
        return spec

    def get(self, name: str) -> QueueSpec | None:
        """Return the queue called ``name``, or ``None``."""
        spec = self._specs.get(name)
        if spec is None and self._declared is not None:
            return self._declared.get(name)
        return spec

    def require(self, name: object, field: str = "queue") -> QueueSpec:
        """Return the queue called ``name``.

        :raises InvalidFieldError: the name is not a queue name.
        :raises UnknownQueueError: no queue of that name is declared.
        """
        spec = self.get(check_key(field, name))
        if spec is None:
            raise UnknownQueueError(field, str(name))
        return spec

    def __iter__(self) -> Iterator[QueueSpec]:
        names = set(self._specs) | ({s.name for s in self._declared} if self._declared else set())
        for name in sorted(names):
            spec = self.get(name)
            if spec is not None:
                yield spec


@dataclass(frozen=True)
class StartQueue:
    """Where a start puts its run: its queue, concurrency key and limit, and priority.

    :meth:`resolve` builds it from a workflow's defaults and the start's overrides, checked.
    """

    queue_name: str | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    priority: int = 0

    @classmethod
    def resolve(
        cls,
        table: QueueTable,
        *,
        default_queue: str | None,
        default_priority: int,
        queue: object = None,
        concurrency_key: object = None,
        concurrency_limit: object = None,
        priority: object = None,
    ) -> StartQueue:
        """Return the start's queue fields: the start's values where given, else the workflow's.

        :raises InvalidFieldError: a value out of range, or a key or limit without a queue.
        :raises UnknownQueueError: the queue is not declared.
        """
        name = default_queue if queue is None else queue
        key = None if concurrency_key is None else check_key("concurrency_key", concurrency_key)
        limit = None if concurrency_limit is None else check_count("concurrency_limit", concurrency_limit)
        chosen = default_priority if priority is None else check_priority(priority)
        if name is None:
            if key is not None or limit is not None:
                raise InvalidFieldError(
                    "concurrency_key" if key is not None else "concurrency_limit",
                    "needs a queue: name one with queue=, or declare the workflow with queue=",
                )
            return cls(priority=chosen)
        table.require(name)
        if limit is not None and key is None:
            raise InvalidFieldError("concurrency_limit", "needs a concurrency_key to limit")
        # A key without a limit allows one running run of that key: the common "one at a time
        # per customer" case needs no second field.
        if key is not None and limit is None:
            limit = 1
        return cls(str(name), key, limit, chosen)


def queue_values(queue: StartQueue) -> dict[str, Any]:
    """The execution row's columns for ``queue``."""
    return {
        "queue_name": queue.queue_name,
        "concurrency_key": queue.concurrency_key,
        "concurrency_limit": queue.concurrency_limit,
        "priority": queue.priority,
    }
