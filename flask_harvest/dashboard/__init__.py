"""The operator dashboard: server-rendered pages over the webhook operations (and, when the app
uses them, workflows and triggers), opened like the actuator.

Enable it with ``HARVEST_DASHBOARD = True``; see ``docs/dashboard.rst``. Each page module adds its
routes, navigation entries and overview panels to the blueprint of :mod:`._core` when imported
here.
"""

from __future__ import annotations

from . import (
    access,
    dlq_select,
    event_types,
    failed_callbacks,
    forks,
    overview,
    queues,
    schedules,
    search,
    start_run,
    subscription_admin,
    trigger_admin,
    triggers,
    webhooks,
    when,
    workflows,
)
from ._core import CONTENT_SECURITY_POLICY, NAV, PANELS, NavEntry, Panel, dashboard, install_dashboard

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "NAV",
    "PANELS",
    "NavEntry",
    "Panel",
    "access",
    "dashboard",
    "dlq_select",
    "event_types",
    "failed_callbacks",
    "forks",
    "install_dashboard",
    "overview",
    "queues",
    "schedules",
    "search",
    "start_run",
    "subscription_admin",
    "trigger_admin",
    "triggers",
    "webhooks",
    "when",
    "workflows",
]
