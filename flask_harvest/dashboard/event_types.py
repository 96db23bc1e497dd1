"""The event catalog page: every event type with its description, version, schema and example.

Read-only, thin over :meth:`~flask_harvest.webhooks.operations.WebhookOperations.event_types` (what
the actuator and the CLI show).
"""

from __future__ import annotations

import json

from .._app import get_engine
from ._core import NAV, NavEntry, always, dashboard, render_page

# After the webhook pages (order 10), before the workflow pages (20).
NAV.append(NavEntry("Event types", "harvest_dashboard.event_types", always, order=11))


@dashboard.get("/webhooks/event-types")
def event_types() -> tuple[str, int]:
    """The catalog, by name; the schemas and examples as indented JSON."""
    shown = [
        {
            "type": event_type,
            "schema": json.dumps(event_type.schema, indent=2, ensure_ascii=False),
            "example": json.dumps(event_type.example, indent=2, ensure_ascii=False),
        }
        for event_type in get_engine().operations.event_types()
    ]
    return render_page("webhooks/event_types.html", types=shown)
