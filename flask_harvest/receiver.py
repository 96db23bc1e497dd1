"""The receiver kit: verify incoming webhooks in a Flask view, and refuse replays.

::

    from flask_harvest.receiver import MemoryReplayCache, verify_webhook

    @app.post("/webhooks")
    @verify_webhook(os.environ["WEBHOOK_SECRET"], replay_cache=MemoryReplayCache())
    def webhooks(payload, delivery_id):
        ...                       # payload: the parsed JSON body; delivery_id: the webhook-id
        return "", 204

The decorator checks the signature headers and the timestamp before it reads the body, reads at
most ``max_body_bytes`` of it (1 MiB by default), checks the signature against the raw body, parses
the JSON, records the delivery in the replay cache, then calls the view. A refused request never
reaches the view; it is answered with a JSON body ``{"error": {"code", "message"}}``:

=====  ==============================  ==================================================================
HTTP   ``code``                        why
=====  ==============================  ==================================================================
400    ``missing_header``              ``webhook-id`` or ``webhook-timestamp`` is absent (Standard)
400    ``malformed_header``            the timestamp is not an integer, the Stripe-style header has no
                                       ``t=``, or ``webhook-id`` holds a NUL or a lone surrogate
401    ``missing_signature``           no signature header, or no ``v1`` signature in it
401    ``timestamp_out_of_tolerance``  the timestamp is more than ``tolerance`` seconds old or ahead
413    ``body_too_large``              the body is over ``max_body_bytes`` (announced, or read so far)
401    ``invalid_signature``           no signature matches the body with any of the secrets
400    ``invalid_json``                the (authentic) body is not JSON, or is nested too deeply to parse
409    ``replayed``                    this delivery was accepted within its tolerance window
503    ``replay_cache_unavailable``    the replay cache (Redis) did not answer; the sender retries later
=====  ==============================  ==================================================================

The header and timestamp checks come first, then the body's size, the signature, the JSON and the
replay cache. The first four rows and ``invalid_signature`` answer the signing module's
:class:`~flask_harvest.errors.VerificationFailure` reasons, mapped to responses in one table here.

Why 409 for a replay, not 400: the request is well formed and authentic; it conflicts with one
already accepted, and keeping 400 for malformed requests lets the sender's logs tell the two apart.
What a sender does with it: flask-harvest counts any non-2xx as a failed attempt and retries with
the same id. So :func:`verify_webhook` forgets the id again when the view raises or answers
non-2xx (the retry of a delivery whose handling failed is handled); and when the view succeeded
but its answer was lost, the retries within the window get 409 and a later one is handled again.

The replay cache is a guard against replayed requests within the tolerance window, not a durable
record of processed deliveries: delivery is at-least-once, and a retry that comes after the
window is accepted again. Keep ``delivery_id`` in your own database to drop those copies.
"""

from __future__ import annotations

import abc
import functools
import hashlib
import heapq
import hmac
import io
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from flask import Response, make_response, request
from werkzeug.exceptions import HTTPException

from ._input import id_problem, parse_json, read_limited
from .errors import (
    ConfigurationError,
    HarvestError,
    InvalidFieldError,
    SignatureVerificationError,
    VerificationFailure,
)
from .outbound.signing import (
    DEFAULT_SIGNATURE_HEADER,
    DEFAULT_TOLERANCE_SECONDS,
    WEBHOOK_ID,
    HeaderLookup,
    StandardHeaders,
    StripeHeader,
    body_signature,
    secret_key,
    verify_standard,
)

if TYPE_CHECKING:
    import redis
    from _typeshed.wsgi import WSGIEnvironment

#: Where the secrets come from: one secret, several (during a rotation), or a function called on
#: every request that returns either (to read them from config or a database).
SecretSource = str | Sequence[str] | Callable[[], str | Sequence[str]]
Scheme = Literal["standard", "stripe"]
F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger(__name__)

#: The largest body :func:`verify_webhook` reads unless told otherwise: 1 MiB.
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
_CHUNK = 64 * 1024
# Looked up in lowercase, as the Standard Webhooks headers are (see HeaderLookup).
_CALLBACK_SIGNATURE = "x-harvest-signature"


class WebhookRejected(HTTPException, HarvestError):
    """A webhook request that :func:`verify_webhook` refused; answered as JSON.

    Register ``@app.errorhandler(WebhookRejected)`` to answer differently. ``code`` is the HTTP
    status; ``reason`` is the machine-readable ``error.code`` of the body.
    """

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(description=message)
        self.code = status
        self.reason = reason
        # The same answer wherever it is mapped (an admin blueprint maps HarvestError by these).
        self.http_status = status
        self.error_code = reason

    def get_body(self, environ: WSGIEnvironment | None = None, scope: dict[str, Any] | None = None) -> str:
        return json.dumps({"error": {"code": self.reason, "message": self.description}})

    def get_headers(
        self, environ: WSGIEnvironment | None = None, scope: dict[str, Any] | None = None
    ) -> list[tuple[str, str]]:
        return [("Content-Type", "application/json")]


class ReplayCacheError(HarvestError):
    """The replay cache could not be reached; the driver error is the ``__cause__``."""


# -- replay caches ---------------------------------------------------------------------------------


class ReplayCache(abc.ABC):
    """Remembers accepted delivery ids for a while. Implementations must be atomic and thread-safe."""

    @abc.abstractmethod
    def add(self, key: str, ttl: int) -> bool:
        """Remember ``key`` for ``ttl`` seconds; return ``False`` if it is already remembered.

        :raises ReplayCacheError: the cache did not answer.
        """

    @abc.abstractmethod
    def discard(self, key: str) -> None:
        """Forget ``key`` (its request was not handled, so a retry must be accepted).

        :raises ReplayCacheError: the cache did not answer.
        """


class MemoryReplayCache(ReplayCache):
    """A replay cache in this process's memory: for one process, tests and development.

    Entries expire after their ``ttl``. At ``max_entries``, the entry closest to expiry is dropped
    to make room, so memory stays bounded under a flood; size it above the deliveries you expect
    within the tolerance window. Several processes (gunicorn workers) need :class:`RedisReplayCache`.

    :param clock: monotonic seconds; tests pass a fake one.
    """

    def __init__(self, max_entries: int = 100_000, *, clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ConfigurationError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._expiry: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []  # may hold stale entries; _expiry is the truth

    def __len__(self) -> int:
        with self._lock:
            self._expire(self._clock())
            return len(self._expiry)

    def add(self, key: str, ttl: int) -> bool:
        with self._lock:
            now = self._clock()
            self._expire(now)
            if key in self._expiry:
                return False
            while len(self._expiry) >= self.max_entries:
                self._pop()
            expires = now + ttl
            self._expiry[key] = expires
            heapq.heappush(self._heap, (expires, key))
            if len(self._heap) > 2 * self.max_entries:  # discards left stale heap entries behind
                self._heap = [(e, k) for k, e in self._expiry.items()]
                heapq.heapify(self._heap)
            return True

    def discard(self, key: str) -> None:
        with self._lock:
            self._expiry.pop(key, None)

    def _expire(self, now: float) -> None:
        while self._heap and self._heap[0][0] <= now:
            self._pop()

    def _pop(self) -> None:
        expires, key = heapq.heappop(self._heap)
        if self._expiry.get(key) == expires:
            del self._expiry[key]


class RedisReplayCache(ReplayCache):
    """A replay cache in Redis, shared by every process: ``SET key NX EX ttl``, atomic.

    :param redis_client: a ``redis.Redis`` client.
    :param prefix: prepended to each key; give each receiving endpoint (or sender) its own.
    """

    def __init__(self, redis_client: redis.Redis, prefix: str = "harvest:replay:") -> None:
        self.redis = redis_client
        self.prefix = prefix

    def __repr__(self) -> str:
        return f"<RedisReplayCache prefix={self.prefix!r}>"

    def add(self, key: str, ttl: int) -> bool:
        import redis

        try:
            return bool(self.redis.set(self.prefix + key, b"1", nx=True, ex=max(1, ttl)))
        except redis.RedisError as exc:
            raise ReplayCacheError(f"Redis did not answer ({type(exc).__name__})") from exc

    def discard(self, key: str) -> None:
        import redis

        try:
            self.redis.delete(self.prefix + key)
        except redis.RedisError as exc:
            raise ReplayCacheError(f"Redis did not answer ({type(exc).__name__})") from exc


# -- verification ----------------------------------------------------------------------------------


def _secrets(source: SecretSource) -> list[str]:
    value = source() if callable(source) else source
    found = [value] if isinstance(value, str) else list(value)
    if not found:
        raise ConfigurationError("verify_webhook has no secret to verify with; give at least one")
    for secret in found:
        secret_key(secret)  # raises InvalidSecretError (which never echoes the secret)
    return found


#: How each verification failure is answered: the HTTP status and the body's ``error.code``. The
#: message is the failure's own, which names the header and never a secret.
_REFUSALS: dict[VerificationFailure, tuple[int, str]] = {
    VerificationFailure.MISSING_HEADER: (400, "missing_header"),
    VerificationFailure.MALFORMED_HEADER: (400, "malformed_header"),
    VerificationFailure.MISSING_SIGNATURE: (401, "missing_signature"),
    VerificationFailure.TIMESTAMP_TOO_OLD: (401, "timestamp_out_of_tolerance"),
    VerificationFailure.TIMESTAMP_IN_FUTURE: (401, "timestamp_out_of_tolerance"),
    VerificationFailure.NO_MATCHING_SIGNATURE: (401, "invalid_signature"),
}


def _refused(exc: SignatureVerificationError) -> WebhookRejected:
    status, code = _REFUSALS[exc.reason]
    return WebhookRejected(status, code, exc.message)


def _read_body(limit: int) -> bytes:
    """Return the request body, refusing one over ``limit`` bytes without reading past it."""
    body = read_limited(request.stream, request.content_length, limit, chunk_size=_CHUNK)
    if body is None:
        raise WebhookRejected(413, "body_too_large", f"the body is larger than {limit} bytes")
    # Give the request what was read as its stream, so request.get_data() in the view still works.
    request.stream = io.BytesIO(body)
    return request.get_data(cache=True)


def _parse_json(body: bytes) -> Any:
    try:
        return parse_json(body)
    except InvalidFieldError as exc:  # not UTF-8 JSON, NaN, or nested past MAX_JSON_DEPTH
        raise WebhookRejected(400, "invalid_json", f"the body {exc.message}") from None


def _replay_keys(
    signed: StandardHeaders | StripeHeader, secrets: Sequence[str], body: bytes, tolerance: int, now: int
) -> list[str]:
    """Return the keys that identify this delivery in the replay cache, the deciding one first.

    Standard Webhooks: the ``webhook-id``, which the signature covers. The Stripe-style signature
    covers only the timestamp and the body, and a replay could change an unsigned id: so the key
    is the ``webhook-id`` only when the request also carries a Standard Webhooks signature of it
    (flask-harvest signs both ways), and the signed message (timestamp and body) otherwise. The
    signed message is remembered in both cases, so a copy of an id-keyed delivery whose id was
    changed or removed is still refused.
    """
    if isinstance(signed, StandardHeaders):
        return [signed.msg_id]
    message = "sha256:" + hashlib.sha256(f"{signed.timestamp}.".encode() + body).hexdigest()
    try:
        standard = verify_standard(secrets, request.headers, body, tolerance=tolerance, now=now)
    except SignatureVerificationError:
        return [message]
    return [standard.msg_id, message]


def verify_webhook(
    secret: SecretSource,
    *,
    scheme: Scheme = "standard",
    tolerance: int = DEFAULT_TOLERANCE_SECONDS,
    replay_cache: ReplayCache | None = None,
    signature_header: str = DEFAULT_SIGNATURE_HEADER,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> Callable[[F], F]:
    """Decorate a Flask view so that it only sees verified webhooks.

    The view is called with two more keyword arguments: ``payload``, the parsed JSON body, and
    ``delivery_id``, the ``webhook-id`` header (stable across the sender's retries). With
    ``scheme="stripe"`` it is ``None`` when the sender sent no ``webhook-id``, and it is not
    covered by that signature (the timestamp and body are). Refused requests are answered by
    raising :class:`WebhookRejected` (see the module documentation for the codes).

    The headers and the timestamp are checked before the body is read, and a body over
    ``max_body_bytes`` is refused without being read past the limit.

    :param secret: the signing secret, several secrets (any one verifies: use it during a
        rotation), or a function returning them, called on every request whose headers pass.
    :param scheme: ``"standard"`` checks the Standard Webhooks headers (``webhook-id``,
        ``webhook-timestamp``, ``webhook-signature``); ``"stripe"`` checks the Stripe-style
        ``signature_header`` (``t=...,v1=...``).
    :param tolerance: seconds the timestamp may be away from this machine's clock.
    :param replay_cache: where accepted deliveries are remembered, so a request replayed while its
        timestamp is still within the tolerance is refused with 409. ``None`` checks nothing.
        The Stripe scheme keys on ``webhook-id`` only when a Standard Webhooks signature on the
        same request covers it, and on the signed timestamp and body otherwise. A delivery is
        recorded only after the signature verified (forged requests cannot fill the cache) and
        forgotten again if the view raises or answers non-2xx (so the retry of a failed delivery
        is handled).
    :param signature_header: the Stripe-style header's name (``scheme="stripe"``).
    :param max_body_bytes: the largest body accepted, :data:`DEFAULT_MAX_BODY_BYTES` (1 MiB) by
        default; a larger one is answered 413 ``body_too_large``.
    """
    if scheme not in ("standard", "stripe"):
        raise ConfigurationError(f"scheme must be 'standard' or 'stripe', not {scheme!r}")
    if tolerance < 0:
        raise ConfigurationError("tolerance must not be negative")
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        raise ConfigurationError(f"max_body_bytes must be a positive integer, not {max_body_bytes!r}")
    if not callable(secret):
        _secrets(secret)  # a wrong secret fails at import time, not at the first request

    def read_headers(now: int) -> StandardHeaders | StripeHeader:
        if scheme == "standard":
            return StandardHeaders.read(request.headers, tolerance=tolerance, now=now)
        value = request.headers.get(signature_header)
        return StripeHeader.read(value, tolerance=tolerance, now=now, header=signature_header)

    def decorator(view: F) -> F:
        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Response:
            now = int(time.time())
            try:
                signed = read_headers(now)  # before the body: a request without them is never read
                body = _read_body(max_body_bytes)
                secrets = _secrets(secret)
                signed.verify(secrets, body)
            except SignatureVerificationError as exc:
                raise _refused(exc) from None
            found_id = (
                signed.msg_id if isinstance(signed, StandardHeaders) else request.headers.get(WEBHOOK_ID)
            )
            problem = id_problem(found_id) if found_id else None
            if problem is not None:
                # Unsigned under the Stripe scheme, but handed to the view: never one it cannot
                # store, nor one that acts on a terminal or a log (ESC, BEL, CR, LF).
                raise WebhookRejected(400, "malformed_header", f"the {WEBHOOK_ID} header {problem}")
            payload = _parse_json(body)
            call = functools.partial(view, *args, payload=payload, delivery_id=found_id or None, **kwargs)
            if replay_cache is None:
                return make_response(call())
            # Remembered until the timestamp leaves the tolerance: after that it is refused anyway.
            ttl = max(1, signed.timestamp + tolerance - now + 1)
            deciding, *others = _replay_keys(signed, secrets, body, tolerance, now)
            if not _remember(replay_cache, deciding, ttl):
                raise WebhookRejected(409, "replayed", "this delivery was already received")
            # On failure, forget only what this request recorded: another delivery may share a key.
            recorded = [deciding, *[key for key in others if _remember(replay_cache, key, ttl)]]
            try:
                response = make_response(call())
            except BaseException:
                _forget(replay_cache, recorded)
                raise
            if not 200 <= response.status_code < 300:
                _forget(replay_cache, recorded)
            return response

        return cast(F, wrapper)

    return decorator


def _remember(cache: ReplayCache, key: str, ttl: int) -> bool:
    try:
        return cache.add(key, ttl)
    except ReplayCacheError as exc:
        raise WebhookRejected(
            503, "replay_cache_unavailable", "the replay cache is unavailable; try again later"
        ) from exc


def _forget(cache: ReplayCache, keys: Sequence[str]) -> None:
    # The view's own outcome is what the sender must see; a cache outage here only means the
    # sender's retry is refused as a replay until the entry expires.
    for key in keys:
        try:
            cache.discard(key)
        except ReplayCacheError:
            log.warning(
                "harvest receiver: could not forget delivery %s in the replay cache", key, exc_info=True
            )


def _callback_key(secret: object) -> bytes:
    # A secret that is not text or bytes is the caller's mistake: say so instead of a TypeError.
    if isinstance(secret, bytes | bytearray) and secret:
        return bytes(secret)
    if isinstance(secret, str) and secret:
        try:
            return secret.encode("utf-8")
        except UnicodeEncodeError:
            pass
    raise InvalidFieldError("secret", "must be non-empty text in UTF-8 or bytes")


def verify_completion_callback(
    secret: bytes | str,
    body: bytes,
    signature: str | None = None,
    *,
    headers: HeaderLookup | None = None,
    timestamp: str | None = None,
    tolerance_seconds: float | None = None,
    now: float | None = None,
) -> bool:
    """Whether a completion callback is authentic (and, with ``tolerance_seconds``, fresh).

    Recomputes ``X-Harvest-Signature`` (``sha256=<hex HMAC-SHA256(secret, body)>``) over the exact
    bytes received and compares in constant time. That signature covers the body only, so it is
    the same on every attempt and vouches for no time. With ``tolerance_seconds``, the Standard
    Webhooks headers are checked too: ``webhook-signature`` must match ``webhook-id``,
    ``webhook-timestamp`` and the body, and that signed timestamp must be within
    ``tolerance_seconds`` of ``now`` (default: the clock). ``X-Harvest-Timestamp`` is not signed
    and never vouches for freshness.

    :param signature: the ``X-Harvest-Signature`` value; read from ``headers`` when ``None``.
    :param headers: the request's headers (Flask's ``request.headers``, or a mapping with
        lowercase keys); needed with ``tolerance_seconds``.
    :param timestamp: unused: the ``X-Harvest-Timestamp`` is not signed. Kept so that an older
        call passing it with ``tolerance_seconds`` gets the error below, which says what to pass.
    :raises InvalidFieldError: ``secret`` is empty, or neither UTF-8 text nor bytes; or
        ``tolerance_seconds`` is given without ``headers``.
    """
    key = _callback_key(secret)
    if tolerance_seconds is not None and headers is None:
        raise InvalidFieldError(
            "headers",
            "tolerance_seconds checks the signed webhook-timestamp: pass headers=request.headers "
            "(X-Harvest-Timestamp is not signed, so a replay could carry a fresh one)",
        )
    if signature is None and headers is not None:
        signature = headers.get(_CALLBACK_SIGNATURE)
    if not isinstance(signature, str) or not isinstance(body, bytes | bytearray):
        return False
    expected = body_signature(key, bytes(body))
    if not hmac.compare_digest(expected.encode("ascii"), signature.strip().encode("utf-8", "replace")):
        return False
    if tolerance_seconds is None or headers is None:
        return True
    clock = int(now if now is not None else time.time())
    try:
        # The same key convention as the sender's (a whsec_ text secret keys with its decoded bytes).
        signed = StandardHeaders.read(headers, tolerance=int(tolerance_seconds), now=clock)
        signed.verify(bytes(secret) if isinstance(secret, bytes | bytearray) else secret, bytes(body))
    except SignatureVerificationError:
        return False
    return True


__all__ = [
    "MemoryReplayCache",
    "RedisReplayCache",
    "ReplayCache",
    "ReplayCacheError",
    "SecretSource",
    "WebhookRejected",
    "verify_completion_callback",
    "verify_webhook",
]
