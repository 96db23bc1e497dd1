"""Registering completion-callback targets: normalise, validate, union with the defaults. Pure.

Per-execution targets come first, then the app-wide defaults; the union is de-duplicated by
``(url, filter)`` and each distinct target gets a stable ``callback_index`` (its position), stored
with the execution as its ``completion_callbacks``. The stored form is a list of
``{"callback_index": i, "url": ..., "filter": {...}}``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import HarvestError, InvalidFieldError
from .filters import EventFilter
from .policy import CallbackPolicy, Rejection

__all__ = [
    "MAX_TARGETS",
    "CallbackTarget",
    "CallbackTargetRejected",
    "normalise_targets",
    "parse_targets",
    "stored_targets",
]

#: The most distinct targets one execution may have (its own and the defaults).
MAX_TARGETS = 16


class CallbackTargetRejected(HarvestError):
    """A completion-callback target is refused; the HTTP start route answers 422 with the rejection.

    :param index: the target's position in the request's ``completion_callbacks`` (``None``: a default).
    :param rejection: the typed SSRF rejection, or ``None`` for a malformed target (see ``message``).
    """

    http_status = 422
    error_code = "callback_target_rejected"

    def __init__(
        self, index: int | None, rejection: Rejection | None = None, message: str | None = None
    ) -> None:
        self.index = index
        self.rejection = rejection
        where = f"completion_callbacks[{index}]" if index is not None else "a default completion callback"
        self.detail = message if message is not None else (rejection.message if rejection else "refused")
        super().__init__(f"{where}: {self.detail}")

    def error_details(self) -> dict[str, Any]:
        """The JSON the HTTP edge adds to its error body."""
        field = f"completion_callbacks[{self.index}]" if self.index is not None else "completion_callbacks"
        data: dict[str, Any] = {"fields": {field: [self.detail]}}
        if self.rejection is not None:
            data["rejection"] = self.rejection.to_json()
        return data


@dataclass(frozen=True)
class CallbackTarget:
    """A URL and the terminal states it is called for."""

    url: str
    filter: EventFilter

    @property
    def key(self) -> tuple[str, str]:
        """What two targets must share to be the same target: the URL and the filter's JSON."""
        return self.url, json.dumps(self.filter.to_json(), sort_keys=True)

    def to_json(self, index: int) -> dict[str, Any]:
        return {"callback_index": index, "url": self.url, "filter": self.filter.to_json()}


def parse_targets(data: Any, policy: CallbackPolicy) -> list[CallbackTarget]:
    """Read a request's ``completion_callbacks`` (a list of ``{"url", "filter"}``), checking each URL.

    :raises CallbackTargetRejected: a malformed target, or one the policy refuses.
    """
    if data is None:
        return []
    if not isinstance(data, list):
        raise CallbackTargetRejected(
            None, message="completion_callbacks must be a list of {url, filter} objects"
        )
    if len(data) > MAX_TARGETS:
        raise CallbackTargetRejected(
            None, message=f"at most {MAX_TARGETS} completion callbacks per execution"
        )
    targets = []
    for index, item in enumerate(data):
        if not isinstance(item, dict) or not isinstance(item.get("url"), str):
            raise CallbackTargetRejected(index, message="must be an object with a url string and a filter")
        extra = sorted(str(k) for k in item if k not in ("url", "filter"))
        if extra:
            raise CallbackTargetRejected(index, message=f"unknown key(s) {', '.join(extra)!s:.100}")
        try:
            event_filter = EventFilter.from_json(item.get("filter"))
        except InvalidFieldError as exc:
            raise CallbackTargetRejected(index, message=str(exc)) from None
        rejection = policy.check(item["url"])
        if rejection is not None:
            raise CallbackTargetRejected(index, rejection)
        targets.append(CallbackTarget(item["url"], event_filter))
    return targets


def normalise_targets(
    own: Sequence[CallbackTarget], defaults: Sequence[CallbackTarget]
) -> list[dict[str, Any]]:
    """Return the stored form: ``own`` then ``defaults``, de-duplicated by (url, filter), indexed.

    :raises CallbackTargetRejected: more than :data:`MAX_TARGETS` distinct targets.
    """
    seen: set[tuple[str, str]] = set()
    stored: list[dict[str, Any]] = []
    for target in [*own, *defaults]:
        if target.key in seen:
            continue
        seen.add(target.key)
        stored.append(target.to_json(len(stored)))
    if len(stored) > MAX_TARGETS:
        raise CallbackTargetRejected(
            None, message=f"at most {MAX_TARGETS} completion callbacks per execution"
        )
    return stored


def stored_targets(value: Any) -> list[tuple[int, CallbackTarget]]:
    """Read an execution's stored ``completion_callbacks``; entries that do not parse are skipped."""
    if not isinstance(value, list):
        return []
    result = []
    for item in value:
        if not isinstance(item, dict):
            continue
        index, url = item.get("callback_index"), item.get("url")
        if not isinstance(index, int) or not isinstance(url, str):
            continue
        try:
            result.append((index, CallbackTarget(url, EventFilter.from_json(item.get("filter")))))
        except InvalidFieldError:
            continue
    return result
