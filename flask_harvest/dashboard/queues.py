"""The workflow queues page: each declared queue's limits, and its running, waiting and due runs.

Shown only when the app uses workflows; read-only, thin over
:func:`~flask_harvest.workflows.queue_views.queue_views` (what the HTTP API and the CLI show).
"""

from __future__ import annotations

from ..workflows.queue_views import queue_views
from ._core import NAV, NavEntry, dashboard, render_page
from .workflows import uses_workflows, workflows_service

NAV.append(NavEntry("Queues", "harvest_dashboard.workflow_queues", uses_workflows, order=25))


@dashboard.get("/workflow-queues")
def workflow_queues() -> tuple[str, int]:
    """The declared queues, by name, with bounded counts."""
    return render_page("workflows/queues.html", queues=queue_views(workflows_service()))
