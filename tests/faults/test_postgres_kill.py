"""Scenario 3: PostgreSQL connections are terminated (``pg_terminate_backend``) again and again.

During dispatch, ``dispatch()`` either returns the ids of its whole fan-out (and every row is
there) or raises a clear :class:`~flask_harvest.errors.HarvestError`; a fan-out is never
half-written. During delivery, the workers survive, reconnect and carry on, and everything is
delivered.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from flask_harvest import HarvestError, StoreError

from ..conftest import DATABASE_URL
from .conftest import FaultEnv, check_invariants, find_canary, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]
TIME_LIMIT_SECONDS = 150

FAN_OUT = 3


@contextmanager
def terminating_connections(faults: FaultEnv, every: tuple[float, float]) -> Iterator[list[int]]:
    """Terminate every connection to the group's database at random intervals within ``every``."""
    stop = threading.Event()
    killed: list[int] = []

    def run() -> None:
        while not stop.wait(random.uniform(*every)):
            killed.append(faults.terminate_backends())

    thread = threading.Thread(target=run, name="pg-terminator", daemon=True)
    thread.start()
    try:
        yield killed
    finally:
        stop.set()
        thread.join(timeout=10)


@contextmanager
def database_down(faults: FaultEnv) -> Iterator[None]:
    """Refuse every new connection to the group's database, and end the open ones, for a while."""
    set_connections(faults, allowed=False)
    try:
        faults.terminate_backends()
        yield
    finally:
        set_connections(faults, allowed=True)


def set_connections(faults: FaultEnv, *, allowed: bool) -> None:
    admin = sa.create_engine(sa.make_url(DATABASE_URL), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    try:
        with admin.connect() as conn:
            name = faults.database_url.database
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS {str(allowed).lower()}')
    finally:
        admin.dispose()


def serial_of(payload: str) -> int:
    return int(json.loads(payload)["serial"])


def test_dispatch_succeeds_whole_or_raises_clearly_while_connections_die(faults: FaultEnv) -> None:
    for n in range(FAN_OUT):
        faults.subscribe(f"sub_{n}", faults.receiver.url(f"r{n}"), ["fault.pg"])
    workers = [faults.start_worker(concurrency=8) for _ in range(2)]
    wait_until(lambda: faults.worker_logs().count("startup sweep") == 2, 30, "the workers to start")
    returned: dict[int, list[str]] = {}
    raised: dict[int, BaseException] = {}
    with terminating_connections(faults, (0.02, 0.1)) as killed:
        for serial in range(300):
            try:
                returned[serial] = faults.dispatch("fault.pg", {"serial": serial})
            except HarvestError as exc:  # anything else is not "a clear error": it fails the test
                raised[serial] = exc
            time.sleep(0.005)
    assert sum(killed) > 0 and raised, "no connection was terminated during a dispatch"

    by_serial: dict[int, list[str]] = {}
    for row in faults.rows().values():
        by_serial.setdefault(serial_of(row.payload), []).append(row.id)
    for serial, ids in returned.items():
        assert len(ids) == FAN_OUT, (serial, ids)
        assert sorted(by_serial.get(serial, [])) == sorted(ids), (
            f"dispatch {serial} returned ids not all stored"
        )
    ambiguous: list[str] = []
    for serial, error in raised.items():
        assert isinstance(error, StoreError), repr(error)
        message = str(error)
        assert message.startswith("could not ") and "postgresql" in message, message
        assert "[parameters:" not in message and not find_canary(message), message
        written = by_serial.get(serial, [])
        assert len(written) in (0, FAN_OUT), f"dispatch {serial} raised and left a partial fan-out: {written}"
        ambiguous += written  # the commit went through, its answer was lost: sent, never returned

    dispatched = [i for ids in returned.values() for i in ids]
    faults.wait_final(dispatched + ambiguous, timeout=60)
    summary = check_invariants(faults, dispatched, extra_known=ambiguous)
    assert summary.delivered == len(dispatched)
    assert all(w.alive() for w in workers), [w.log()[-2000:] for w in workers if not w.alive()]
    print(
        f"\nscenario 3 (dispatch): {sum(killed)} connections terminated; {len(returned)} dispatches "
        f"returned, {len(raised)} raised StoreError ({len(ambiguous) // FAN_OUT} of them committed "
        f"before the error); {summary.duplicates} duplicate(s)"
    )


def test_workers_survive_connections_dying_under_them_and_carry_on(faults: FaultEnv) -> None:
    faults.receiver.mode("slow", "slow", delay=0.05)
    faults.subscribe("sub_slow", faults.receiver.url("slow"), ["fault.pg"])
    workers = [faults.start_worker(concurrency=8) for _ in range(2)]
    wait_until(lambda: faults.worker_logs().count("startup sweep") == 2, 30, "the workers to start")
    ids = [faults.dispatch("fault.pg", {"serial": n})[0] for n in range(400)]
    with terminating_connections(faults, (0.1, 0.4)) as killed:
        time.sleep(4)
        with database_down(faults):  # an outage: no connection at all for 3 s
            time.sleep(3)
        time.sleep(2)
    stopped_at = time.monotonic()
    done_at = faults.wait_final(ids, timeout=60)
    assert all(w.alive() for w in workers), [w.log()[-2000:] for w in workers if not w.alive()]
    assert sum(killed) > 0
    assert "StoreError" in faults.worker_logs(), "the workers never noticed a terminated connection"

    # The same processes carry on once the database is quiet. (The pooled connections of this,
    # the "web", process were terminated too: start it on fresh ones.)
    faults.engine.dispose()
    more = [faults.dispatch("fault.pg", {"serial": n})[0] for n in range(400, 450)]
    faults.wait_final(more, timeout=20)
    summary = check_invariants(faults, ids + more)
    assert summary.delivered == len(ids) + len(more)
    assert all(w.alive() for w in workers)
    print(
        f"\nscenario 3 (delivery): {sum(killed)} connections terminated over 9 s, with a 3 s outage; "
        "all delivered "
        f"{done_at - stopped_at:.1f} s after the last termination; {summary.duplicates} duplicate(s)"
    )


def test_a_worker_started_while_the_database_is_down_waits_for_it(faults: FaultEnv) -> None:
    faults.subscribe("sub_ok", faults.receiver.url("ok"), ["fault.pg"])
    ids = [faults.dispatch("fault.pg", {"serial": n})[0] for n in range(20)]
    faults.engine.dispose()
    with database_down(faults):
        worker = faults.start_worker(concurrency=8)
        time.sleep(4)  # the worker starts and runs its start-up sweep meanwhile
    wait_until(lambda: not worker.alive() or "startup sweep" in worker.log(), 30, "the worker to start")
    time.sleep(1)
    assert worker.alive(), worker.log()[-2000:]
    faults.wait_final(ids, timeout=30)
    check_invariants(faults, ids)
