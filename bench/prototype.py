"""An experiment, not package code: the worker design the findings propose, to measure it.

Instead of one RQ job per delivery claimed on RQ's thread, each process claims up to as many due
deliveries as it has free slots with **one** SQL statement (``UPDATE ... WHERE id IN (SELECT ...
FOR UPDATE SKIP LOCKED LIMIT n) RETURNING *``) and one SELECT of their subscriptions, and runs
them with the package's own ``DeliveryRunner.attempt`` (sign, POST, record, as today) on a thread
pool. No retries, no scheduler, no sweeper, no per-subscription cap: only the hot path.

    python -m bench.prototype --receiver ok --processes 1 --size 32 --count 3000    # compare with S2
    python -m bench.prototype --receiver slow --processes 2 --size 32 --count 1000  # compare with S3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa

from flask_harvest.webhooks.models import Claim, utcnow
from flask_harvest.webhooks.plugin import get_state
from flask_harvest.webhooks.stores._schema import row_to_delivery, row_to_subscription
from flask_harvest.webhooks.stores.sql import deliveries_table, subscriptions_table

from ._receivers import Receiver
from ._report import Context, rate
from ._scenario import delivery_states, dispatch_many, subscribe
from ._services import DATABASE_URL, ensure_database, reset_all, reset_redis
from ._workers import WorkerProcess, wait_for


def work(size: int, idle_exit: float) -> None:
    """The prototype worker: batch claims, attempts on a pool; exits after ``idle_exit`` s idle."""
    from ._app import create_app

    app = create_app()
    state = get_state(app)
    runner, engine = state.runner, state.store.engine  # type: ignore[attr-defined]
    free = threading.Semaphore(size)
    pool = ThreadPoolExecutor(size, thread_name_prefix="proto-attempt")
    table, subs = deliveries_table, subscriptions_table

    def attempt(claim: Claim) -> None:
        try:
            with app.app_context():
                runner.attempt(claim)
        finally:
            free.release()

    idle_since: float | None = None
    while True:
        free.acquire()
        slots = 1
        while slots < size and free.acquire(blocking=False):
            slots += 1
        now, token = utcnow(), uuid.uuid4().hex
        due = (
            sa.select(table.c.id)
            .where(table.c.state == "pending", table.c.next_attempt_at <= now)
            .order_by(table.c.next_attempt_at)
            .limit(slots)
            .with_for_update(skip_locked=True)
        )
        claim = (
            sa.update(table)
            .where(table.c.id.in_(due.scalar_subquery()))
            .values(state="inflight", lease_token=token, lease_expires_at=now + timedelta(seconds=60))
            .returning(*table.c)
        )
        with engine.begin() as conn:
            rows = conn.execute(claim).all()
            wanted = {row.subscription_id for row in rows}
            found = conn.execute(sa.select(subs).where(subs.c.id.in_(wanted))).all() if rows else []
        by_id = {row.id: row_to_subscription(row) for row in found}
        for _ in range(slots - len(rows)):
            free.release()
        if not rows:
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since > idle_exit:
                break
            time.sleep(0.01)
            continue
        idle_since = None
        for row in rows:
            pool.submit(attempt, Claim(row_to_delivery(row), by_id.get(row.subscription_id), token))
    pool.shutdown(wait=True)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(receiver_kind: str, processes: int, size: int, count: int) -> None:
    ensure_database()
    engine = sa.create_engine(DATABASE_URL)
    log_dir = Path(tempfile.mkdtemp(prefix="harvest-prototype-"))
    ctx = Context(quick=True, log_dir=log_dir, engine=engine, chart_dir=log_dir)
    path = "/ok/proto" if receiver_kind == "ok" else "/slow/100/proto"
    with Receiver() as receiver:
        reset_all(engine)
        app = ctx.app()
        subscribe(app, [receiver.url(path)])
        dispatch_many(app, count)
        ctx.close_apps()
        reset_redis()  # the RQ jobs dispatch queued are not used here
        command = [sys.executable, "-m", "bench.prototype", "--worker", "--size", str(size)]
        workers = [WorkerProcess(command, log_dir / f"proto-{n}.log") for n in range(processes)]
        try:
            receiver.wait_count(1, timeout=60)
            cpu = sum(_cpu_seconds(w.pid) for w in workers)
            if not receiver.wait_count(count, timeout=60 + count / 10, prefix=path):
                raise RuntimeError(f"{receiver.count(path)} of {count} delivered\n{workers[0].log_tail()}")
            cpu = sum(_cpu_seconds(w.pid) for w in workers) - cpu
            # Let the last outcomes be recorded before the workers stop.
            wait_for(lambda: delivery_states(engine).get("inflight", 0) == 0, timeout=10)
        finally:
            for worker in workers:
                worker.stop()
        per_s = rate([r.received_at for r in receiver.records()])
        peak = receiver.stats()["peak"]
    print(
        f"prototype, {processes} process(es) x {size} slots, {count:,} deliveries to /{receiver_kind}: "
        f"{per_s:.1f} deliveries/s, worker CPU {1000 * cpu / count:.2f} ms per delivery, "
        f"peak in flight {peak}, rows {dict(delivery_states(engine))}"
    )
    engine.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.prototype",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--receiver", choices=["ok", "slow"], default="ok")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--size", type=int, default=32, help="attempts in flight per process")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        work(args.size, idle_exit=3.0)
    else:
        measure(args.receiver, args.processes, args.size, args.count)


if __name__ == "__main__":
    main(sys.argv[1:])
