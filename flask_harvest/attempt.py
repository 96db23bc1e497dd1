"""What one HTTP attempt came to: a response, or a failure in transit and its kind. Pure.

The transport (:mod:`flask_harvest.transport`) produces these and the outcome rules
(:mod:`flask_harvest.webhooks.outcome`) judge them; keeping them here keeps the rules free of the
HTTP client.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FailureKind(str, enum.Enum):
    """Why an attempt got no HTTP response."""

    CONNECT = "connect"
    TIMEOUT = "timeout"
    DEADLINE = "deadline"
    TLS = "tls"
    PROTOCOL = "protocol"
    #: Refused by the SSRF policy, before a request was sent; retrying cannot help.
    SSRF = "ssrf"


@dataclass(frozen=True)
class HttpResponse:
    """What the receiver answered: status, the headers we act on, the start of the body."""

    status: int
    retry_after: str | None
    body: str
    elapsed_ms: int


class TransportError(Exception):
    """The attempt got no HTTP response. The message names the kind, never the URL or a secret."""

    def __init__(self, kind: FailureKind, message: str, elapsed_ms: int) -> None:
        super().__init__(message)
        self.kind = kind
        self.elapsed_ms = elapsed_ms
