"""The exceptions flask-harvest raises; every one derives from :class:`HarvestError`."""

from __future__ import annotations

import enum
from collections.abc import Sequence


class HarvestError(Exception):
    """Base class of every error raised by flask-harvest."""


class ConfigurationError(HarvestError):
    """The extension was set up wrongly (a bad ``HARVEST_*`` value, a missing store)."""


class InvalidFieldError(HarvestError, ValueError):
    """A value given to flask-harvest is not acceptable.

    :param field: the name of the offending field, as the caller spelled it.
    :param message: what is wrong and how to fix it. Never includes a secret.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class InvalidSecretError(InvalidFieldError):
    """A signing secret is empty or a ``whsec_`` secret is not valid base64."""

    def __init__(self, message: str, field: str = "secret") -> None:
        super().__init__(field, message)


class StoreError(HarvestError):
    """The store's backend (the database) failed; the driver error is the ``__cause__``."""


class NotFoundError(HarvestError, LookupError):
    """Base class of the "no such object" errors."""


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

    def __init__(self, subscription_id: str) -> None:
        super().__init__(
            f"a subscription with id {subscription_id!r} already exists; "
            "choose another id or update the existing one"
        )
        self.subscription_id = subscription_id


class InvalidStateError(HarvestError):
    """The operation does not apply to the object in its current state."""


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
