"""The completion-callback envelope and its signature. Pure.

The body is built once, when the delivery is enqueued, and sent byte-identical on every attempt and
redrive. Fields, in this order: ``delivery_id``, ``execution_id``, ``workflow_name``,
``workflow_id``, ``state``, then ``result`` (``Completed`` only) or ``error`` (the other terminal
states, when there is one), then ``completed_at``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime, timezone
from typing import Any

from ..workflows.models import Execution, ExecutionState

__all__ = [
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "CallbackSecret",
    "build_envelope",
    "rfc3339_ms",
    "sign",
]

SIGNATURE_HEADER = "X-Harvest-Signature"
TIMESTAMP_HEADER = "X-Harvest-Timestamp"


class CallbackSecret:
    """The HMAC key of completion callbacks. Its ``repr`` and ``str`` never show it, and it is never
    written to a table, a log line or an error."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes | str) -> None:
        raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
        if not raw:
            raise ValueError("a completion-callback secret must not be empty")
        self._key = raw

    def __repr__(self) -> str:
        return "CallbackSecret('***')"

    __str__ = __repr__

    def __reduce__(self) -> Any:  # never pickled into a job or a cache
        raise TypeError("a CallbackSecret cannot be pickled")

    def sign(self, body: bytes) -> str:
        """Return ``sha256=<lowercase hex HMAC-SHA256 of body>``."""
        return sign(self._key, body)

    def masks(self) -> tuple[str, ...]:
        """The secret's text forms, for masking error messages."""
        return (self._key.decode("utf-8", errors="replace"),)


def sign(key: bytes, body: bytes) -> str:
    """Return the ``X-Harvest-Signature`` value of ``body`` under ``key``."""
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def rfc3339_ms(when: datetime) -> str:
    """Return ``when`` in UTC as ``YYYY-MM-DDTHH:MM:SS.mmmZ``."""
    utc = when.astimezone(timezone.utc) if when.tzinfo else when.replace(tzinfo=timezone.utc)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def build_envelope(delivery_id: str, execution: Execution) -> bytes:
    """Return the exact bytes to sign and POST for ``execution``'s terminal state."""
    data: dict[str, Any] = {
        "delivery_id": delivery_id,
        "execution_id": execution.execution_id,
        "workflow_name": execution.workflow_name,
        "workflow_id": execution.workflow_id,
        "state": execution.state.value,
    }
    if execution.state is ExecutionState.COMPLETED:
        data["result"] = execution.output
    elif execution.error is not None:
        data["error"] = execution.error
    if execution.completed_at is not None:
        data["completed_at"] = rfc3339_ms(execution.completed_at)
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def headers_for(secret: CallbackSecret, body: bytes, now: datetime) -> dict[str, str]:
    """Return the headers of one attempt: content type, signature and a fresh timestamp."""
    return {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: secret.sign(body),
        TIMESTAMP_HEADER: rfc3339_ms(now),
    }
