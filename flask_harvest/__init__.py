"""flask-harvest: reliable outbound webhooks for Flask."""

from . import signals
from ._app import get_engine
from ._version import __version__
from .engine import HarvestEngine, build_engine
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
from .extension import OutboundWebhookPlugin, get_manager
from .jobs.base import JobBackendError
from .receiver import MemoryReplayCache, RedisReplayCache, ReplayCache, WebhookRejected, verify_webhook
from .signing import generate_secret
from .ssrf import SsrfError, SsrfPolicy, SsrfRejection
from .webhooks.manager import OutboundWebhookManager
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
    SqlOutboundWebhookStore,
)
from .workflow_extension import HarvestWorkflows, workflow_service
from .workflows.models import ExecutionState, IdReusePolicy
from .workflows.service import WorkflowFailedError, WorkflowHandle

#: The seed's name for the manager.
WebhookOutboundManager = OutboundWebhookManager

__all__ = [
    "ConfigurationError",
    "DeliveryAttempt",
    "DeliveryLog",
    "DeliveryNotFoundError",
    "DeliveryState",
    "DuplicateSubscriptionError",
    "EnqueueError",
    "ExecutionState",
    "HarvestEngine",
    "HarvestError",
    "HarvestWorkflows",
    "IdReusePolicy",
    "InMemoryOutboundWebhookHandler",
    "InMemoryOutboundWebhookStore",
    "InvalidFieldError",
    "InvalidSecretError",
    "InvalidStateError",
    "JobBackendError",
    "MemoryReplayCache",
    "NotFoundError",
    "OutboundWebhookHandler",
    "OutboundWebhookManager",
    "OutboundWebhookPlugin",
    "OutboundWebhookStore",
    "RedisReplayCache",
    "ReplayCache",
    "SignatureVerificationError",
    "SqlOutboundWebhookStore",
    "SsrfError",
    "SsrfPolicy",
    "SsrfRejection",
    "StoreError",
    "SubscriptionNotFoundError",
    "WebhookOutboundManager",
    "WebhookRejected",
    "WebhookSubscription",
    "WebhookSubscriptionStatus",
    "WorkflowFailedError",
    "WorkflowHandle",
    "__version__",
    "build_engine",
    "generate_secret",
    "get_engine",
    "get_manager",
    "signals",
    "verify_webhook",
    "workflow_service",
]
