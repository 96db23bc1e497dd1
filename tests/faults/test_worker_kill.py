"""Scenario 1: a worker is SIGKILLed in the middle of 200 deliveries to a slow receiver.

A new worker takes over. Everything is delivered, and the deliveries the dead worker had in flight
come back after about one lease (``HARVEST_WEBHOOKS_LEASE_SECONDS``, 4 s here), not after RQ's
abandoned-job timeout (minutes).
"""

from __future__ import annotations

import time

import pytest

from .conftest import BASE_CONFIG, FaultEnv, check_invariants, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]
TIME_LIMIT_SECONDS = 120

COUNT = 200
#: Each request takes this long at the receiver.
DELAY = 0.5


def test_a_killed_worker_is_replaced_and_its_deliveries_recovered_within_a_lease(faults: FaultEnv) -> None:
    lease = float(BASE_CONFIG["HARVEST_WEBHOOKS_LEASE_SECONDS"])
    faults.config["HARVEST_WEBHOOKS_MAX_INFLIGHT_PER_SUBSCRIPTION"] = 16
    faults.receiver.mode("slow", "slow", delay=DELAY)
    faults.subscribe("sub_slow", faults.receiver.url("slow"))
    ids = [faults.dispatch("fault.created", {"serial": n})[0] for n in range(COUNT)]

    doomed = faults.start_worker(concurrency=16)
    wait_until(lambda: len(faults.receiver.ids()) >= COUNT // 3, 60, "a third of the deliveries")
    doomed.kill()
    killed_at = time.monotonic()
    in_flight = [i for i, row in faults.rows(ids).items() if row.state == "inflight"]
    assert in_flight, "the worker had no attempt in flight when it was killed"

    faults.start_worker(concurrency=16)
    recovered_at = faults.wait_final(in_flight, timeout=60, what="the killed worker's deliveries")
    done_at = faults.wait_final(ids, timeout=60)

    summary = check_invariants(faults, ids)
    assert summary.delivered == COUNT
    recovery = recovered_at - killed_at
    print(
        f"\nscenario 1: {len(in_flight)} in flight at the kill, recovered {recovery:.1f} s after it; "
        f"all {COUNT} delivered {done_at - killed_at:.1f} s after it; {summary.duplicates} duplicate(s)"
    )
    # About one lease (plus a sweep and the slow answer), far below RQ's abandoned-job timeout.
    assert recovery < lease + 5, recovery


def _delivery_waiting_in_a_started_job(faults: FaultEnv) -> str | None:
    """The delivery whose RQ job the worker has started but not yet claimed (waiting for a slot)."""
    client = faults.redis_server.client()
    try:
        executions = client.zrange("rq:wip:faults", 0, -1)
    finally:
        client.close()
    for execution in executions:
        job_id = execution.decode().split(":")[0]  # harvest-<delivery id>-<attempt>-<due ms>
        delivery_id = job_id.split("-")[1]
        row = faults.rows([delivery_id]).get(delivery_id)
        if row is not None and row.state == "pending":
            return delivery_id
    return None


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason=(
        "bug: a delivery whose RQ job the killed worker had started but not yet claimed (the job "
        "waits in DeliveryPool.deliver for a free slot) stays PENDING with a STARTED job; "
        "RqBackend.live_jobs counts a STARTED job as live for the whole RQ job timeout "
        "(deadline + connect timeout + 30 s: 34 s here, 65 s by default), so the sweeper requeues it "
        "only then, not after about one lease"
    ),
)
def test_a_delivery_waiting_for_a_slot_in_a_killed_worker_is_recovered_within_a_lease(
    faults: FaultEnv,
) -> None:
    lease = float(BASE_CONFIG["HARVEST_WEBHOOKS_LEASE_SECONDS"])
    faults.receiver.mode("slow", "slow", delay=2.0)
    faults.subscribe("sub_slow", faults.receiver.url("slow"))
    ids = [faults.dispatch("fault.created", {"serial": n})[0] for n in range(30)]
    for _ in range(3):
        doomed = faults.start_worker(concurrency=2)
        # Every slot is busy, so the worker's current RQ job waits for one before it claims its row.
        blocked = wait_until(
            lambda: _delivery_waiting_in_a_started_job(faults), 30, "a job waiting for a slot", interval=0.02
        )
        doomed.kill()
        killed_at = time.monotonic()
        if faults.rows([blocked])[blocked].state == "pending":
            break
        # The job claimed its row just before the kill: forget the dead job and try again.
        client = faults.redis_server.client()
        client.delete("rq:wip:faults")
        client.close()
    else:
        pytest.fail("could not kill a worker while its job waited for a slot")
    faults.start_worker(concurrency=4)
    deadline = killed_at + lease + 6
    while time.monotonic() < deadline and not faults.all_final([blocked]):
        time.sleep(0.1)
    assert faults.all_final([blocked]), (
        f"{blocked} was still {faults.rows([blocked])[blocked].state} {lease + 6:g} s after the kill"
    )
    faults.wait_final(ids, timeout=60)
    check_invariants(faults, ids)
