"""Webhook signatures: the Stripe-style header and Standard Webhooks, to sign and to verify.

Pure functions with no I/O. Timestamps are integer Unix seconds. A secret of the Standard Webhooks
form ``whsec_<base64>`` keys the HMAC with its decoded bytes; any other secret keys it with its UTF-8
bytes. The Stripe-style header is always keyed with the secret string's UTF-8 bytes, as Stripe does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping, Sequence

from .errors import InvalidSecretError, SignatureVerificationError

SECRET_PREFIX = "whsec_"  # noqa: S105 (a prefix, not a secret)
DEFAULT_TOLERANCE_SECONDS = 300
DEFAULT_SIGNATURE_HEADER = "Autumn-Signature"

WEBHOOK_ID = "webhook-id"
WEBHOOK_TIMESTAMP = "webhook-timestamp"
WEBHOOK_SIGNATURE = "webhook-signature"


def generate_secret() -> str:
    """Return a new Standard Webhooks secret: ``whsec_`` and the base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def secret_key(secret: str) -> bytes:
    """Return the HMAC key that Standard Webhooks signatures use for ``secret``.

    :raises InvalidSecretError: the secret is empty, or a ``whsec_`` secret is not valid base64.
    """
    if not secret:
        raise InvalidSecretError("must not be empty; generate one with flask_harvest.generate_secret()")
    if not secret.startswith(SECRET_PREFIX):
        return secret.encode("utf-8")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if not key:
        # The message must not echo the secret: it may be a real one with a typo.
        raise InvalidSecretError(
            "a secret starting with 'whsec_' must continue with non-empty standard base64; "
            "generate one with flask_harvest.generate_secret(), or drop the 'whsec_' prefix "
            "to use the string's own bytes as the key"
        )
    return key


def _hmac_sha256(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def standard_signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """Return one Standard Webhooks signature entry, ``v1,<base64 HMAC>``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(_hmac_sha256(secret_key(secret), signed)).decode("ascii")


def stripe_signature(secret: str, timestamp: int, body: bytes) -> str:
    """Return the lowercase hex HMAC-SHA256 of ``{timestamp}.{body}`` keyed by ``secret``."""
    if not secret:
        raise InvalidSecretError("must not be empty; generate one with flask_harvest.generate_secret()")
    signed = f"{timestamp}.".encode() + body
    return _hmac_sha256(secret.encode("utf-8"), signed).hex()


def sign_headers(
    secrets_: Sequence[str],
    msg_id: str,
    timestamp: int,
    body: bytes,
    *,
    signature_header: str = DEFAULT_SIGNATURE_HEADER,
) -> dict[str, str]:
    """Return the signature headers of one delivery attempt.

    Several secrets (during a rotation) give several signatures: space-separated in
    ``webhook-signature`` and several ``v1=`` entries in the Stripe-style header, so a receiver that
    knows either secret verifies the request.
    """
    if not secrets_:
        raise InvalidSecretError("at least one secret is needed to sign", field="secrets")
    standard = " ".join(standard_signature(s, msg_id, timestamp, body) for s in secrets_)
    stripe = ",".join(f"v1={stripe_signature(s, timestamp, body)}" for s in secrets_)
    return {
        WEBHOOK_ID: msg_id,
        WEBHOOK_TIMESTAMP: str(timestamp),
        WEBHOOK_SIGNATURE: standard,
        signature_header: f"t={timestamp},{stripe}",
    }


def _check_timestamp(timestamp: int, tolerance: int, now: int | None) -> None:
    current = int(time.time()) if now is None else now
    if abs(current - timestamp) > tolerance:
        raise SignatureVerificationError(
            f"timestamp is outside the tolerance of {tolerance} s (replayed or clock skew)"
        )


def _parse_timestamp(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise SignatureVerificationError("timestamp is not an integer") from None


def verify_standard(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance: int = DEFAULT_TOLERANCE_SECONDS,
    now: int | None = None,
) -> None:
    """Verify Standard Webhooks headers against the raw ``body``.

    ``headers`` is looked up with the lowercase header names, so pass a case-insensitive mapping
    (Flask's ``request.headers``) or one with lowercase keys.

    :raises SignatureVerificationError: a header is missing, the timestamp is outside
        ``tolerance`` seconds, or no signature matches.
    """
    try:
        msg_id = headers[WEBHOOK_ID]
        timestamp = _parse_timestamp(headers[WEBHOOK_TIMESTAMP])
        signatures = headers[WEBHOOK_SIGNATURE]
    except KeyError as exc:
        raise SignatureVerificationError(f"missing header {exc.args[0]}") from None
    _check_timestamp(timestamp, tolerance, now)
    expected = standard_signature(secret, msg_id, timestamp, body).encode()
    for candidate in signatures.split(" "):
        if hmac.compare_digest(candidate.encode(), expected):
            return
    raise SignatureVerificationError("no webhook-signature matches the body")


def verify_stripe(
    secret: str,
    header_value: str,
    body: bytes,
    *,
    tolerance: int = DEFAULT_TOLERANCE_SECONDS,
    now: int | None = None,
) -> None:
    """Verify a Stripe-style header value (``t=...,v1=...[,v1=...]``) against the raw ``body``.

    :raises SignatureVerificationError: the header is malformed, the timestamp is outside
        ``tolerance`` seconds, or no ``v1`` signature matches.
    """
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header_value.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            continue
        if key == "t":
            timestamp = _parse_timestamp(value)
        elif key == "v1":
            candidates.append(value)
    if timestamp is None or not candidates:
        raise SignatureVerificationError("signature header needs t= and at least one v1=")
    _check_timestamp(timestamp, tolerance, now)
    expected = stripe_signature(secret, timestamp, body).encode()
    if not any(hmac.compare_digest(c.encode(), expected) for c in candidates):
        raise SignatureVerificationError("no v1 signature matches the body")
