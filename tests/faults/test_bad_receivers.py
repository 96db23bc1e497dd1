"""Scenario 5: receivers that misbehave, all at once, with healthy deliveries alongside.

A 500 storm (every delivery's first attempt fails), a 429 with ``Retry-After``, a 410, a
redirect to 127.0.0.1, a TLS endpoint with a self-signed certificate, a server that accepts and
never answers, one that drips a byte a second, and one that answers 1 GB. Each is classified as
``docs/delivery.rst`` says, no attempt outlives its deadline, healthy deliveries are not held up,
and the worker's memory stays bounded.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from flask_harvest.outbound.transport import MAX_RESPONSE_BYTES

from .conftest import BASE_CONFIG, FaultEnv, check_invariants, rss_kib, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]
TIME_LIMIT_SECONDS = 120

MAX_ATTEMPTS = 3
RETRY_AFTER = 2
GIGABYTE = 1 << 30
DEADLINE_MS = int(BASE_CONFIG["HARVEST_WEBHOOKS_DEADLINE_SECONDS"] * 1000)
#: How many deliveries each behaviour gets.
COUNTS = {
    "storm": 10,
    "throttled": 3,
    "gone": 1,
    "redirect": 3,
    "badtls": 3,
    "silent": 2,
    "drip": 2,
    "huge": 3,
    "healthy": 30,
}


class RssSampler:
    """Samples a process's resident set size every 50 ms on a thread; keeps the peak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_kib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.peak = max(self.peak, rss_kib(self.pid))
            except (OSError, LookupError):
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.peak


def attempts_by_delivery(faults: FaultEnv) -> dict[str, list[Any]]:
    query = "SELECT * FROM harvest_webhook_attempts ORDER BY delivery_id, attempt, id"
    found: dict[str, list[Any]] = defaultdict(list)
    with faults.inspector.connect() as conn:
        for row in conn.execute(sa.text(query)):
            found[row.delivery_id].append(row)
    return found


def test_misbehaving_receivers_are_classified_and_hold_nobody(faults: FaultEnv) -> None:
    faults.config.update(
        HARVEST_WEBHOOKS_MAX_ATTEMPTS=MAX_ATTEMPTS,
        HARVEST_WEBHOOKS_MAX_BACKOFF_MS=5000,  # lets Retry-After: 2 count
        HARVEST_WEBHOOKS_MAX_INFLIGHT_PER_SUBSCRIPTION=16,
        HARVEST_WEBHOOKS_FAILURE_THRESHOLD=1000,
    )
    receiver = faults.receiver
    # Each storm delivery fails once, then succeeds. (Switching the whole endpoint to "ok" once
    # every delivery had failed raced the retries: the pool gives back a failing endpoint's
    # deliveries beyond its in-flight limit for about a second, so the last first attempt could
    # come after another delivery's last attempt.)
    receiver.mode("storm", "status", status=500, once_per_id=True)
    receiver.mode("throttled", "status", status=429, once_per_id=True, headers={"Retry-After": RETRY_AFTER})
    receiver.mode("gone", "status", status=410)
    receiver.mode("redirect", "status", status=302, headers={"Location": receiver.url("redirected")})
    receiver.mode("silent", "silent")
    receiver.mode("drip", "drip")
    receiver.mode("huge", "huge", bytes=GIGABYTE)
    for name in COUNTS:
        url = receiver.tls_url(name) if name == "badtls" else receiver.url(name)
        faults.subscribe(f"sub_{name}", url, [f"fault.{name}"])

    worker = faults.start_worker(concurrency=32)
    wait_until(lambda: "startup sweep" in worker.log(), 30, "the worker to start")
    time.sleep(0.5)
    baseline = rss_kib(worker.pid)
    sampler = RssSampler(worker.pid)
    started = time.monotonic()
    ids: dict[str, list[str]] = {
        name: [faults.dispatch(f"fault.{name}", {"serial": n, "to": name})[0] for n in range(count)]
        for name, count in COUNTS.items()
    }
    healthy_done = faults.wait_final(ids["healthy"], timeout=30, what="the healthy deliveries")
    every = [i for each in ids.values() for i in each]
    done = faults.wait_final(every, timeout=90)
    peak = sampler.stop()

    summary = check_invariants(faults, every)
    rows = faults.rows(every)
    attempts = attempts_by_delivery(faults)

    def states(name: str) -> set[str]:
        return {rows[i].state for i in ids[name]}

    def errors(name: str) -> set[str | None]:
        return {a.error for i in ids[name] for a in attempts[i]}

    # A storm: failed attempts are retried, then delivered.
    assert states("storm") == {"delivered"}
    assert "server returned status: 500" in errors("storm")
    assert all(len(attempts[i]) >= 2 for i in ids["storm"])
    # 429 + Retry-After: retried, and not before the receiver asked.
    assert states("throttled") == {"delivered"}
    for delivery_id in ids["throttled"]:
        first, second = attempts[delivery_id][:2]
        assert first.response_status == 429
        assert second.started_at - first.started_at >= timedelta(seconds=RETRY_AFTER)
    # 410: dead-lettered at once, the subscription disabled; later dispatches are skipped.
    assert states("gone") == {"dlq"}
    assert all(len(attempts[i]) == 1 for i in ids["gone"])
    assert faults.store.get_subscription("sub_gone").status.value == "disabled"  # type: ignore[union-attr]
    assert faults.dispatch("fault.gone", {"serial": 99}) == []
    # A redirect is a failure and is never followed.
    assert states("redirect") == {"dlq"}
    assert errors("redirect") == {"server returned status: 302"}
    assert not receiver.ids("redirected")
    # A certificate that does not verify: a TLS failure, retried like any other.
    assert states("badtls") == {"dlq"}
    assert errors("badtls") == {"TLS handshake or certificate verification failed"}
    # Silence trips the read timeout; dripping trips the deadline.
    assert states("silent") == {"dlq"}
    assert errors("silent") == {"read timed out after 2 s"}
    assert states("drip") == {"dlq"}
    assert errors("drip") == {"attempt exceeded its deadline of 3 s"}
    # 1 GB: the first 20 KiB are kept, the rest is never read.
    assert states("huge") == {"delivered"}
    for delivery_id in ids["huge"]:
        [attempt] = attempts[delivery_id]
        assert attempt.response_status == 200
        assert len(attempt.response_body) == MAX_RESPONSE_BYTES
    sent = receiver.sent_bytes().get("huge", 0)
    assert sent < COUNTS["huge"] * GIGABYTE // 10, f"the worker read {sent} bytes of the 1 GB answers"

    for name in ("storm", "throttled", "gone", "redirect", "badtls", "silent", "drip"):
        assert all(rows[i].last_error for i in ids[name] if rows[i].state == "dlq"), name
    longest = max(a.elapsed_ms for each in attempts.values() for a in each)
    # The watchdog ends an attempt at its deadline; allow a second for a thread on a busy machine.
    assert longest <= DEADLINE_MS + 1000, f"an attempt took {longest} ms, past the {DEADLINE_MS} ms deadline"
    assert peak - baseline < 64 * 1024, f"the worker grew from {baseline} KiB to {peak} KiB"
    assert worker.alive()
    print(
        f"\nscenario 5: healthy deliveries done {healthy_done - started:.1f} s after dispatch, all "
        f"final {done - started:.1f} s after; longest attempt {longest} ms (deadline {DEADLINE_MS}); "
        f"worker RSS {baseline // 1024} MiB -> peak {peak // 1024} MiB; the receiver sent "
        f"{sent // 1024} KiB of {COUNTS['huge']} GiB; {summary.dlq} dead-lettered"
    )
