"""Stores: where subscriptions and delivery logs live."""

from .base import DlqCursor, OutboundWebhookHandler, OutboundWebhookStore, StoreCapabilities
from .memory import InMemoryOutboundWebhookHandler, InMemoryOutboundWebhookStore
from .sql import SqlOutboundWebhookStore

__all__ = [
    "DlqCursor",
    "InMemoryOutboundWebhookHandler",
    "InMemoryOutboundWebhookStore",
    "OutboundWebhookHandler",
    "OutboundWebhookStore",
    "SqlOutboundWebhookStore",
    "StoreCapabilities",
]
