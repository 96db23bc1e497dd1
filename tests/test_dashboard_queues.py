"""The dashboard's workflow queues page, on SQLite and PostgreSQL; absent without workflows."""

from __future__ import annotations

import pytest
from flask import Flask

from flask_harvest import OutboundWebhookHandler, get_engine

from .dashboard_client import PREFIX, SECRET_KEY, dashboard_app, signed_in, text
from .workflow_app import TOKEN, database_url_fixture, make_workflow_app

__all__ = ["database_url_fixture"]

QUEUES = {"emails": {"concurrency": 2, "rate_limit": [10, 1.5]}, "<b>odd</b>": {}}


@pytest.fixture
def app(database_url: str, redis_url: str) -> Flask:
    # Runs are queued on Redis with no worker: the counts stay as started.
    return make_workflow_app(
        database_url,
        HARVEST_DASHBOARD=True,
        SECRET_KEY=SECRET_KEY,
        HARVEST_JOBS_BACKEND="rq",
        HARVEST_REDIS_URL=redis_url,
        HARVEST_WORKFLOW_QUEUES=QUEUES,
    )


def test_the_queues_page_shows_limits_and_counts(app: Flask) -> None:
    with app.app_context():
        for _ in range(3):
            get_engine().workflows.start("echo", None, queue="emails")  # type: ignore[union-attr]
    client = app.test_client()
    assert client.get(f"{PREFIX}/workflow-queues").status_code in (302, 303, 401, 403)
    signed_in(client, TOKEN)
    response = client.get(f"{PREFIX}/workflow-queues")
    assert response.status_code == 200
    page = text(response)
    assert ">Queues<" in page.split("</nav>")[0]
    assert "emails" in page and "10 per 1.5 s" in page
    assert '<td class="num">3</td>' in page  # waiting
    assert "<b>odd</b>" not in page and "&lt;b&gt;odd&lt;/b&gt;" in page


def test_the_queues_page_is_absent_without_workflows(store: OutboundWebhookHandler) -> None:
    client = dashboard_app(store).test_client()
    signed_in(client)
    assert ">Queues<" not in text(client.get(f"{PREFIX}/"))
    assert client.get(f"{PREFIX}/workflow-queues").status_code == 404
