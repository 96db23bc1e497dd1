"""flask-harvest: reliable outbound webhooks for Flask.

The public names below are imported on first use (:pep:`562`), so that importing one pure module
(``flask_harvest.outbound.signing``, ``flask_harvest.webhooks.outcome``) does not load Flask, SQLAlchemy,
Redis and the HTTP client through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from . import signals
    from ._app import get_engine, trigger_service, workflow_service
    from .engine import HarvestEngine, build_engine
    from .errors import (
        ConfigurationError,
        DeliveryNotFoundError,
        DuplicateSubscriptionError,
        EnqueueError,
        EventTypeNotFoundError,
        HarvestError,
        InvalidFieldError,
        InvalidSecretError,
        InvalidStateError,
        NotFoundError,
        PayloadSchemaError,
        SignatureVerificationError,
        StoreError,
        SubscriptionNotFoundError,
        UnknownEventTypeError,
    )
    from .extension import Harvest, OutboundWebhookPlugin, get_manager
    from .jobs.base import JobBackendError
    from .outbound.rate import RateLimit
    from .outbound.signing import generate_secret
    from .outbound.ssrf import SsrfError, SsrfPolicy, SsrfRejection
    from .receiver import MemoryReplayCache, RedisReplayCache, ReplayCache, WebhookRejected, verify_webhook
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
        OutboundWebhookHandler,
        SqlOutboundWebhookStore,
    )
    from .webhooks.stores import InMemoryOutboundWebhookHandler as InMemoryOutboundWebhookStore
    from .webhooks.stores import OutboundWebhookHandler as OutboundWebhookStore
    from .workflows.models import ExecutionState, ForkMode, IdReusePolicy, ParentClosePolicy
    from .workflows.service import WorkflowFailedError, WorkflowHandle

#: Where each public name lives, by module; imported on first use by :func:`__getattr__`.
_SOURCES: dict[str, tuple[str, ...]] = {
    ".errors": (
        "ConfigurationError",
        "DeliveryNotFoundError",
        "DuplicateSubscriptionError",
        "EnqueueError",
        "EventTypeNotFoundError",
        "HarvestError",
        "InvalidFieldError",
        "InvalidSecretError",
        "InvalidStateError",
        "NotFoundError",
        "PayloadSchemaError",
        "SignatureVerificationError",
        "StoreError",
        "SubscriptionNotFoundError",
        "UnknownEventTypeError",
    ),
    "._app": ("get_engine", "trigger_service", "workflow_service"),
    ".engine": ("HarvestEngine", "build_engine"),
    ".extension": ("Harvest", "get_manager"),
    ".jobs.base": ("JobBackendError",),
    ".receiver": (
        "MemoryReplayCache",
        "RedisReplayCache",
        "ReplayCache",
        "WebhookRejected",
        "verify_webhook",
    ),
    ".outbound.rate": ("RateLimit",),
    ".outbound.signing": ("generate_secret",),
    ".outbound.ssrf": ("SsrfError", "SsrfPolicy", "SsrfRejection"),
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
        "OutboundWebhookHandler",
        "SqlOutboundWebhookStore",
    ),
    ".triggers.definitions": ("CompletionTrigger",),
    ".workflows.models": ("ExecutionState", "ForkMode", "IdReusePolicy", "ParentClosePolicy"),
    ".workflows.service": ("WorkflowFailedError", "WorkflowHandle"),
}
#: The compatibility names, all in one place: each is another name for the same object, kept
#: for code written against the names of the specification flask-harvest implements.
_ALIASES: dict[str, tuple[str, str]] = {
    "OutboundWebhookPlugin": (".extension", "OutboundWebhookPlugin"),  # Harvest, store first
    "OutboundWebhookStore": (".webhooks.stores", "OutboundWebhookHandler"),
    "InMemoryOutboundWebhookStore": (".webhooks.stores", "InMemoryOutboundWebhookHandler"),
    "WebhookOutboundManager": (".webhooks.manager", "OutboundWebhookManager"),
}
#: ``name -> (module, attribute)``; the attribute ``None`` means the module itself.
_LAZY: dict[str, tuple[str, str | None]] = {
    **{name: (module, name) for module, names in _SOURCES.items() for name in names},
    **_ALIASES,
    "signals": (".signals", None),
}


if not TYPE_CHECKING:  # type checkers see the imports above, so a misspelt name is an error

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
    "EventTypeNotFoundError",
    "ExecutionState",
    "ForkMode",
    "Harvest",
    "HarvestEngine",
    "HarvestError",
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
    "ParentClosePolicy",
    "PayloadSchemaError",
    "RateLimit",
    "RedisReplayCache",
    "ReplayCache",
    "SignatureVerificationError",
    "SqlOutboundWebhookStore",
    "SsrfError",
    "SsrfPolicy",
    "SsrfRejection",
    "StoreError",
    "SubscriptionNotFoundError",
    "UnknownEventTypeError",
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
