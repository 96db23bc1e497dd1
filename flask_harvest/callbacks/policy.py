"""The completion-callback SSRF policy: HTTPS only, an allowlist, no IP literals. Pure.

Built on :func:`flask_harvest.outbound.ssrf.parse_target`, the one parser of target URLs, and on
:func:`flask_harvest.outbound.ssrf.check_address` for literal addresses. No DNS is resolved here: a name is
judged by its spelling, and the transport's connect-time guard checks every address it resolves to.

A rejection is a :class:`Rejection`, a typed value with a JSON form (``{"type": "HostNotAllowed",
...}``), never a bare string.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from ..errors import ConfigurationError
from ..outbound.ssrf import IPAddress, SsrfPolicy, SsrfRejection, check_address, parse_target

__all__ = ["CallbackPolicy", "HostPattern", "Rejection", "RejectionType", "parse_allowlist"]


class RejectionType(str, enum.Enum):
    """Why a callback target is refused; the value is the ``type`` of the JSON form."""

    INVALID_URL = "InvalidUrl"
    SCHEME_NOT_ALLOWED = "SchemeNotAllowed"
    USERINFO = "UserinfoNotAllowed"
    LOCALHOST_NAME = "LocalhostName"
    IP_LITERAL = "IpLiteralNotAllowed"
    BLOCKED_ADDRESS = "BlockedAddress"
    NO_ALLOWLIST = "NoAllowlist"
    HOST_NOT_ALLOWED = "HostNotAllowed"
    PORT_NOT_ALLOWED = "PortNotAllowed"


_MESSAGES = {
    RejectionType.INVALID_URL: "not an absolute http(s) URL with a valid host",
    RejectionType.SCHEME_NOT_ALLOWED: (
        "only https:// targets are allowed (HARVEST_COMPLETION_CALLBACK_ALLOW_HTTP allows http://; "
        "HARVEST_COMPLETION_CALLBACK_ALLOW_PRIVATE_TARGETS allows it to loopback and private addresses only)"
    ),
    RejectionType.USERINFO: "credentials in the URL (user:password@) are not allowed",
    RejectionType.LOCALHOST_NAME: "the host name always means this machine",
    RejectionType.IP_LITERAL: "IP-literal hosts are refused (HARVEST_COMPLETION_CALLBACK_ALLOW_IP_LITERALS)",
    RejectionType.BLOCKED_ADDRESS: (
        "loopback, private, link-local, CGNAT, ULA and reserved addresses are refused"
    ),
    RejectionType.NO_ALLOWLIST: "no allowlist is configured (HARVEST_COMPLETION_CALLBACK_ALLOWLIST)",
    RejectionType.HOST_NOT_ALLOWED: "the host is not on HARVEST_COMPLETION_CALLBACK_ALLOWLIST",
    RejectionType.PORT_NOT_ALLOWED: "the port conflicts with the allowlist entry's :port",
}


@dataclass(frozen=True)
class Rejection:
    """Why a target URL is refused: machine-readable, with a JSON form (:meth:`to_json`).

    :param type: the kind of refusal.
    :param host: the host as judged (lower-case IDNA name or the address), when there is one.
    :param port: the port the connection would use, for ``PortNotAllowed``.
    :param address_class: the SSRF class of a refused literal address (``loopback_address``...).
    """

    type: RejectionType
    host: str | None = None
    port: int | None = None
    address_class: str | None = None

    @property
    def message(self) -> str:
        subject = f"host {self.host!r}" if self.host is not None else "the URL"
        detail = _MESSAGES[self.type]
        if self.address_class is not None:
            detail += f" ({self.address_class})"
        if self.port is not None:
            detail += f" (port {self.port})"
        return f"{subject} is refused: {detail}"

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form: ``type`` first, then the fields that apply, then ``message``."""
        data: dict[str, Any] = {"type": self.type.value}
        if self.host is not None:
            data["host"] = self.host
        if self.port is not None:
            data["port"] = self.port
        if self.address_class is not None:
            data["address_class"] = self.address_class
        data["message"] = self.message
        return data


@dataclass(frozen=True)
class HostPattern:
    """One allowlist entry: an exact host or ``*.suffix``, with an optional ``:port``."""

    host: str
    wildcard: bool = False
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return ("*." if self.wildcard else "") + host + (f":{self.port}" if self.port is not None else "")

    def matches_host(self, host: str) -> bool:
        """Whether ``host`` (normalised) is this entry's host; a wildcard needs one more label."""
        if self.wildcard:
            return host.endswith("." + self.host) and len(host) > len(self.host) + 1
        return host == self.host

    @classmethod
    def parse(cls, text: str) -> HostPattern:
        """Parse ``api.example.com``, ``*.example.com``, ``hooks.example.com:8443`` or ``[2001:db8::1]:443``.

        The host is normalised as a URL's is (lower case, IDNA, no trailing dot).

        :raises ValueError: not a host pattern.
        """
        raw = text.strip()
        wildcard = raw.startswith("*.")
        body = raw[2:] if wildcard else raw
        if not body or "*" in body or "/" in body or "@" in body:
            raise ValueError(f"{text!r} is not a host, *.suffix or host:port")
        target = parse_target(f"https://{body}/")
        if isinstance(target, SsrfRejection):
            raise ValueError(f"{text!r} is not a host, *.suffix or host:port ({target.value})")
        host = target.host if isinstance(target.host, str) else str(target.host)
        if isinstance(target.host, str) and _sent_host(f"https://{body}/") != host:
            raise ValueError(f"{text!r}: the transport would reach another host; write its xn-- form")
        port = target.port
        if wildcard and not isinstance(_as_address(host), str):
            raise ValueError(f"{text!r}: a wildcard takes a domain suffix, not an address")
        return cls(host, wildcard, port)


def _sent_host(url: str) -> str | None:
    """The host name the transport connects to for ``url``, or ``None`` if it cannot send there.

    requests reads a URL with urllib3, whose IDNA (2008) differs from the IDNA 2003 of
    :func:`flask_harvest.outbound.ssrf.parse_target` for some names (``faß`` is ``xn--fa-hia``, not
    ``fass``) and which refuses others outright (``ⓗooks``, ideographic full stops). The policy
    allows a name only when both read it alike, so the host judged is the host the POST goes to.
    """
    try:
        host = parse_url(url).host
    except (ValueError, LocationParseError):
        return None
    if host is None:
        return None
    host = host.lower()
    return host[:-1] if host.endswith(".") else host


def _as_address(host: str) -> str | IPAddress:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return host


def parse_allowlist(entries: str | Iterable[str]) -> tuple[HostPattern, ...]:
    """Parse a comma-separated string (or a list) of host patterns.

    :raises ConfigurationError: an entry is not a pattern; the message names it.
    """
    items = entries.split(",") if isinstance(entries, str) else list(entries)
    patterns = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigurationError(
                f"HARVEST_COMPLETION_CALLBACK_ALLOWLIST entries are strings, not {item!r}"
            )
        if not item.strip():
            continue
        try:
            patterns.append(HostPattern.parse(item))
        except ValueError as exc:
            raise ConfigurationError(f"HARVEST_COMPLETION_CALLBACK_ALLOWLIST: {exc}") from None
    return tuple(patterns)


@dataclass(frozen=True)
class CallbackPolicy:
    """Which completion-callback targets are allowed.

    :param allowlist: the allowed hosts; empty refuses every target.
    :param allow_http: accept ``http://`` to any allowed target (not recommended).
    :param allow_ip_literals: accept an address as the host if it is on the allowlist; loopback,
        private, link-local, CGNAT, ULA and reserved addresses stay refused.
    :param allow_private: development and tests only: IP literals and non-public addresses
        (loopback included) are accepted, and ``http://`` to those addresses (not to a name, nor
        to a public address: that takes ``allow_http``). The allowlist still applies, and names
        that mean this machine (``localhost``) stay refused: use ``127.0.0.1``.
    """

    allowlist: tuple[HostPattern, ...] = ()
    allow_http: bool = False
    allow_ip_literals: bool = False
    allow_private: bool = False

    @property
    def ssrf_policy(self) -> SsrfPolicy:
        """The policy of the transport's connect-time guard (every resolved address must pass it)."""
        return SsrfPolicy(allow_private=self.allow_private, https_only=not self.http_allowed)

    @property
    def http_allowed(self) -> bool:
        """Whether some ``http://`` target may pass (:meth:`check` says which)."""
        return self.allow_http or self.allow_private

    def _http_allowed_to(self, host: str | IPAddress) -> bool:
        if self.allow_http:
            return True
        # The development setting opens plain http only to the non-public addresses it opens: a
        # name could resolve to a public host, and the body would cross the internet in clear.
        return (
            self.allow_private and not isinstance(host, str) and check_address(host, SsrfPolicy()) is not None
        )

    def check(self, url: object) -> Rejection | None:
        """Return why ``url`` is refused, or ``None``. Never resolves DNS."""
        target = parse_target(url)
        if target is SsrfRejection.LOCALHOST_NAME:
            return Rejection(RejectionType.LOCALHOST_NAME)
        if isinstance(target, SsrfRejection):
            kind = (
                RejectionType.SCHEME_NOT_ALLOWED
                if target is SsrfRejection.SCHEME
                else RejectionType.INVALID_URL
            )
            return Rejection(kind)
        if target.scheme != "https" and not self._http_allowed_to(target.host):
            return Rejection(RejectionType.SCHEME_NOT_ALLOWED)
        if target.userinfo:
            return Rejection(RejectionType.USERINFO)
        host = target.host
        if isinstance(host, str) and _sent_host(str(url)) != host:
            return Rejection(RejectionType.INVALID_URL)  # the transport would reach another host
        if not isinstance(host, str):
            if not (self.allow_ip_literals or self.allow_private):
                return Rejection(RejectionType.IP_LITERAL, host=str(host))
            reason = check_address(host, SsrfPolicy(allow_private=self.allow_private))
            if reason is not None:
                return Rejection(RejectionType.BLOCKED_ADDRESS, host=str(host), address_class=reason.value)
        name = host if isinstance(host, str) else str(host)
        if not self.allowlist:
            return Rejection(RejectionType.NO_ALLOWLIST, host=name)
        candidates = [p for p in self.allowlist if _host_matches(p, host)]
        if not candidates:
            return Rejection(RejectionType.HOST_NOT_ALLOWED, host=name)
        port = target.effective_port
        if not any(p.port is None or p.port == port for p in candidates):
            return Rejection(RejectionType.PORT_NOT_ALLOWED, host=name, port=port)
        return None


def _host_matches(pattern: HostPattern, host: str | IPAddress) -> bool:
    if isinstance(host, str):
        return pattern.matches_host(host)
    # An address matches only an exact entry for the same address, never a wildcard.
    if pattern.wildcard:
        return False
    return _as_address(pattern.host) == host
