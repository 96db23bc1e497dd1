"""Completion callbacks: a signed POST to registered URLs when a workflow execution ends.

Register targets per execution at start (``completion_callbacks=[{"url", "filter"}]``) or app-wide
(``HARVEST_COMPLETION_CALLBACK_DEFAULTS``); the terminal transition enqueues one delivery row per
matching target in its own transaction, and the workers POST the frozen, signed envelope with
retries, dead-lettering and redrive. See ``docs/callbacks.rst``.
"""

from __future__ import annotations

from ..outbound.attempt import DeliveryState
from .envelope import SIGNATURE_HEADER, TIMESTAMP_HEADER, CallbackSecret, build_envelope
from .filters import ANY_TERMINAL, COMPLETED_ONLY, EventFilter
from .outcome import DEFAULT_RETRY_POLICY, callback_retry_policy
from .policy import CallbackPolicy, HostPattern, Rejection, RejectionType, parse_allowlist
from .service import CALLBACK_JOB, CompletionCallbacks, CompletionDeliveryNotFoundError, policy_from_settings
from .store import CompletionDelivery, SqlCallbackStore
from .targets import CallbackTarget, CallbackTargetRejected, normalise_targets, parse_targets

__all__ = [
    "ANY_TERMINAL",
    "CALLBACK_JOB",
    "COMPLETED_ONLY",
    "DEFAULT_RETRY_POLICY",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "CallbackPolicy",
    "CallbackSecret",
    "CallbackTarget",
    "CallbackTargetRejected",
    "CompletionCallbacks",
    "CompletionDelivery",
    "CompletionDeliveryNotFoundError",
    "DeliveryState",
    "EventFilter",
    "HostPattern",
    "Rejection",
    "RejectionType",
    "SqlCallbackStore",
    "build_envelope",
    "callback_retry_policy",
    "normalise_targets",
    "parse_allowlist",
    "parse_targets",
    "policy_from_settings",
]
