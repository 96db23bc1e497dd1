"""The pure core of scheduled workflows: cron text, and which due ticks a sweep starts."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flask_harvest import Harvest
from flask_harvest.errors import ConfigurationError, InvalidFieldError
from flask_harvest.workflows import WorkflowRegistry
from flask_harvest.workflows.cron import CronSchedule, plan_ticks, tick_iso

from .properties import BUDGET, TEXT

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
GRACE = timedelta(seconds=2)
EVERY_SECOND = CronSchedule.parse("* * * * * *")


def seconds(n: float) -> datetime:
    return T0 + timedelta(seconds=n)


def test_six_fields_put_seconds_first() -> None:
    every_ten = CronSchedule.parse("*/10 * * * * *")
    assert every_ten.ticks_between(T0, seconds(30), limit=10) == [seconds(10), seconds(20), seconds(30)]
    every_five_minutes = CronSchedule.parse("*/5 * * * *")
    assert every_five_minutes.next_after(T0) == seconds(300)
    assert CronSchedule.parse("@hourly").next_after(T0) == seconds(3600)


def test_the_last_tick_at_or_before_includes_an_exact_tick() -> None:
    assert EVERY_SECOND.last_at_or_before(seconds(5)) == seconds(5)
    assert EVERY_SECOND.last_at_or_before(seconds(5.5)) == seconds(5)


@pytest.mark.parametrize(
    "text",
    ["", "   ", "x", "* * *", "* * * * * * *", "61 * * * * *", "0 0 30 2 *", "H * * * *", "*/0 * * * *", 5],
)
def test_invalid_cron_text_is_refused(text: object) -> None:
    with pytest.raises(InvalidFieldError) as caught:
        CronSchedule.parse(text)
    assert caught.value.field == "schedule"


def test_an_invalid_schedule_is_refused_at_declaration_naming_the_workflow() -> None:
    """Invalid cron text is a ConfigurationError when the workflow is declared, naming it."""
    harvest = Harvest(workflows=False)
    with pytest.raises(ConfigurationError, match="'nightly'"):
        harvest.workflow("nightly", schedule="every night")
    assert "nightly" not in harvest.registry
    registry = WorkflowRegistry()
    with pytest.raises(ConfigurationError, match=r"'report'.*not valid cron"):
        registry.workflow("report", schedule="99 * * * *")
    with pytest.raises(ConfigurationError, match="at most"):
        registry.workflow("n" * 240, schedule="* * * * *")


def test_a_declared_schedule_is_kept_on_the_definition() -> None:
    registry = WorkflowRegistry()

    @registry.workflow("nightly", schedule="0  3 * * *")
    def nightly(ctx: object, value: object) -> object:
        return value

    assert registry.get("nightly").schedule == CronSchedule("0 3 * * *")


def test_nothing_is_due_before_the_next_tick() -> None:
    assert plan_ticks(EVERY_SECOND, T0, seconds(0.9), catchup=1, grace=GRACE).last is None


def test_on_time_ticks_all_start() -> None:
    plan = plan_ticks(EVERY_SECOND, T0, seconds(2.5), catchup=0, grace=GRACE)
    assert plan.start == (seconds(1), seconds(2))
    assert plan.last == seconds(2)
    assert plan.skipped == 0


def test_after_downtime_only_the_most_recent_missed_ticks_start() -> None:
    """After downtime at most CATCHUP missed ticks start (the most recent); the rest are skipped."""
    plan = plan_ticks(EVERY_SECOND, T0, seconds(12.5), catchup=1, grace=GRACE)
    # 11 and 12 are on time (within 2 s); of the missed 1..10 only 10 starts.
    assert plan.start == (seconds(10), seconds(11), seconds(12))
    assert plan.skipped == 9
    assert plan.skipped_until == seconds(9)
    assert plan.last == seconds(12)
    none_caught_up = plan_ticks(EVERY_SECOND, T0, seconds(12.5), catchup=0, grace=GRACE)
    assert none_caught_up.start == (seconds(11), seconds(12))


def test_a_long_outage_is_planned_without_walking_every_tick() -> None:
    plan = plan_ticks(EVERY_SECOND, T0, T0 + timedelta(days=30), catchup=2, grace=GRACE)
    assert len(plan.start) == 4
    assert plan.skipped == 1000  # counted up to a cap
    assert plan.last == T0 + timedelta(days=30)


@settings(max_examples=60, deadline=None)
@given(
    st.floats(min_value=0, max_value=200),
    st.floats(min_value=0, max_value=200),
    st.integers(min_value=0, max_value=5),
)
def test_two_sweeps_never_plan_a_tick_twice(first: float, later: float, catchup: int) -> None:
    a = plan_ticks(EVERY_SECOND, T0, seconds(first), catchup=catchup, grace=GRACE)
    after = a.last or T0
    b = plan_ticks(EVERY_SECOND, after, seconds(first + later), catchup=catchup, grace=GRACE)
    assert not set(a.start) & set(b.start)
    assert list(a.start) == sorted(a.start) and all(T0 < t <= seconds(first) for t in a.start)
    assert all(after < t <= seconds(first + later) for t in b.start)


def test_tick_text_is_iso_8601() -> None:
    assert tick_iso(seconds(5)) == "2026-01-01T12:00:05+00:00"


CRONS = st.sampled_from(
    ["* * * * * *", "*/7 * * * * *", "*/5 * * * *", "0 */2 * * *", "@hourly", "30 59 23 * * *"]
)
FIELD = st.one_of(
    st.sampled_from(
        ["*", "*/0", "*/61", "0", "59", "60", "1-5", "5-1", "L", "W", "#", "?", "1,2", "-1", "MON"]
    ),
    TEXT,
)


def echo(ctx: object, value: object) -> object:
    return value


@BUDGET
@given(fields=st.lists(FIELD, min_size=0, max_size=8))
def test_any_cron_text_is_accepted_or_refused_with_a_configuration_error(fields: list[str]) -> None:
    """Hostile cron text never escapes as another exception at declaration."""
    registry = WorkflowRegistry()
    refused = None
    try:
        registry.workflow("nightly", schedule=" ".join(fields))(echo)
    except ConfigurationError as exc:
        refused = str(exc)
    if refused is not None:
        assert "'nightly'" in refused
    else:
        schedule = registry.get("nightly").schedule
        assert schedule is not None
        assert schedule.next_after(T0) > T0


@BUDGET
@given(
    cron=CRONS,
    last=st.integers(min_value=0, max_value=10**6),
    elapsed=st.integers(min_value=0, max_value=10**6),
    catchup=st.integers(min_value=0, max_value=4),
    grace=st.integers(min_value=1, max_value=120),
)
def test_a_plan_starts_every_on_time_tick_and_at_most_catchup_missed_ones(
    cron: str, last: int, elapsed: int, catchup: int, grace: int
) -> None:
    schedule = CronSchedule.parse(cron)
    last_tick, now = seconds(last), seconds(last + elapsed + 0.5)
    plan = plan_ticks(schedule, last_tick, now, catchup=catchup, grace=timedelta(seconds=grace))
    boundary = now - timedelta(seconds=grace)
    assert list(plan.start) == sorted(set(plan.start))
    assert all(last_tick < t <= now for t in plan.start)
    on_time = schedule.ticks_between(max(last_tick, boundary), now, limit=10_000)
    assert set(on_time) <= set(plan.start)
    assert len([t for t in plan.start if t <= boundary]) <= catchup
    due = schedule.latest_between(last_tick, now, limit=1)
    assert plan.last == (due[0] if due else None)
