"""Ordered delivery per key through failures, retries and a killed worker.

1,000 events over 20 ordering keys go to one subscription whose receiver fails a fixed fifth of
the first attempts (chosen by a hash of the delivery id), served by two worker processes, one of
which is SIGKILLed mid-run and replaced. Per key, the receiver's order of first successful receipt
is the dispatch order, no delivery of a key reaches the receiver before its predecessor was
received with success, and nothing is lost.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest

from .conftest import FaultEnv, check_invariants, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]
TIME_LIMIT_SECONDS = 300

COUNT = 1000
KEYS = 20


def test_each_key_arrives_in_dispatch_order_through_failures_and_a_killed_worker(faults: FaultEnv) -> None:
    faults.config["HARVEST_WEBHOOKS_FAILURE_THRESHOLD"] = 100_000
    faults.receiver.mode("ordered", "status", status=500, once_per_id=True, percent=20)
    faults.subscribe("sub_ordered", faults.receiver.url("ordered"))
    order: dict[str, list[str]] = defaultdict(list)
    ids = []
    for n in range(COUNT):
        key = f"customer-{n % KEYS}"
        (delivery_id,) = faults.dispatch("fault.created", {"serial": n}, ordering_key=key)
        order[key].append(delivery_id)
        ids.append(delivery_id)

    doomed = faults.start_worker(concurrency=16)
    faults.start_worker(concurrency=16)
    wait_until(lambda: len(faults.receiver.ids()) >= COUNT // 3, 120, "a third of the deliveries")
    doomed.kill()
    faults.start_worker(concurrency=16)
    faults.wait_final(ids, timeout=240)

    summary = check_invariants(faults, ids)
    assert summary.delivered == COUNT
    receipts = faults.receiver.receipts()
    first_seen: dict[str, int] = {}
    first_success: dict[str, int] = {}
    for index, receipt in enumerate(receipts):
        if receipt.webhook_id is None:
            continue
        first_seen.setdefault(receipt.webhook_id, index)
        if receipt.answered_2xx:
            first_success.setdefault(receipt.webhook_id, index)
    failed_first = sum(1 for i in ids if first_seen[i] != first_success[i])
    assert failed_first > COUNT // 10, "the receiver failed too few first attempts to test anything"
    for key, line in order.items():
        arrived = sorted(line, key=first_success.__getitem__)
        assert arrived == line, f"{key}: first successful receipts out of dispatch order"
        for earlier, later in itertools.pairwise(line):
            # Not even attempted before the one ahead of it was received with success.
            assert first_seen[later] > first_success[earlier], (key, earlier, later)
    print(
        f"\nordered: {COUNT} over {KEYS} keys, {failed_first} first attempts failed, "
        f"{summary.duplicates} duplicate(s) after the kill; every key in dispatch order"
    )
