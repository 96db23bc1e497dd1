"""The portal's links and session cookie, with no Flask in them.

A link carries a tenant id, signed and timed with :mod:`itsdangerous` under the portal's key; the
session cookie it opens carries the same tenant and a per-session CSRF token, signed under the
same key with another salt (a link is never a cookie, nor the reverse). Changing the key ends
every link and session at once: that is how access is revoked.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from typing import TypeGuard

from itsdangerous import BadSignature, URLSafeTimedSerializer

from ..errors import InvalidFieldError
from ..webhooks.tenants import validate_tenant

#: The cookie's name; its path is the portal's prefix, so no other page of the app receives it.
COOKIE_NAME = "harvest_portal"
_LINK_SALT = "flask-harvest.portal.link"
_SESSION_SALT = "flask-harvest.portal.session"
#: The longest link token or cookie value read; anything longer is not one we made.
MAX_TOKEN_CHARS = 2048


@dataclass(frozen=True)
class PortalSession:
    """What the cookie holds: the one tenant it may see, and the CSRF token of its forms."""

    tenant: str
    csrf: str

    @classmethod
    def new(cls, tenant: str) -> PortalSession:
        return cls(tenant=tenant, csrf=secrets.token_urlsafe(32))

    def __repr__(self) -> str:
        # The CSRF token guards the forms: it belongs in no log.
        return f"<PortalSession tenant={self.tenant!r}>"


def _serializer(key: str | bytes, salt: str) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(key, salt=salt)


def make_link_token(tenant: str, key: str | bytes, *, expires_at: float) -> str:
    """Return the signed token of a portal link for ``tenant``, good until ``expires_at`` (a Unix
    time)."""
    return _serializer(key, _LINK_SALT).dumps({"t": tenant, "e": int(expires_at)})


def read_link_token(token: object, key: str | bytes, max_age: float, *, now: float) -> str | None:
    """Return the tenant of a link token, or ``None`` when it is missing, forged, expired (at
    ``now``, or older than ``max_age`` seconds whatever it says), signed with another key or not
    one we made."""
    data = _load(token, key, _LINK_SALT, max_age)
    if data is None:
        return None
    tenant, expires_at = data.get("t"), data.get("e")
    if isinstance(expires_at, bool) or not isinstance(expires_at, int) or expires_at <= now:
        return None
    return tenant if _is_tenant(tenant) else None


def dump_session(session: PortalSession, key: str | bytes) -> str:
    """Return the signed cookie value of ``session``."""
    return _serializer(key, _SESSION_SALT).dumps({"t": session.tenant, "c": session.csrf})


def load_session(value: object, key: str | bytes, max_age: float) -> PortalSession | None:
    """Return the session a cookie value holds, or ``None`` when it is missing, forged, expired or
    not one we made."""
    data = _load(value, key, _SESSION_SALT, max_age)
    if data is None:
        return None
    tenant, csrf = data.get("t"), data.get("c")
    if not _is_tenant(tenant) or not isinstance(csrf, str) or len(csrf) < 32:
        return None
    return PortalSession(tenant=tenant, csrf=csrf)


def csrf_matches(session: PortalSession, sent: object) -> bool:
    """Whether a form's ``csrf_token`` is this session's (in constant time)."""
    if not sent or not isinstance(sent, str):
        return False
    return hmac.compare_digest(
        session.csrf.encode("utf-8", "surrogatepass"), sent.encode("utf-8", "surrogatepass")
    )


def _load(value: object, key: str | bytes, salt: str, max_age: float) -> dict[str, object] | None:
    if not isinstance(value, str) or not value or len(value) > MAX_TOKEN_CHARS:
        return None
    try:
        data = _serializer(key, salt).loads(value, max_age=int(max_age))
    except (BadSignature, UnicodeError, ValueError):  # SignatureExpired is a BadSignature
        return None
    return data if isinstance(data, dict) else None


def _is_tenant(value: object) -> TypeGuard[str]:
    # Checked when the link was made; checked again because a key can be shared with code that is
    # not ours, and no row is ever "no tenant"'s through the portal.
    try:
        return validate_tenant(value) is not None
    except InvalidFieldError:
        return False
