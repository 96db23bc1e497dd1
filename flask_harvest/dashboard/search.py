"""The search box in the navigation: an exact id, sent to its page.

One box finds a delivery by its delivery id or by the outbox message id it was made from, and a
workflow execution by its execution id or its ``workflow_id``. Every lookup is an exact match on
a primary key or an index (no ``LIKE``, no scan): one hit redirects to its page, several are
listed, none answers 404 "Not found".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flask import redirect, url_for
from werkzeug.wrappers import Response as BaseResponse

from .._app import get_engine
from .._input import id_problem
from ..engine import HarvestEngine
from ..http.forms import query_text
from ..webhooks.manager import outbox_delivery_id
from ._core import dashboard, render_page

#: The longest text the box takes (an id is at most 255 characters; a little room for spaces).
MAX_QUERY_CHARS = 512


@dataclass(frozen=True)
class Hit:
    """One thing the search found: what it is, its id and its page's endpoint and arguments."""

    kind: str
    label: str
    endpoint: str
    argument: str
    value: str

    @property
    def url(self) -> str:
        values: dict[str, Any] = {self.argument: self.value}
        return url_for(self.endpoint, **values)


def _delivery(kind: str, delivery_id: str) -> Hit:
    return Hit(kind, delivery_id, "harvest_dashboard.delivery", "delivery_id", delivery_id)


def _execution(kind: str, execution_id: str) -> Hit:
    return Hit(kind, execution_id, "harvest_dashboard.execution", "execution_id", execution_id)


def message_deliveries(engine: HarvestEngine, message_id: str) -> list[str]:
    """The ids of the deliveries relayed from outbox message ``message_id``: derived from the
    message id and each subscription of its topic (from the topic index), then looked up."""
    outbox = engine.operations.manager.outbox
    if outbox is None:
        return []
    topic = outbox.topic_of(message_id)
    if topic is None:
        return []
    store = engine.operations.store
    subscriptions = store.subscriptions_for_topics([topic])[topic]
    candidates = [outbox_delivery_id(message_id, s.id) for s in subscriptions]
    return sorted(d.id for d in store.get_deliveries(candidates))


def find(engine: HarvestEngine, query: str) -> list[Hit]:
    """Everything whose id is exactly ``query``: deliveries first, then executions."""
    if id_problem(query) is not None:
        return []  # no row can have this id: nothing is asked of a store
    hits: list[Hit] = []
    store = engine.operations.store
    if store.get_delivery(query) is not None:
        hits.append(_delivery("Delivery", query))
    hits.extend(_delivery(f"Delivery of message {query}", d) for d in message_deliveries(engine, query))
    workflows = engine.workflows
    if workflows is not None:
        by_id = workflows.store.get(query)
        if by_id is not None:
            hits.append(_execution("Workflow execution", query))
        # The latest run of the workflow_id (the open one if any); a finished key may have several.
        latest = workflows.store.get_by_workflow_id(query)
        if latest is not None and (by_id is None or latest.execution_id != by_id.execution_id):
            hits.append(_execution(f"Latest run of workflow_id {query}", latest.execution_id))
    return hits


@dashboard.get("/search")
def search() -> BaseResponse | tuple[str, int]:
    """Find an id: redirect to the one page it names, list several, or say it was not found."""
    query = query_text("q", max_chars=MAX_QUERY_CHARS)
    if query is None:
        return render_page("search.html", query="", search_query="", hits=[], searched=False)
    hits = find(get_engine(), query)
    if len(hits) == 1:
        return redirect(hits[0].url, 303)
    return render_page(
        "search.html", status=200 if hits else 404, query=query, search_query=query, hits=hits, searched=True
    )
