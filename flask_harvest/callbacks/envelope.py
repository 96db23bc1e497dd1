"""The completion-callback envelope and its signatures. Pure.

The body is built once, when the delivery is enqueued, and sent byte-identical on every attempt and
redrive. Fields, in this order: ``delivery_id``, ``execution_id``, ``workflow_name``,
``workflow_id``, ``state``, then ``result`` (``Completed`` only) or ``error`` (the other terminal
states, when there is one), then ``completed_at``.

Two signatures go with it: ``X-Harvest-Signature``, an HMAC of the body alone (the same on every
attempt, so it cannot vouch for the attempt's time), and the Standard Webhooks headers, whose
``webhook-signature`` covers ``webhook-id`` (the delivery id), ``webhook-timestamp`` and the body:
the timestamp a receiver checks for freshness is that signed one.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from ..errors import InvalidSecretError
from ..outbound.signing import (
    WEBHOOK_ID,
    WEBHOOK_SIGNATURE,
    WEBHOOK_TIMESTAMP,
    body_signature,
    secret_key,
    standard_signature,
)
from ..workflows.models import Execution, ExecutionState

__all__ = [
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "CallbackSecret",
    "build_envelope",
    "rfc3339_ms",
]

SIGNATURE_HEADER = "X-Harvest-Signature"
TIMESTAMP_HEADER = "X-Harvest-Timestamp"


class CallbackSecret:
    """The HMAC key of completion callbacks. Its ``repr`` and ``str`` never show it, and it is never
    written to a table, a log line or an error."""

    __slots__ = ("_key", "_standard_key")

    def __init__(self, key: bytes | str) -> None:
        raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
        if not raw:
            raise ValueError("a completion-callback secret must not be empty")
        self._key = raw
        # The Standard Webhooks key follows that convention (and the project's webhook secrets): a
        # ``whsec_`` text secret keys with its base64-decoded bytes, other text with its UTF-8,
        # and bytes are the key itself, as the standardwebhooks library takes them.
        try:
            self._standard_key = secret_key(key) if isinstance(key, str) else raw
        except InvalidSecretError as exc:  # its message never quotes the secret
            raise ValueError(f"a completion-callback secret {exc.message}") from None

    def __repr__(self) -> str:
        return "CallbackSecret('***')"

    __str__ = __repr__

    def __reduce__(self) -> Any:  # never pickled into a job or a cache
        raise TypeError("a CallbackSecret cannot be pickled")

    def sign(self, body: bytes) -> str:
        """Return ``sha256=<lowercase hex HMAC-SHA256 of body>``."""
        return body_signature(self._key, body)

    def standard_sign(self, msg_id: str, timestamp: int, body: bytes) -> str:
        """Return the ``webhook-signature`` of ``msg_id.timestamp.body`` (``v1,<base64>``)."""
        return standard_signature(self._standard_key, msg_id, timestamp, body)


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


def headers_for(secret: CallbackSecret, delivery_id: str, body: bytes, now: datetime) -> dict[str, str]:
    """Return the headers of one attempt: content type, the body's signature, the attempt's time,
    and the Standard Webhooks headers (``webhook-id`` is the delivery id)."""
    utc = now.astimezone(timezone.utc) if now.tzinfo else now.replace(tzinfo=timezone.utc)
    timestamp = int(utc.timestamp())
    return {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: secret.sign(body),
        TIMESTAMP_HEADER: rfc3339_ms(utc),
        WEBHOOK_ID: delivery_id,
        WEBHOOK_TIMESTAMP: str(timestamp),
        WEBHOOK_SIGNATURE: secret.standard_sign(delivery_id, timestamp, body),
    }
