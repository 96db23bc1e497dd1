"""The exceptions flask-harvest raises; every one derives from :class:`HarvestError`.

Like werkzeug's ``HTTPException.code``, each error class carries the HTTP answer it gets from the
admin APIs and the dashboard (``http_status``, ``error_code``), so the one mapping,
:func:`flask_harvest.http.admin.error_answer`, needs no table of classes.
"""

from __future__ import annotations

import enum
import traceback
from collections.abc import Sequence
from typing import Any


class HarvestError(Exception):
    """Base class of every error raised by flask-harvest.

    An error that no subclass gives a status is a 500: the server failed, not the request.
    """

    #: The HTTP status the admin APIs and the dashboard answer this error with.
    http_status: int = 500
    #: The machine-readable ``error.code`` of the JSON answer.
    error_code: str = "internal_error"
    #: What a 5xx answer says instead of the error's own message, which only the log shows.
    public_message: str = "the server could not answer this request; the cause is in its log"

    def error_details(self) -> dict[str, Any]:
        """Keys the JSON error body adds to ``code`` and ``message`` (such as ``fields``)."""
        return {}


class ConfigurationError(HarvestError):
    """The extension was set up wrongly (a bad ``HARVEST_*`` value, a missing store)."""

    error_code = "configuration_error"
    public_message = "the server is not configured for this request; the cause is in its log"


class AuthorizerError(HarvestError):
    """The admin authorizer raised instead of answering: the request is refused with a 500.

    A 500 rather than a 403, because nothing decided to refuse: the check itself is broken, and a
    403 would pass for an ordinary refusal in every log and alert. The message names the
    exception's type and where it was raised, never its own message, which may quote the
    credential the authorizer was checking.
    """

    error_code = "authorizer_failed"
    public_message = "the admin authorizer failed, so the request was refused; the cause is in the log"

    def __init__(self, error: BaseException) -> None:
        frames = traceback.extract_tb(error.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
        super().__init__(
            f"the admin authorizer raised {type(error).__name__}{where} (its message is not shown: "
            "it may hold a credential); fix the authorizer so that it returns True or False"
        )


class InvalidFieldError(HarvestError, ValueError):
    """A value given to flask-harvest is not acceptable.

    :param field: the name of the offending field, as the caller spelled it.
    :param message: what is wrong and how to fix it. Never includes a secret.
    """

    http_status = 422
    error_code = "validation_error"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def error_details(self) -> dict[str, Any]:
        return {"fields": {self.field: [self.message]}}


class InvalidSecretError(InvalidFieldError):
    """A signing secret is empty or a ``whsec_`` secret is not valid base64."""

    def __init__(self, message: str, field: str = "secret") -> None:
        super().__init__(field, message)


class StoreError(HarvestError):
    """The store's backend (the database) failed; the driver error is the ``__cause__``."""

    http_status = 503
    error_code = "store_unavailable"
    public_message = "the store is unavailable; try again"


class NotFoundError(HarvestError, LookupError):
    """Base class of the "no such object" errors."""

    http_status = 404
    error_code = "not_found"


class SubscriptionNotFoundError(NotFoundError):
    """No subscription has the given id."""

    def __init__(self, subscription_id: str) -> None:
        super().__init__(f"no subscription with id {subscription_id!r}")
        self.subscription_id = subscription_id


class DeliveryNotFoundError(NotFoundError):
    """No delivery has the given id."""

    def __init__(self, delivery_id: str) -> None:
        super().__init__(f"no delivery with id {delivery_id!r}")
        self.delivery_id = delivery_id


class DuplicateSubscriptionError(HarvestError):
    """A subscription with this id already exists."""

    http_status = 409
    error_code = "conflict"

    def __init__(self, subscription_id: str) -> None:
        super().__init__(
            f"a subscription with id {subscription_id!r} already exists; "
            "choose another id or update the existing one"
        )
        self.subscription_id = subscription_id


class InvalidStateError(HarvestError):
    """The operation does not apply to the object in its current state."""

    http_status = 409
    error_code = "conflict"


class EnqueueError(HarvestError):
    """Deliveries were logged but their jobs could not be enqueued.

    The affected deliveries were moved to the dead-letter queue, so nothing is lost: replay them
    once the job backend is back.

    :param delivery_ids: the ids of the dead-lettered deliveries.
    """

    def __init__(self, delivery_ids: Sequence[str], reason: str) -> None:
        ids = ", ".join(delivery_ids)
        super().__init__(
            f"could not enqueue {len(delivery_ids)} delivery job(s) ({reason}); "
            f"they are in the dead-letter queue and can be replayed: {ids}"
        )
        self.delivery_ids = list(delivery_ids)
        self.reason = reason


class VerificationFailure(str, enum.Enum):
    """Why a webhook request did not verify: the ``reason`` of :class:`SignatureVerificationError`.

    The checks run in this order, and the first that fails is the reason; every check before
    ``NO_MATCHING_SIGNATURE`` reads only the headers, so the reason never depends on the secret.
    """

    #: ``webhook-id`` or ``webhook-timestamp`` is absent or empty (Standard Webhooks).
    MISSING_HEADER = "missing_header"
    #: The signature header is absent or empty, or the Stripe-style header has no ``v1=`` entry.
    MISSING_SIGNATURE = "missing_signature"
    #: The timestamp is not an integer, or the Stripe-style header has no ``t=`` entry.
    MALFORMED_HEADER = "malformed_header"
    #: The timestamp is more than the tolerance in the past: a replayed request, or clock skew.
    TIMESTAMP_TOO_OLD = "timestamp_too_old"
    #: The timestamp is more than the tolerance in the future: clock skew.
    TIMESTAMP_IN_FUTURE = "timestamp_in_future"
    #: No signature in the header matches the body with any of the secrets.
    NO_MATCHING_SIGNATURE = "no_matching_signature"


class SignatureVerificationError(HarvestError):
    """A webhook request did not verify (a header missing, a stale timestamp, no signature matching).

    :param reason: why, as :class:`VerificationFailure`; also the ``reason`` attribute.
    :param message: what failed, naming the header; never a secret or a signature.
    """

    def __init__(self, reason: VerificationFailure, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class EventTypeNotFoundError(NotFoundError):
    """No event type of that name is in the catalog."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no event type named {name!r} in the catalog")
        self.name = name


class UnknownEventTypeError(InvalidFieldError):
    """A strict catalog refused to dispatch an event whose topic is not a registered event type."""

    def __init__(self, topic: str) -> None:
        super().__init__(
            "topic",
            f"{topic!r} is not an event type in the catalog, which is strict "
            "(HARVEST_EVENT_CATALOG_STRICT): register it with harvest.event_type(...) first",
        )
        self.topic = topic


class PayloadSchemaError(InvalidFieldError):
    """A dispatched payload does not match its event type's schema; nothing was written.

    :param topic: the event type.
    :param path: where in the payload, as a JSON path (``$.items[0].sku``).
    """

    def __init__(self, topic: str, path: str, message: str) -> None:
        super().__init__("payload", f"does not match the schema of event type {topic!r} at {path}: {message}")
        self.topic = topic
        self.path = path
