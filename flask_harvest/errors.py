"""The exceptions flask-harvest raises; every one derives from :class:`HarvestError`."""

from __future__ import annotations

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


class SignatureVerificationError(HarvestError):
    """A webhook signature did not verify (wrong secret, altered body, stale timestamp)."""
