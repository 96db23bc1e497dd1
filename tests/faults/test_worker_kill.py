"""Scenario 1: a worker is SIGKILLed in the middle of 200 deliveries to a slow receiver.

A new worker takes over. Everything is delivered, and the deliveries the dead worker had in flight
come back after about one lease (``HARVEST_WEBHOOKS_LEASE_SECONDS``, 4 s here), not after RQ's
abandoned-job timeout (minutes).
"""

from __future__ import annotations

import time
from typing import cast

import pytest

from flask_harvest.jobs.base import row_id_of
from flask_harvest.webhooks.delivery import WEBHOOK_JOB

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
    assert recovery < lease + 15, recovery  # minutes if it waited for RQ; slack for a loaded machine


def _delivery_waiting_in_a_started_job(faults: FaultEnv) -> str | None:
    """The delivery whose RQ job the worker has started but not yet claimed (waiting for a slot)."""
    client = faults.redis_server.client()
    try:
        executions = cast("list[bytes]", client.zrange("rq:wip:faults", 0, -1))  # bytes: not decoded
    finally:
        client.close()
    for execution in executions:
        job_id = execution.decode().split(":")[0]  # harvest-webhook-<delivery id>-<attempt>-<due ms>
        delivery_id = row_id_of(job_id, WEBHOOK_JOB)
        row = faults.rows([delivery_id]).get(delivery_id)
        if row is not None and row.state == "pending":
            return delivery_id
    return None


def test_a_full_worker_takes_no_job_it_cannot_start_so_a_kill_strands_none(faults: FaultEnv) -> None:
    # A job taken while every slot is busy would sit STARTED with its row PENDING, and a kill then
    # would strand it until the job looks dead. The worker waits for a slot before taking a job.
    lease = float(BASE_CONFIG["HARVEST_WEBHOOKS_LEASE_SECONDS"])
    faults.receiver.mode("slow", "slow", delay=2.0)
    faults.subscribe("sub_slow", faults.receiver.url("slow"))
    ids = [faults.dispatch("fault.created", {"serial": n})[0] for n in range(30)]
    doomed = faults.start_worker(concurrency=2)
    wait_until(lambda: len(faults.receiver.ids("slow")) >= 2, 30, "every slot to be busy")
    end = time.monotonic() + 1.5  # most of a slow answer: every slot stays busy meanwhile
    while time.monotonic() < end:
        assert _delivery_waiting_in_a_started_job(faults) is None
        time.sleep(0.02)
    doomed.kill()
    faults.start_worker(concurrency=4)
    faults.wait_final(ids, timeout=60 + lease)
    check_invariants(faults, ids)


def test_a_job_a_killed_worker_had_just_dequeued_is_recovered_within_a_lease(faults: FaultEnv) -> None:
    lease = float(BASE_CONFIG["HARVEST_WEBHOOKS_LEASE_SECONDS"])
    faults.subscribe("sub_ok", faults.receiver.url("ok"))
    ids = [faults.dispatch("fault.created", {"serial": n})[0] for n in range(3)]
    # What a worker SIGKILLed between RQ's BLMOVE and the job's start leaves in Redis (the window
    # is a few Redis round trips per job, too short to hit with a real kill on demand).
    client = faults.redis_server.client()
    try:
        stranded = cast(
            "bytes | None", client.lmove("rq:queue:faults", "rq:queue:faults:intermediate", "LEFT", "RIGHT")
        )
        assert stranded is not None and client.hget(b"rq:job:" + stranded, "status") == b"queued"
    finally:
        client.close()
    faults.start_worker(concurrency=4)
    end = time.monotonic() + lease + 10
    while time.monotonic() < end and not faults.all_final(ids):
        time.sleep(0.2)
    assert faults.all_final(ids), f"{faults.states(ids)} {lease + 10:g} s after a new worker started"
    check_invariants(faults, ids)
