"""flask-harvest: reliable outbound webhooks for Flask."""

from ._version import __version__
from .errors import (
    ConfigurationError,
    DeliveryNotFoundError,
    DuplicateSubscriptionError,
    EnqueueError,
    HarvestError,
    InvalidFieldError,
    InvalidSecretError,
    InvalidStateError,
    NotFoundError,
    SignatureVerificationError,
    StoreError,
    SubscriptionNotFoundError,
)
from .signing import generate_secret
from .webhooks.models import (
    DeliveryAttempt,
    DeliveryLog,
    DeliveryState,
    WebhookSubscription,
    WebhookSubscriptionStatus,
)
from .webhooks.stores import (
    InMemoryOutboundWebhookHandler,
    InMemoryOutboundWebhookStore,
    OutboundWebhookHandler,
    OutboundWebhookStore,
)

__all__ = [
    "ConfigurationError",
    "DeliveryAttempt",
    "DeliveryLog",
    "DeliveryNotFoundError",
    "DeliveryState",
    "DuplicateSubscriptionError",
    "EnqueueError",
    "HarvestError",
    "InMemoryOutboundWebhookHandler",
    "InMemoryOutboundWebhookStore",
    "InvalidFieldError",
    "InvalidSecretError",
    "InvalidStateError",
    "NotFoundError",
    "OutboundWebhookHandler",
    "OutboundWebhookStore",
    "SignatureVerificationError",
    "StoreError",
    "SubscriptionNotFoundError",
    "WebhookSubscription",
    "WebhookSubscriptionStatus",
    "__version__",
    "generate_secret",
]
