"""flask-harvest: reliable outbound webhooks for Flask.

The public names below are imported on first use (:pep:`562`), so that importing one pure module
(``flask_harvest.signing``, ``flask_harvest.webhooks.outcome``) does not load Flask, SQLAlchemy,
Redis and the HTTP client through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from . import signals
    from ._app import get_engine, workflow_service
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
    from .trigger_extension import HarvestTriggers, trigger_service
    from .triggers.definitions import CompletionTrigger
    from .webhooks.manager import OutboundWebhookManager
    from .webhooks.manager import OutboundWebhookManager as WebhookOutboundManager
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
    from .workflow_extension import HarvestWorkflows
    from .workflows.models import ExecutionState, IdReusePolicy
    from .workflows.service import WorkflowFailedError, WorkflowHandle

#: Where each public name lives, by module; imported on first use by :func:`__getattr__`.
_SOURCES: dict[str, tuple[str, ...]] = {
    ".errors": (
        "ConfigurationError",
        "DeliveryNotFoundError",
        "DuplicateSubscriptionError",
        "EnqueueError",
        "HarvestError",
        "InvalidFieldError",
        "InvalidSecretError",
        "InvalidStateError",
        "NotFoundError",
        "SignatureVerificationError",
        "StoreError",
        "SubscriptionNotFoundError",
    ),
    "._app": ("get_engine", "workflow_service"),
    ".engine": ("HarvestEngine", "build_engine"),
    ".extension": ("OutboundWebhookPlugin", "get_manager"),
    ".jobs.base": ("JobBackendError",),
    ".receiver": (
        "MemoryReplayCache",
        "RedisReplayCache",
        "ReplayCache",
        "WebhookRejected",
        "verify_webhook",
    ),
    ".signing": ("generate_secret",),
    ".ssrf": ("SsrfError", "SsrfPolicy", "SsrfRejection"),
    ".webhooks.manager": ("OutboundWebhookManager",),
    ".webhooks.models": (
        "DeliveryAttempt",
        "DeliveryLog",
        "DeliveryState",
        "WebhookSubscription",
        "WebhookSubscriptionStatus",
    ),
    ".webhooks.stores": (
        "InMemoryOutboundWebhookHandler",
        "InMemoryOutboundWebhookStore",
        "OutboundWebhookHandler",
        "OutboundWebhookStore",
        "SqlOutboundWebhookStore",
    ),
    ".trigger_extension": ("HarvestTriggers", "trigger_service"),
    ".triggers.definitions": ("CompletionTrigger",),
    ".workflow_extension": ("HarvestWorkflows",),
    ".workflows.models": ("ExecutionState", "IdReusePolicy"),
    ".workflows.service": ("WorkflowFailedError", "WorkflowHandle"),
}
#: ``name -> (module, attribute)``; the attribute ``None`` means the module itself.
_LAZY: dict[str, tuple[str, str | None]] = {
    **{name: (module, name) for module, names in _SOURCES.items() for name in names},
    "signals": (".signals", None),
    # The seed's name for the manager.
    "WebhookOutboundManager": (".webhooks.manager", "OutboundWebhookManager"),
}


def __getattr__(name: str) -> Any:
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    module = importlib.import_module(module_name, __name__)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value  # the next lookup is a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "CompletionTrigger",
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
    "HarvestTriggers",
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
    "trigger_service",
    "verify_webhook",
    "workflow_service",
]
