"""One of each small mechanism across the package: one clock, one requeue helper."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis

import flask_harvest
from flask_harvest import _time
from flask_harvest.jobs.base import JobRef
from flask_harvest.jobs.requeue import requeue_missing
from flask_harvest.jobs.rq import RqBackend
from flask_harvest.webhooks import models as webhook_models
from flask_harvest.workflows import models as workflow_models

PACKAGE = Path(flask_harvest.__file__).parent


def _sources() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield str(path.relative_to(PACKAGE)), ast.parse(path.read_text(encoding="utf-8"))


def _calls_of(attribute: str) -> list[str]:
    """The modules that call ``<anything>.<attribute>(...)``."""
    return sorted(
        {
            name
            for name, tree in _sources()
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == attribute
        }
    )


def test_the_package_reads_the_time_of_day_in_one_place() -> None:
    # Every "now" is the same aware UTC clock; a second copy could drift to a naive or local time.
    assert _calls_of("now") == ["_time.py"]
    assert _calls_of("utcnow") == []  # datetime.utcnow() is naive
    defined = [
        name
        for name, tree in _sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "utcnow"
    ]
    assert defined == ["_time.py"]
    # The models modules still offer it, as the same function.
    assert webhook_models.utcnow is workflow_models.utcnow is _time.utcnow


def test_only_the_requeue_helper_asks_a_backend_which_jobs_are_live() -> None:
    # Every sweeper step queues what has no live job through requeue_missing.
    assert _calls_of("live_jobs") == ["jobs/requeue.py"]


@pytest.mark.redis
def test_requeue_missing_queues_only_the_rows_no_live_job_runs(redis_conn: redis.Redis) -> None:
    backend = RqBackend(redis_conn, "harvest-requeue-test", job_timeout=60)
    queued, asleep, lost = (JobRef("workflow", name) for name in ("ex_queued", "ex_asleep", "ex_lost"))
    # A run that slept waits for the job scheduled for its wake time, not for one queued now; the
    # scheduler has moved that job to the queue (a job still only scheduled when due is lost).
    wake = JobRef("workflow", "ex_asleep", 0, _time.utcnow() - timedelta(seconds=5))
    backend.enqueue([queued, wake])

    assert requeue_missing(backend, [queued, asleep, lost], also={asleep: [wake]}) == [lost]
    assert backend.live_jobs([queued, asleep, lost, wake]) == {queued, lost, wake}
    # Once queued, a row is not queued again.
    assert requeue_missing(backend, [queued, asleep, lost], also={asleep: [wake]}) == []
    # Without the other job it would wait for, the sleeping run's job counts as missing.
    assert requeue_missing(backend, [asleep]) == [asleep]
