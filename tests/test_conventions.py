"""One of each small mechanism across the package: one clock, one requeue helper, one enum spelling."""

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
from flask_harvest.webhooks.models import WebhookSubscriptionStatus
from flask_harvest.workflows import models as workflow_models
from flask_harvest.workflows.models import ExecutionState, IdReusePolicy

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


def _enum_member_names() -> Iterator[tuple[str, str]]:
    """``(module:class, name)`` for every name assigned in the body of an enum class."""
    for module, tree in _sources():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {ast.unparse(base) for base in node.bases}
            if not bases & {"enum.Enum", "Enum", "enum.StrEnum", "StrEnum", "enum.IntEnum", "IntEnum"}:
                continue
            for statement in node.body:
                targets = statement.targets if isinstance(statement, ast.Assign) else []
                for target in targets:
                    if isinstance(target, ast.Name) and not target.id.startswith("_"):
                        yield f"{module}:{node.name}", target.id


def test_every_enum_member_is_spelled_in_upper_case() -> None:
    members = list(_enum_member_names())
    assert len(members) > 50  # the scan found the package's enums
    assert [(where, name) for where, name in members if name != name.upper()] == []


def test_the_wire_values_keep_their_spelling() -> None:
    # The strings stored and sent are data: the members' names do not change them.
    assert [s.value for s in WebhookSubscriptionStatus] == ["active", "disabled", "failed"]
    states = [
        "Pending",
        "Running",
        "Completed",
        "Failed",
        "Cancelled",
        "TimedOut",
        "Terminated",
        "ContinuedAsNew",
    ]
    assert [s.value for s in ExecutionState] == states
    policies = ["AllowDuplicate", "AllowDuplicateFailedOnly", "RejectDuplicate"]
    assert [p.value for p in IdReusePolicy] == policies
    assert WebhookSubscriptionStatus("active") is WebhookSubscriptionStatus.ACTIVE
