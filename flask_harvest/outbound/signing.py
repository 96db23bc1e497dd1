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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .._input import text_problem
from ..errors import InvalidSecretError, SignatureVerificationError, VerificationFailure

SECRET_PREFIX = "whsec_"  # noqa: S105 (a prefix, not a secret)
DEFAULT_TOLERANCE_SECONDS = 300
DEFAULT_SIGNATURE_HEADER = "Autumn-Signature"

WEBHOOK_ID = "webhook-id"
WEBHOOK_TIMESTAMP = "webhook-timestamp"
WEBHOOK_SIGNATURE = "webhook-signature"


class HeaderLookup(Protocol):
    """What the verifiers need of a request's headers: a ``dict`` or Flask's ``request.headers``."""

    def get(self, key: str, /) -> str | None: ...


def generate_secret() -> str:
    """Return a new Standard Webhooks secret: ``whsec_`` and the base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


#: The longest signing secret: room for the API's 1,024-character secrets in their ``whsec_`` form.
MAX_SECRET_LENGTH = 8192


def validate_secret(value: object, field_name: str = "secret") -> str:
    """Return ``value`` if it is a usable signing secret, else raise :class:`InvalidSecretError`
    naming ``field_name`` (the message never shows the value).

    A string a database can keep (no NUL, no lone surrogate, at most :data:`MAX_SECRET_LENGTH`
    characters) that :func:`secret_key` accepts.
    """
    if not isinstance(value, str):
        raise InvalidSecretError("must be a string", field=field_name)
    too_long = len(value) > MAX_SECRET_LENGTH
    problem = f"must be at most {MAX_SECRET_LENGTH} characters" if too_long else text_problem(value)
    if problem is not None:
        raise InvalidSecretError(problem, field=field_name)
    try:
        secret_key(value)
    except InvalidSecretError as exc:
        raise InvalidSecretError(exc.message, field=field_name) from None
    return value


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


def standard_signature(secret: str | bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """Return one Standard Webhooks signature entry, ``v1,<base64 HMAC>``.

    :param secret: a secret (keyed as :func:`secret_key` says), or the HMAC key itself as bytes
        (as the ``standardwebhooks`` library takes bytes).
    :raises InvalidSecretError: the secret or key is empty, or a ``whsec_`` secret is not valid.
    """
    if isinstance(secret, bytes) and not secret:
        raise InvalidSecretError("must not be empty")
    key = secret if isinstance(secret, bytes) else secret_key(secret)
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(_hmac_sha256(key, signed)).decode("ascii")


def body_signature(key: bytes, body: bytes) -> str:
    """Return ``sha256=<lowercase hex HMAC-SHA256 of body>``, the completion callbacks'
    ``X-Harvest-Signature``: the body alone, so it is the same on every attempt and redrive."""
    return "sha256=" + _hmac_sha256(key, body).hex()


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


def _read_timestamp(value: str, tolerance: int, now: int | None) -> int:
    try:
        timestamp = int(value)
    except ValueError:  # not a number, or more digits than int() accepts
        raise SignatureVerificationError(
            VerificationFailure.MALFORMED_HEADER, "the timestamp is not an integer"
        ) from None
    current = int(time.time()) if now is None else now
    if current - timestamp > tolerance:
        raise SignatureVerificationError(
            VerificationFailure.TIMESTAMP_TOO_OLD,
            f"the timestamp is more than {tolerance} s in the past, outside the tolerance "
            "(a replayed request, or clock skew)",
        )
    if timestamp - current > tolerance:
        raise SignatureVerificationError(
            VerificationFailure.TIMESTAMP_IN_FUTURE,
            f"the timestamp is more than {tolerance} s in the future, outside the tolerance (clock skew)",
        )
    return timestamp


def _secret_list(secret: str | Sequence[str]) -> list[str]:
    found = [secret] if isinstance(secret, str) else list(secret)
    if not found:
        raise InvalidSecretError("at least one secret is needed to verify", field="secrets")
    return found


def _any_matches(candidates: Sequence[str], expected: Sequence[str]) -> bool:
    # Each pair is compared in constant time; which candidate matched is not secret. A candidate
    # that is not even UTF-8 (a lone surrogate) is not a signature: it fails to match, not to run.
    sent = [c.encode("utf-8", "replace") for c in candidates]
    return any(hmac.compare_digest(c, e.encode()) for e in expected for c in sent)


@dataclass(frozen=True)
class StandardHeaders:
    """The Standard Webhooks headers of one request: read, and the timestamp within the tolerance.

    :meth:`read` needs only the headers, so a receiver can refuse a request before reading its
    body; :meth:`verify` then checks the signatures against the body.
    """

    msg_id: str
    timestamp: int
    #: The ``webhook-signature`` entries (``v1,<base64>``), as sent.
    signatures: tuple[str, ...]

    @classmethod
    def read(
        cls, headers: HeaderLookup, *, tolerance: int = DEFAULT_TOLERANCE_SECONDS, now: int | None = None
    ) -> StandardHeaders:
        """Read the headers and check the timestamp; no signature is checked yet.

        :param headers: looked up with the lowercase header names: Flask's case-insensitive
            ``request.headers``, or a mapping with lowercase keys.
        :raises SignatureVerificationError: with the reason ``MISSING_HEADER``,
            ``MISSING_SIGNATURE``, ``MALFORMED_HEADER``, ``TIMESTAMP_TOO_OLD`` or
            ``TIMESTAMP_IN_FUTURE``.
        """
        msg_id, timestamp = headers.get(WEBHOOK_ID), headers.get(WEBHOOK_TIMESTAMP)
        if not msg_id or not timestamp:
            name = WEBHOOK_TIMESTAMP if msg_id else WEBHOOK_ID
            raise SignatureVerificationError(
                VerificationFailure.MISSING_HEADER, f"the {name} header is missing"
            )
        problem = text_problem(msg_id)
        if problem is not None:
            # A NUL or a lone surrogate (from a test client or an ASGI bridge: a WSGI server sends
            # Latin-1) can be in no signed message: it would fail to encode, not to match.
            raise SignatureVerificationError(
                VerificationFailure.MALFORMED_HEADER, f"the {WEBHOOK_ID} header {problem}"
            )
        signatures = headers.get(WEBHOOK_SIGNATURE)
        if not signatures:
            raise SignatureVerificationError(
                VerificationFailure.MISSING_SIGNATURE, f"the {WEBHOOK_SIGNATURE} header is missing"
            )
        return cls(msg_id, _read_timestamp(timestamp, tolerance, now), tuple(signatures.split(" ")))

    def verify(self, secret: str | bytes | Sequence[str], body: bytes) -> None:
        """Check that a signature matches ``body`` with one of the secrets.

        :param secret: a secret, several, or the HMAC key itself as bytes.
        :raises SignatureVerificationError: with the reason ``NO_MATCHING_SIGNATURE``.
        :raises InvalidSecretError: no secret is given, or one is not valid.
        """
        keys: list[str | bytes] = [secret] if isinstance(secret, bytes) else list(_secret_list(secret))
        expected = [standard_signature(s, self.msg_id, self.timestamp, body) for s in keys]
        if not _any_matches(self.signatures, expected):
            raise SignatureVerificationError(
                VerificationFailure.NO_MATCHING_SIGNATURE, f"no {WEBHOOK_SIGNATURE} matches the body"
            )


@dataclass(frozen=True)
class StripeHeader:
    """A Stripe-style signature header (``t=...,v1=...[,v1=...]``): read, and ``t`` within the tolerance.

    Like :class:`StandardHeaders`, :meth:`read` needs no body and :meth:`verify` checks it.
    """

    timestamp: int
    #: The ``v1`` entries (hex HMAC-SHA256), as sent.
    signatures: tuple[str, ...]
    #: The header's name, used in messages only.
    header: str = DEFAULT_SIGNATURE_HEADER

    @classmethod
    def read(
        cls,
        value: str | None,
        *,
        tolerance: int = DEFAULT_TOLERANCE_SECONDS,
        now: int | None = None,
        header: str = DEFAULT_SIGNATURE_HEADER,
    ) -> StripeHeader:
        """Read the header's value (``None`` when the request has none) and check its timestamp.

        :param header: the header's name, for the messages.
        :raises SignatureVerificationError: with the reason ``MISSING_SIGNATURE``,
            ``MALFORMED_HEADER``, ``TIMESTAMP_TOO_OLD`` or ``TIMESTAMP_IN_FUTURE``.
        """
        if not value:
            raise SignatureVerificationError(
                VerificationFailure.MISSING_SIGNATURE, f"the {header} header is missing"
            )
        fields = [part.strip().partition("=") for part in value.split(",")]
        timestamps = [v for k, sep, v in fields if sep and k == "t"]
        signatures = tuple(v for k, sep, v in fields if sep and k == "v1")
        if not timestamps:
            raise SignatureVerificationError(
                VerificationFailure.MALFORMED_HEADER, f"the {header} header has no t= timestamp"
            )
        if not signatures:
            raise SignatureVerificationError(
                VerificationFailure.MISSING_SIGNATURE, f"the {header} header has no v1= signature"
            )
        return cls(_read_timestamp(timestamps[-1], tolerance, now), signatures, header)

    def verify(self, secret: str | Sequence[str], body: bytes) -> None:
        """Check that a ``v1`` signature matches ``body`` with one of the secrets.

        :raises SignatureVerificationError: with the reason ``NO_MATCHING_SIGNATURE``.
        :raises InvalidSecretError: no secret is given, or one is empty.
        """
        expected = [stripe_signature(s, self.timestamp, body) for s in _secret_list(secret)]
        if not _any_matches(self.signatures, expected):
            raise SignatureVerificationError(
                VerificationFailure.NO_MATCHING_SIGNATURE,
                f"no v1 signature in {self.header} matches the body",
            )


def verify_standard(
    secret: str | Sequence[str],
    headers: HeaderLookup,
    body: bytes,
    *,
    tolerance: int = DEFAULT_TOLERANCE_SECONDS,
    now: int | None = None,
) -> StandardHeaders:
    """Verify Standard Webhooks headers against the raw ``body``; return what was verified.

    :param secret: the secret, or several (during a rotation): any one verifies.
    :param headers: looked up with the lowercase header names, so pass a case-insensitive mapping
        (Flask's ``request.headers``) or one with lowercase keys.
    :param tolerance: seconds the timestamp may be away from ``now``, either way.
    :param now: the current Unix time; the clock when ``None``.
    :raises SignatureVerificationError: a header is missing or malformed, the timestamp is outside
        ``tolerance``, or no signature matches; its ``reason`` says which.
    :raises InvalidSecretError: no secret is given, or one is not valid.
    """
    read = StandardHeaders.read(headers, tolerance=tolerance, now=now)
    read.verify(secret, body)
    return read


def verify_stripe(
    secret: str | Sequence[str],
    header_value: str | None,
    body: bytes,
    *,
    tolerance: int = DEFAULT_TOLERANCE_SECONDS,
    now: int | None = None,
    header: str = DEFAULT_SIGNATURE_HEADER,
) -> StripeHeader:
    """Verify a Stripe-style header value (``t=...,v1=...[,v1=...]``) against the raw ``body``.

    :param secret: the secret, or several (during a rotation): any one verifies.
    :param header_value: the header's value; ``None`` or empty when the request has none.
    :param header: the header's name, for the messages.
    :raises SignatureVerificationError: the header is missing or malformed, the timestamp is
        outside ``tolerance`` seconds, or no ``v1`` signature matches; its ``reason`` says which.
    :raises InvalidSecretError: no secret is given, or one is empty.
    """
    read = StripeHeader.read(header_value, tolerance=tolerance, now=now, header=header)
    read.verify(secret, body)
    return read
