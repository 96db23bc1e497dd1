"""Scenario 6: load, with one subscription failing permanently.

Dispatches are spread over 50 subscriptions while four worker processes deliver. One subscription's
receiver answers 500 to everything: it is auto-disabled (``failed``) once its consecutive failures
reach the threshold, the DLQ holds its deliveries (those that used their attempts, and those still
waiting for a retry when it failed, dead-lettered unsent) and nobody else's, and nothing to the
other 49 is lost. When its receiver recovers, replaying its DLQ delivers each of those deliveries
once more, with the same id.

The size is ``HARVEST_FAULTS_LOAD`` dispatches (see ``docs/reliability.rst`` for the default and why).
"""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest
import sqlalchemy as sa

from .conftest import FaultEnv, check_invariants

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]
DISPATCHES = int(os.environ.get("HARVEST_FAULTS_LOAD", "5000"))
#: About 50 deliveries a second on a busy 2-core machine, and room to spare.
TIME_LIMIT_SECONDS = 180 + DISPATCHES // 25
SUBSCRIPTIONS = 50
WORKERS = 4
MAX_ATTEMPTS = 2
#: The default threshold.
THRESHOLD = 50
FAILING = "sub_00"


def failed_attempts(faults: FaultEnv, subscription_id: str) -> int:
    query = (
        "SELECT count(*) FROM harvest_webhook_attempts a JOIN harvest_webhook_deliveries d "
        "ON d.id = a.delivery_id WHERE d.subscription_id = :sub AND a.error IS NOT NULL"
    )
    with faults.inspector.connect() as conn:
        return int(conn.execute(sa.text(query), {"sub": subscription_id}).scalar_one())


def test_load_with_a_permanently_failing_subscription(faults: FaultEnv) -> None:
    faults.config.update(
        HARVEST_WEBHOOKS_MAX_ATTEMPTS=MAX_ATTEMPTS,
        HARVEST_WEBHOOKS_FAILURE_THRESHOLD=THRESHOLD,
    )
    for n in range(SUBSCRIPTIONS):
        faults.subscribe(f"sub_{n:02d}", faults.receiver.url(f"r{n:02d}"), [f"load.s{n:02d}"])
    faults.receiver.mode("r00", "status", status=500)
    workers = [faults.start_worker(concurrency=16) for _ in range(WORKERS)]

    started = time.monotonic()
    returned: dict[str, list[str]] = {f"sub_{n:02d}": [] for n in range(SUBSCRIPTIONS)}
    for serial in range(DISPATCHES):
        sub = serial % SUBSCRIPTIONS
        returned[f"sub_{sub:02d}"] += faults.dispatch(f"load.s{sub:02d}", {"serial": serial})
    dispatched_in = time.monotonic() - started
    every = [i for ids in returned.values() for i in ids]
    done = faults.wait_final(every, timeout=TIME_LIMIT_SECONDS - 90)

    summary = check_invariants(faults, every)
    rows = faults.rows()
    by_state = Counter((row.subscription_id == FAILING, row.state) for row in rows.values())
    healthy = sum(len(ids) for sub, ids in returned.items() if sub != FAILING)
    assert by_state[(False, "delivered")] == healthy, by_state
    failing = faults.store.get_subscription(FAILING)
    assert failing is not None and failing.status.value == "failed"
    # The threshold stops it: at most the attempts already in flight (a cap per process) add to it.
    failures = failed_attempts(faults, FAILING)
    assert THRESHOLD <= failures <= THRESHOLD + WORKERS * 8, failures
    dlq = {i: row for i, row in rows.items() if row.state == "dlq"}
    assert dlq, "the failing subscription dead-lettered nothing"
    assert {row.subscription_id for row in dlq.values()} == {FAILING}
    # Each used its attempts, or waited for a retry when the subscription failed (and was not sent).
    used_up = {i for i, row in dlq.items() if row.last_error == "server returned status: 500"}
    unsent = {i for i, row in dlq.items() if row.last_error == "subscription is failed; not sent"}
    assert used_up | unsent == set(dlq), {row.last_error for row in dlq.values()}
    assert all(dlq[i].attempt == MAX_ATTEMPTS for i in used_up)
    skipped_at_dispatch = sum(
        1 for row in rows.values() if row.subscription_id == FAILING and row.id not in set(returned[FAILING])
    )

    # The receiver recovers; the operator re-enables the subscription and replays its DLQ.
    faults.receiver.mode("r00", "ok")
    faults.store.set_subscription_status(FAILING, failing.status.ACTIVE)
    receipts_before = Counter(r.webhook_id for r in faults.receiver.receipts())
    replay_started = time.monotonic()
    with faults.app().app_context():
        replayed = faults.state.operations.replay_many(subscription_id=FAILING, limit=1000)
    assert sorted(replayed.delivery_ids) == sorted(dlq)
    replay_done = faults.wait_final(list(dlq), timeout=60, what="the replayed deliveries")
    assert {row.state for row in faults.rows(dlq).values()} == {"delivered"}
    receipts_after = Counter(r.webhook_id for r in faults.receiver.receipts())
    for delivery_id in dlq:
        assert receipts_after[delivery_id] == receipts_before[delivery_id] + 1, delivery_id
    check_invariants(faults, every)
    assert all(w.alive() for w in workers)
    print(
        f"\nscenario 6: {DISPATCHES} dispatches over {SUBSCRIPTIONS} subscriptions in {dispatched_in:.0f} s; "
        f"{healthy} healthy deliveries all delivered {done - started:.0f} s after the first dispatch "
        f"({healthy / (done - started):.0f}/s with {WORKERS} workers); {FAILING} failed after {failures} "
        f"failed attempts (threshold {THRESHOLD}); DLQ {len(dlq)} ({len(unsent)} of them unsent), "
        f"skipped at dispatch {skipped_at_dispatch}; replay delivered all "
        f"{len(dlq)} in {replay_done - replay_started:.1f} s; {summary.duplicates} duplicate(s)"
    )


def test_deliveries_accepted_before_their_subscription_fails_are_delivered_or_dead_lettered(
    faults: FaultEnv,
) -> None:
    faults.config.update(HARVEST_WEBHOOKS_MAX_ATTEMPTS=3, HARVEST_WEBHOOKS_FAILURE_THRESHOLD=3)
    faults.subscribe("sub_failing", faults.receiver.url("failing"), ["fault.*"])
    faults.receiver.mode("failing", "status", status=500)
    ids = [faults.dispatch("fault.created", {"serial": n})[0] for n in range(10)]
    faults.start_worker(concurrency=16)
    faults.wait_final(ids, timeout=60)
    states = {row.id: (row.state, row.last_error) for row in faults.rows(ids).values()}
    stranded = {i: s for i, s in states.items() if s[0] not in ("delivered", "dlq")}
    assert not stranded, (
        f"{len(stranded)} of {len(ids)} accepted deliveries were neither sent nor dead-lettered"
    )
    # Those still waiting for a retry when the subscription failed are dead-lettered unsent.
    assert ("dlq", "subscription is failed; not sent") in states.values()
    check_invariants(faults, ids)
