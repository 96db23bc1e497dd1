"""Scenario 2: Redis loses everything while 500 deliveries wait in it.

250 deliveries are scheduled for a retry (their first attempt got ``503`` with ``Retry-After: 8``)
and 250 more sit in the queue behind a slow receiver when Redis is wiped (``FLUSHDB``) or crashes
and comes back empty (``SIGKILL``, then a restart without persistence). A worker runs throughout
(the harness would restart it if it exited, as a process manager does; it does not). Every job is
gone; the rows are not: the sweeper rebuilds the queue from SQL and everything is delivered.

RQ's worker loop ends when Redis goes away under a running job; ``flask harvest worker`` starts a
new one (``test_a_worker_rides_out_a_redis_restart``).
"""

from __future__ import annotations

import re
import time

import pytest

from .conftest import FaultEnv, check_invariants, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]
TIME_LIMIT_SECONDS = 120

SCHEDULED = 250
QUEUED = 250
RETRY_AFTER = 8


@pytest.mark.parametrize("fault", ["flushdb", "restart"])
def test_the_sweeper_rebuilds_the_queue_after_redis_loses_it(faults: FaultEnv, fault: str) -> None:
    faults.config.update(
        HARVEST_WEBHOOKS_MAX_INFLIGHT_PER_SUBSCRIPTION=16,
        # Retry-After is honoured up to the backoff cap.
        HARVEST_WEBHOOKS_MAX_BACKOFF_MS=10_000,
        # 250 first attempts fail on purpose: the subscription must not be disabled for it.
        HARVEST_WEBHOOKS_FAILURE_THRESHOLD=10_000,
    )
    faults.receiver.mode(
        "retry", "status", status=503, once_per_id=True, headers={"Retry-After": RETRY_AFTER}
    )
    faults.receiver.mode("backlog", "slow", delay=0.2)
    faults.subscribe("sub_retry", faults.receiver.url("retry"), ["fault.retry"])
    faults.subscribe("sub_backlog", faults.receiver.url("backlog"), ["fault.backlog"])
    worker = faults.start_worker(concurrency=16, restart=True)

    retried = [faults.dispatch("fault.retry", {"serial": n})[0] for n in range(SCHEDULED)]
    wait_until(lambda: len(faults.receiver.ids("retry")) == SCHEDULED, 60, "every first attempt")
    wait_until(
        lambda: all(row.attempt == 2 or row.state == "delivered" for row in faults.rows(retried).values()),
        30,
        lambda: f"every first attempt to be recorded (the retries are {faults.states(retried)})",
    )
    queued = [faults.dispatch("fault.backlog", {"serial": n})[0] for n in range(QUEUED)]
    wait_until(lambda: faults.receiver.ids("backlog"), 10, "the backlog to start moving")

    faulted_at = time.monotonic()
    if fault == "flushdb":
        faults.redis_server.flushdb()
    else:
        faults.redis_server.kill()
        time.sleep(1.0)  # an outage, not just a blip
        faults.redis_server.start()
    scheduled = faults.states(retried).get("pending", 0)
    waiting = faults.states(queued).get("pending", 0) + scheduled
    assert scheduled, "no retry was still scheduled when Redis was lost (a very slow machine?)"

    done_at = faults.wait_final(retried + queued, timeout=60)
    summary = check_invariants(faults, retried + queued)
    assert summary.delivered == SCHEDULED + QUEUED
    print(
        f"\nscenario 2 ({fault}): {waiting} deliveries waiting in Redis when it was lost; "
        f"all delivered {done_at - faulted_at:.1f} s after the fault "
        f"(retries were due up to {RETRY_AFTER} s after their first attempt); "
        f"{summary.duplicates} duplicate(s); the worker exited {len(worker.exits)} time(s) {worker.exits}"
    )
    # The queue was rebuilt by a sweep (a periodic one, or the start-up sweep of a restarted worker).
    rebuilt = re.compile(r"sweep released \d+(?: expired lease\(s\) and|,) requeued [1-9]")
    assert rebuilt.search(worker.log()), worker.log()[-3000:]


def test_a_worker_rides_out_a_redis_restart(faults: FaultEnv) -> None:
    faults.receiver.mode("backlog", "slow", delay=1.0)
    faults.subscribe("sub_backlog", faults.receiver.url("backlog"), ["fault.backlog"])
    worker = faults.start_worker(concurrency=4)
    ids = [faults.dispatch("fault.backlog", {"serial": n})[0] for n in range(40)]
    # Every slot is busy: the worker's RQ job waits for one, so a job is running when Redis dies.
    wait_until(lambda: len(faults.receiver.ids("backlog")) >= 4, 30, "every slot to be busy")
    faults.redis_server.kill()
    time.sleep(3.0)
    faults.redis_server.start()
    time.sleep(2.0)
    assert worker.alive(), worker.log()[-4000:]
    faults.wait_final(ids, timeout=60)
    check_invariants(faults, ids)
