"""The dashboard's session cookie and CSRF token, with no Flask in them.

The cookie is signed and timed with :mod:`itsdangerous` under the app's ``secret_key``. It holds a
per-session CSRF token and, once signed in, a keyed digest of the actuator token (never the token
itself): changing ``HARVEST_ACTUATOR_TOKEN`` or the secret key signs every session out.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer

#: The cookie's name; its path is the dashboard's prefix, so no other page of the app receives it.
COOKIE_NAME = "harvest_dashboard"
_SALT = "flask-harvest.dashboard.session"
_DIGEST_CONTEXT = b"flask-harvest dashboard sign-in\x00"
#: The longest cookie value read; anything longer is not one we set.
MAX_COOKIE_CHARS = 1024


@dataclass(frozen=True)
class DashboardSession:
    """What the cookie holds: the CSRF token, and the sign-in digest (empty when signed out)."""

    csrf: str
    auth: str = ""

    @classmethod
    def new(cls) -> DashboardSession:
        return cls(csrf=secrets.token_urlsafe(32))

    def __repr__(self) -> str:
        # Neither value is a secret on its own, but neither belongs in a log.
        return f"<DashboardSession signed_in={bool(self.auth)}>"


def token_digest(secret_key: str | bytes, token: str) -> str:
    """Return the keyed digest of ``token`` that a signed-in cookie carries."""
    key = secret_key.encode("utf-8", "surrogatepass") if isinstance(secret_key, str) else secret_key
    message = _DIGEST_CONTEXT + token.encode("utf-8", "surrogatepass")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def digest_matches(session: DashboardSession, secret_key: str | bytes, token: str) -> bool:
    """Whether ``session`` was signed in with ``token`` (in constant time)."""
    if not token or not session.auth:
        return False
    return hmac.compare_digest(session.auth, token_digest(secret_key, token))


def csrf_matches(session: DashboardSession, sent: str | None) -> bool:
    """Whether a form's ``csrf_token`` is this session's (in constant time)."""
    if not sent or not isinstance(sent, str):
        return False
    return hmac.compare_digest(
        session.csrf.encode("utf-8", "surrogatepass"), sent.encode("utf-8", "surrogatepass")
    )


def _serializer(secret_key: str | bytes) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(secret_key, salt=_SALT)


def dump_session(session: DashboardSession, secret_key: str | bytes) -> str:
    """Return the signed cookie value of ``session``."""
    return _serializer(secret_key).dumps({"c": session.csrf, "a": session.auth})


def load_session(value: str | None, secret_key: str | bytes, max_age: float) -> DashboardSession | None:
    """Return the session a cookie value holds, or ``None`` when it is missing, forged, expired or
    not one we made."""
    if not value or len(value) > MAX_COOKIE_CHARS:
        return None
    try:
        data = _serializer(secret_key).loads(value, max_age=int(max_age))
    except (BadSignature, UnicodeError, ValueError):  # SignatureExpired is a BadSignature
        return None
    if not isinstance(data, dict):
        return None
    csrf, auth = data.get("c"), data.get("a")
    if not isinstance(csrf, str) or len(csrf) < 32 or not isinstance(auth, str):
        return None
    return DashboardSession(csrf=csrf, auth=auth)
