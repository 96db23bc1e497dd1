"""The SSRF policy: which webhook targets may be sent to. Pure: no network, no Flask.

A target is checked twice. :func:`check_url` runs when a subscription is created or changed and
before every attempt: the scheme, userinfo, names that are loopback by definition and IP-literal
hosts in every spelling a resolver accepts (``127.1``, ``2130706433``, ``0x7f.1``,
``[::ffff:127.0.0.1]``). It never resolves DNS: an answer checked then could differ from the one
used to connect (time of check, time of use). The transport resolves the host when it connects,
refuses unless :func:`check_address` passes every address, and connects to a checked one.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from dataclasses import dataclass
from typing import TypeAlias
from urllib.parse import SplitResult, urlsplit

from ..errors import InvalidFieldError

IPAddress: TypeAlias = "ipaddress.IPv4Address | ipaddress.IPv6Address"
IPNetwork: TypeAlias = "ipaddress.IPv4Network | ipaddress.IPv6Network"

#: The longest target URL accepted anywhere (model, API schemas, SQL column).
MAX_URL_LENGTH = 2048
_NAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")
_NUMBER = re.compile(r"0x[0-9a-f]*|[0-9]+")
_LOCALHOST_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


class SsrfRejection(str, enum.Enum):
    """Why a target is refused."""

    INVALID_URL = "invalid_url"
    SCHEME = "scheme"
    HTTPS_REQUIRED = "https_required"
    USERINFO = "userinfo"
    LOCALHOST_NAME = "localhost_name"
    LOOPBACK_ADDRESS = "loopback_address"
    PRIVATE_ADDRESS = "private_address"
    LINK_LOCAL_ADDRESS = "link_local_address"
    MULTICAST_ADDRESS = "multicast_address"
    #: Unspecified, broadcast, documentation, benchmarking, tunnels, anything else not public.
    RESERVED_ADDRESS = "reserved_address"
    DENIED_ADDRESS = "denied_address"


#: How an operator allows a refused address (a policy names another where it has other keys).
ALLOW_HINT = (
    "allow it with HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS (development) or HARVEST_WEBHOOKS_ALLOW_CIDRS"
)
#: The hint of the policy of tenants' endpoints, which the two keys above do not open.
TENANT_ALLOW_HINT = "allow it for tenants' endpoints with HARVEST_WEBHOOKS_TENANT_ALLOW_CIDRS"
_EXPLANATIONS = {
    SsrfRejection.INVALID_URL: "not an absolute URL with a valid host",
    SsrfRejection.SCHEME: "only http:// and https:// targets are allowed",
    SsrfRejection.HTTPS_REQUIRED: "HARVEST_WEBHOOKS_HTTPS_ONLY allows only https:// targets",
    SsrfRejection.USERINFO: "credentials in the URL (user:password@) are not allowed",
    SsrfRejection.LOCALHOST_NAME: "the host name always means this machine",
    SsrfRejection.LOOPBACK_ADDRESS: "a loopback address; {hint}",
    SsrfRejection.PRIVATE_ADDRESS: "a private network address; {hint}",
    SsrfRejection.LINK_LOCAL_ADDRESS: "a link-local address, where cloud metadata lives; {hint}",
    SsrfRejection.MULTICAST_ADDRESS: "a multicast address",
    SsrfRejection.RESERVED_ADDRESS: "a reserved or non-public address; {hint}",
    SsrfRejection.DENIED_ADDRESS: "the address is in HARVEST_WEBHOOKS_DENY_CIDRS",
}


#: Why a target is refused, told to the person who typed it (a customer in the portal), who can
#: change the URL but not the app's settings.
_PUBLIC_EXPLANATIONS = {
    SsrfRejection.INVALID_URL: "it is not a full URL such as https://example.com/webhooks",
    SsrfRejection.SCHEME: "only http:// and https:// URLs can receive events",
    SsrfRejection.HTTPS_REQUIRED: "only https:// URLs can receive events",
    SsrfRejection.USERINFO: "a URL may not hold a user name or password (user:password@)",
    SsrfRejection.LOCALHOST_NAME: "it names the server itself, not a machine of yours",
    SsrfRejection.LOOPBACK_ADDRESS: "it is a loopback address (the server itself); use a public address",
    SsrfRejection.PRIVATE_ADDRESS: "it is a private network address, not reachable from the internet",
    SsrfRejection.LINK_LOCAL_ADDRESS: "it is a link-local address, not reachable from the internet",
    SsrfRejection.MULTICAST_ADDRESS: "it is a multicast address",
    SsrfRejection.RESERVED_ADDRESS: "it is a reserved address, not reachable from the internet",
    SsrfRejection.DENIED_ADDRESS: "events may not be sent to that address",
}


def public_reason(reason: SsrfRejection) -> str:
    """Why a target is refused, in words for whoever typed the URL (no setting named). Pure."""
    return _PUBLIC_EXPLANATIONS[reason]


#: A refusal as :func:`describe` words it, in a delivery's recorded error.
_REFUSAL = re.compile(r"is refused by the SSRF policy \(([a-z_]+)\)")


def public_error(error: str) -> str:
    """A delivery's recorded error as the endpoint's owner may read it: a refusal by the SSRF
    policy without the address the host resolved to or the settings that would allow it (the
    owner is not the operator), any other error as it is. Pure."""
    found = _REFUSAL.search(error)
    if found is None:
        return error
    try:
        reason = SsrfRejection(found.group(1))
    except ValueError:
        return "the address is refused"
    return f"the address is refused: {public_reason(reason)}"


@dataclass(frozen=True)
class SsrfPolicy:
    """What :func:`check_url` and :func:`check_address` let through.

    :param allow_private: allow every non-public address (loopback included): development and tests.
    :param https_only: refuse ``http://`` targets.
    :param allow_cidrs: networks allowed even though they are not public.
    :param deny_cidrs: networks always refused; they win over ``allow_cidrs`` and ``allow_private``.

    A network matches an address and the IPv4 addresses embedded in it (IPv4-mapped and
    IPv4-compatible, NAT64, 6to4, Teredo): one denied address denies it, and it is allowed only if
    every embedded address is.
    """

    allow_private: bool = False
    https_only: bool = False
    allow_cidrs: tuple[IPNetwork, ...] = ()
    deny_cidrs: tuple[IPNetwork, ...] = ()
    #: How a refusal tells the operator to allow an address (the keys that open this policy).
    allow_hint: str = ALLOW_HINT


def parse_cidrs(text: str) -> tuple[IPNetwork, ...]:
    """Parse comma-separated networks such as ``"10.1.0.0/16, fd00::/8"``; a bare address is a /32.

    :raises ValueError: an item is not a network, or has host bits set (``10.0.0.1/8``).
    """
    return tuple(ipaddress.ip_network(item.strip()) for item in text.split(",") if item.strip())


def describe(
    reason: SsrfRejection, url: str | None = None, address: str | None = None, *, hint: str = ALLOW_HINT
) -> str:
    """Say why a target is refused, naming the reason and how to allow it (``hint``: the policy's
    :attr:`~SsrfPolicy.allow_hint`); of the URL only ``scheme://host:port``."""
    subject = _origin(url) or "the target"
    if address is not None:
        subject += f" (resolved to {address})"
    explanation = _EXPLANATIONS[reason].format(hint=hint)
    return f"{subject} is refused by the SSRF policy ({reason.value}): {explanation}"


class SsrfError(InvalidFieldError):
    """A target URL is refused by the SSRF policy.

    :param reason: why, as :class:`SsrfRejection`; also the ``reason`` attribute.
    :param url: the refused URL; the message shows only its scheme, host and port.
    :param address: the resolved address that was refused, when the check was at connect time.
    """

    def __init__(
        self,
        reason: SsrfRejection,
        url: str | None = None,
        *,
        address: str | None = None,
        field: str = "target_url",
        hint: str = ALLOW_HINT,
    ) -> None:
        super().__init__(field, describe(reason, url, address, hint=hint))
        self.reason = reason
        self.address = address
        self.hint = hint


def validate_target(url: str, policy: SsrfPolicy) -> None:
    """Raise :class:`SsrfError` unless ``url`` passes :func:`check_url`; no DNS is resolved.

    Call it wherever a subscription's target is set (API, CLI); the transport checks again when
    it connects.
    """
    reason = check_url(url, policy)
    if reason is not None:
        raise SsrfError(reason, url, hint=policy.allow_hint)


def parse_url(url: object) -> SplitResult | SsrfRejection:
    """Return ``url`` split, or why it is not an absolute http(s) URL (``INVALID_URL`` or ``SCHEME``).

    The one syntax check of a target URL, shared by the subscription model and :func:`check_url`:
    a string of at most :data:`MAX_URL_LENGTH` printable characters without spaces or backslashes,
    a valid port other than 0, and a host.
    """
    if (
        not isinstance(url, str)
        or len(url) > MAX_URL_LENGTH
        or "\\" in url
        or any(c.isspace() or not c.isprintable() for c in url)
    ):
        return SsrfRejection.INVALID_URL
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return SsrfRejection.INVALID_URL
    if parts.scheme.lower() not in ("http", "https"):
        return SsrfRejection.SCHEME
    if port == 0 or not parts.hostname:
        return SsrfRejection.INVALID_URL
    return parts


@dataclass(frozen=True)
class Target:
    """A target URL as a resolver would see it, from :func:`parse_target`.

    :param scheme: ``http`` or ``https``, lower case.
    :param host: the host name in lower-case IDNA form without a trailing dot, or the literal
        address in whatever spelling the URL used (``0x7f.1`` is ``127.0.0.1``).
    :param port: the explicit port, or ``None``.
    :param userinfo: whether the URL carries ``user:password@``.
    """

    scheme: str
    host: str | IPAddress
    port: int | None
    userinfo: bool

    @property
    def effective_port(self) -> int:
        """The port a connection uses: the explicit one, else 443 or 80."""
        if self.port is not None:
            return self.port
        return 443 if self.scheme == "https" else 80


def parse_target(url: object) -> Target | SsrfRejection:
    """Return ``url``'s scheme, host (name or literal address) and port, or why it is refused.

    The one parser of target URLs: :func:`check_url` and the completion-callback policy build on
    it. Refuses what is not an absolute http(s) URL (``INVALID_URL``, ``SCHEME``) and names that are
    loopback by definition (``LOCALHOST_NAME``); it does not judge addresses or resolve names.
    """
    parts = parse_url(url)
    if isinstance(parts, SsrfRejection):
        return parts
    host = _host(parts.hostname or "")
    if isinstance(host, SsrfRejection):
        return host
    return Target(parts.scheme.lower(), host, parts.port, "@" in parts.netloc)


def check_url(url: str, policy: SsrfPolicy) -> SsrfRejection | None:
    """Return why ``url`` is refused, or ``None``; IP-literal hosts are checked, names are not resolved."""
    parts = parse_url(url)
    if isinstance(parts, SsrfRejection):
        return parts
    if policy.https_only and parts.scheme.lower() != "https":
        return SsrfRejection.HTTPS_REQUIRED
    if "@" in parts.netloc:
        return SsrfRejection.USERINFO
    target = parse_target(url)
    if isinstance(target, SsrfRejection):
        return target
    if isinstance(target.host, str):
        return None
    return check_address(target.host, policy)


def check_address(ip: IPAddress, policy: SsrfPolicy) -> SsrfRejection | None:
    """Return why a connection to ``ip`` is refused, or ``None`` when it is allowed.

    An address that embeds IPv4 addresses (IPv4-mapped or -compatible, NAT64, 6to4, Teredo) is
    allowed only if every address embedded in it would be allowed on its own: a Teredo address
    whose server is in ``allow_cidrs`` but whose client is the metadata service is refused.
    """
    embedded = _embedded_ipv4(ip)
    candidates = [ip, *embedded]
    if any(a in net for a in candidates for net in policy.deny_cidrs):
        return SsrfRejection.DENIED_ADDRESS
    if policy.allow_private:
        return None
    if not any(a in net for a in candidates for net in policy.allow_cidrs):
        return _classify(ip)
    # Allowed by the list, but the packets reach the embedded addresses: each must pass on its own,
    # so neither an allowed IPv6 network nor one allowed end of a tunnel vouches for the others.
    for inner in embedded:
        reason = check_address(inner, policy)
        if reason is not None:
            return reason
    return None


def _host(hostname: str) -> str | IPAddress | SsrfRejection:
    """Return the name to resolve, the literal address, or why the host is refused outright."""
    host = hostname.lower()
    if ":" in host:  # urlsplit accepted a bracketed host: it must be an IPv6 address, without a zone
        try:
            return SsrfRejection.INVALID_URL if "%" in host else ipaddress.IPv6Address(host)
        except ValueError:
            return SsrfRejection.INVALID_URL
    if not host.isascii():  # resolvers see the IDNA form: "ⓛocalhost" is "localhost"
        try:
            host = host.encode("idna").decode("ascii").lower()
        except UnicodeError:
            return SsrfRejection.INVALID_URL
    host = host.rstrip(".")
    if len(host) > 253 or not _NAME.fullmatch(host):
        return SsrfRejection.INVALID_URL
    if host in _LOCALHOST_NAMES or host.endswith(".localhost"):
        return SsrfRejection.LOCALHOST_NAME
    try:
        number = _inet_aton(host)
    except ValueError:
        return SsrfRejection.INVALID_URL
    return host if number is None else ipaddress.IPv4Address(number)


def _origin(url: str | None) -> str | None:
    """Return ``scheme://host:port`` of ``url``: never its path, query or credentials."""
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    host = parts.hostname
    if not parts.scheme:
        return None
    if not host or len(host) > 253 or not host.isprintable():
        return f"a {parts.scheme.lower()}: URL"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme.lower()}://{host}" + (f":{port}" if port is not None else "")


_REDACTED = "***"


def redact_url(url: str) -> str:
    """Return ``url`` as it may be shown or logged: credentials (``user:pass@``), query values and
    the fragment become ``***``; the scheme, host, port, path and query names stay.

    Split by hand rather than with ``urlsplit``, which refuses some URLs (a bad port, an unclosed
    bracket) that must still be shown without their secrets. Only for display: the stored URL and
    the URL a request goes to are never redacted.
    """
    text, hash_mark, fragment = str(url).partition("#")
    text, question, query = text.partition("?")
    scheme, slashes, rest = text.partition("://")
    if slashes:
        authority, slash, path = rest.partition("/")
        if "@" in authority:
            authority = _REDACTED + "@" + authority.rpartition("@")[2]
        text = scheme + slashes + authority + slash + path
    if question:
        params = [p.partition("=") for p in query.split("&")]
        query = "&".join(
            f"{name}={_REDACTED}" if eq else (_REDACTED if name else "") for name, eq, _ in params
        )
    return text + question + query + (hash_mark + _REDACTED if fragment else hash_mark)


def _inet_aton(host: str) -> int | None:
    """Parse ``host`` as ``inet_aton`` does (1 to 4 parts, decimal, octal or hex); ``None`` if a name.

    A host whose last label is a number is an address or invalid, as in the WHATWG URL standard.
    """
    labels = host.split(".")
    if not _NUMBER.fullmatch(labels[-1]):
        return None
    if len(labels) > 4 or not all(_NUMBER.fullmatch(label) for label in labels):
        raise ValueError(host)
    numbers = [
        int(label[2:] or "0", 16) if label.startswith("0x") else int(label, 8 if label[0] == "0" else 10)
        for label in labels
    ]
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (4 - len(head)):
        raise ValueError(host)
    return sum(n << (8 * (3 - i)) for i, n in enumerate(head)) + last


def _nets(*cidrs: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(cidr) for cidr in cidrs)


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
# First match wins; the address of a tunnel or NAT64 is checked by the IPv4 address inside it.
_BLOCKED = (
    (SsrfRejection.LOOPBACK_ADDRESS, _nets("127.0.0.0/8", "::1/128")),
    (SsrfRejection.LINK_LOCAL_ADDRESS, _nets("169.254.0.0/16", "fe80::/10")),
    (
        SsrfRejection.PRIVATE_ADDRESS,
        _nets(
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "100.64.0.0/10",  # carrier-grade NAT
            "fc00::/7",  # unique local
            "fec0::/10",  # site-local
            "64:ff9b:1::/48",  # local-use NAT64
        ),
    ),
    (SsrfRejection.MULTICAST_ADDRESS, _nets("224.0.0.0/4", "ff00::/8")),
    (
        SsrfRejection.RESERVED_ADDRESS,
        _nets(
            "0.0.0.0/8",
            "192.0.0.0/24",
            "192.0.2.0/24",
            "192.88.99.0/24",
            "198.18.0.0/15",
            "198.51.100.0/24",
            "203.0.113.0/24",
            "240.0.0.0/4",  # with 255.255.255.255
            "::/96",  # unspecified, IPv4-compatible
            "100::/64",
            "2001::/23",
            "2001:db8::/32",
            "2002::/16",
            "3fff::/20",
        ),
    ),
)


def _embedded_ipv4(ip: IPAddress) -> list[ipaddress.IPv4Address]:
    """Return the IPv4 addresses that packets to ``ip`` may reach through a mapping or a tunnel."""
    if isinstance(ip, ipaddress.IPv4Address):
        return []
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip in _NAT64 or (ip in _IPV4_COMPATIBLE and int(ip) > 1):  # "::" and "::1" embed nothing
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    return list(ip.teredo or ())


def _classify(ip: IPAddress) -> SsrfRejection | None:
    # IPv4-compatible addresses are deprecated (RFC 4291): reserved, whatever they embed. What
    # they embed matters to the allow and deny lists only.
    inner = [] if ip in _IPV4_COMPATIBLE else _embedded_ipv4(ip)
    if inner:
        for address in inner:
            reason = _classify(address)
            if reason is not None:
                return reason
        # NAT64 reaches the embedded address; 6to4 and Teredo relays could reach anything.
        tunnel = isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is None and ip not in _NAT64
        return SsrfRejection.RESERVED_ADDRESS if tunnel else None
    for reason, networks in _BLOCKED:
        if any(ip in network for network in networks):
            return reason
    if ip.is_multicast:
        return SsrfRejection.MULTICAST_ADDRESS
    if not ip.is_global or ip.is_reserved:
        return SsrfRejection.RESERVED_ADDRESS
    return None
