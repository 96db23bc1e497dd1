"""Profile the pieces the scenarios found slow.

    python -m bench.profile dispatch --k 1      # dispatch() to K subscriptions (pyinstrument)
    python -m bench.profile attempt            # claim, send, record of one delivery, no RQ
    python -m bench.profile relay              # relay_outbox of committed messages (pyinstrument)
    python -m bench.profile worker --gil       # py-spy on a worker draining a filled queue
    python -m bench.profile worker --gil --processes 2 --subscriptions 100 --count 20000   # S12's setup
    python -m bench.profile workflow           # run() of started 3-step workflows in-process, no RQ
    python -m bench.profile workflow-worker    # py-spy on a worker draining started workflows
    python -m bench.profile start              # workflow starts as S9's harness makes them (pyinstrument)

Each prints its figures and a profile; ``worker`` writes py-spy's raw stacks and sums them up.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from flask_harvest import get_engine, workflow_service
from flask_harvest.webhooks import outcome
from flask_harvest.webhooks.models import utcnow

from . import _workers
from ._receivers import Receiver
from ._report import Context, rate
from ._scenario import dispatch_many, payload, subscribe
from ._services import DATABASE_URL, ensure_database, reset_all


def _context() -> Context:
    ensure_database()
    engine = sa.create_engine(DATABASE_URL)
    reset_all(engine)
    return Context(
        quick=True,
        log_dir=Path(tempfile.mkdtemp(prefix="harvest-profile-")),
        engine=engine,
        chart_dir=Path(tempfile.gettempdir()),
    )


def _pyinstrument(label: str, work: Any) -> None:
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0005)
    profiler.start()
    work()
    profiler.stop()
    print(f"--- {label}")
    print(profiler.output_text(unicode=False, color=False))


def profile_dispatch(k: int, calls: int) -> None:
    ctx = _context()
    app = ctx.app()
    subscribe(app, [f"http://127.0.0.1:9/{n}" for n in range(k)], topic="bench.k")
    event = {"order_id": "ord_1", "total": 4200}
    with app.app_context():
        manager = get_engine(app).manager
        for _ in range(20):
            manager.dispatch("bench.k", event)
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            manager.dispatch("bench.k", event)
        wall, used = time.perf_counter() - started, time.process_time() - cpu
        print(f"dispatch K={k}: {1000 * wall / calls:.3f} ms wall, {1000 * used / calls:.3f} ms CPU per call")
        _pyinstrument(f"dispatch K={k}", lambda: [manager.dispatch("bench.k", event) for _ in range(calls)])
    ctx.close_apps()


def profile_attempt(count: int) -> None:
    ctx = _context()
    with Receiver() as receiver:
        app = ctx.app()
        subscribe(app, [receiver.url("/ok/profile")])
        with app.app_context():
            state = get_engine(app)
            runner = state.runner
            ids = [state.manager.dispatch("bench.event", payload(n))[0] for n in range(count + 20)]
            for delivery_id in ids[:20]:
                runner.run(delivery_id)
            spent = {"claim": [0.0, 0.0], "send": [0.0, 0.0], "record": [0.0, 0.0]}

            def timed(name: str, work: Any, *args: Any) -> Any:
                cpu, wall = time.thread_time(), time.perf_counter()
                value = work(*args)
                spent[name][0] += time.thread_time() - cpu
                spent[name][1] += time.perf_counter() - wall
                return value

            def send(claim: Any) -> Any:
                return outcome.before_sending(claim, runner.settings, utcnow()) or runner._send(claim)

            for delivery_id in ids[20:]:
                claim = timed("claim", runner.claim, delivery_id)
                result = timed("send", send, claim)
                timed("record", runner._record, claim, result)
        for name, (cpu, wall) in spent.items():
            print(f"{name}: {1000 * cpu / count:.2f} ms CPU, {1000 * wall / count:.2f} ms wall per delivery")
    ctx.close_apps()


def profile_relay(count: int) -> None:
    ctx = _context()
    app = ctx.app()
    subscribe(app, ["http://127.0.0.1:9/relay"], topic="order.created")
    manager = get_engine(app).manager
    with ctx.engine.begin() as conn:
        for number in range(count):
            manager.dispatch_in_tx(conn, "order.created", payload(number))

    def relay() -> None:
        started = time.perf_counter()
        while manager.relay_outbox(limit=500).relayed:
            pass
        print(f"relay: {count / (time.perf_counter() - started):.0f} messages/s (with the profiler on)")

    _pyinstrument("relay_outbox", relay)
    ctx.close_apps()


def profile_worker(
    count: int, seconds: int, gil: bool, *, subscriptions: int = 1, processes: int = 1
) -> None:
    """py-spy on the first of ``processes`` workers draining ``count`` deliveries to
    ``subscriptions`` subscriptions (S12's setup: ``--subscriptions 100 --processes 2``)."""
    ctx = _context()
    out = ctx.log_dir / "worker-stacks.txt"
    with Receiver() as receiver:
        app = ctx.app()
        subscribe(app, [receiver.url(f"/ok/profile/{n}") for n in range(subscriptions)])
        dispatch_many(app, count // subscriptions)
        workers = [_workers.harvest_worker(ctx.log_dir, 32, tag=f"p{n}") for n in range(processes)]
        try:
            receiver.wait_count(1, timeout=60)
            cpu = [w.cpu_seconds() for w in workers]
            received = receiver.count()
            _py_spy(workers[0].pid, seconds, gil, out)
            sent = receiver.count() - received
            used = sum(w.cpu_seconds() for w in workers) - sum(cpu)
            print(f"workers: {1000 * used / max(1, sent):.2f} ms CPU per delivery while sampled")
        finally:
            _workers.stop_all(workers)
        print(f"worker: {rate([r.received_at for r in receiver.records()]):.1f} deliveries/s while sampled")
    _summarise(out, gil)
    ctx.close_apps()


def _py_spy(pid: int, seconds: int, gil: bool, out: Path) -> None:
    command = [
        shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"),
        "record",
        "-p",
        str(pid),
        "-d",
        str(seconds),
        "-r",
        "200",
        "-f",
        "raw",
        "-o",
        str(out),
        "--threads",
        "--gil" if gil else "--idle",
    ]
    subprocess.run(command, check=True, capture_output=True)  # noqa: S603 (our own command)


def _summarise(out: Path, gil: bool) -> None:
    inclusive: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in out.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        frames = stack.split(";")
        total += int(number)
        threads[frames[0]] += int(number)
        for frame in set(frames[1:]):
            inclusive[frame] += int(number)
    print(f"{total} samples ({'GIL holder only' if gil else 'all threads, idle included'}); by thread:")
    for thread, samples in threads.most_common(8):
        print(f"  {100 * samples / total:5.1f}% {thread}")
    print("inclusive time by frame:")
    for frame, samples in inclusive.most_common(int(os.environ.get("PROFILE_FRAMES", "40"))):
        print(f"  {100 * samples / total:5.1f}% {frame[:140]}")


def profile_workflow(count: int) -> None:
    """The engine's own cost per run of the 3-step workflow: claim, steps, finish (no RQ)."""
    from bench._app import NOOP3

    ctx = _context()
    app = ctx.app()
    with app.app_context():
        service = get_engine(app).workflows
        assert service is not None
        runner = service.runner
        ids = [runner.start(NOOP3, {"n": n})[0].execution_id for n in range(count + 20)]
        for execution_id in ids[:20]:
            runner.run(execution_id)
        started, cpu = time.perf_counter(), time.process_time()
        for execution_id in ids[20 : 20 + count // 2]:
            runner.run(execution_id)
        wall, used = time.perf_counter() - started, time.process_time() - cpu
        print(f"run: {2000 * wall / count:.2f} ms wall, {2000 * used / count:.2f} ms CPU per workflow")
        _pyinstrument("WorkflowRunner.run", lambda: [runner.run(i) for i in ids[20 + count // 2 :]])
    ctx.close_apps()


def profile_start(count: int) -> None:
    """One workflow start after another, as S9's harness makes them: the app context, the INSERT
    and the RQ enqueue (no worker runs)."""
    from bench._app import NOOP3
    from bench._workflow_runs import harvest_starter

    ctx = _context()
    start = harvest_starter(ctx.app())
    for number in range(20):  # compiled statements, pooled connections
        start(number)
    started, cpu = time.perf_counter(), time.process_time()
    for number in range(count):
        start(number)
    wall, used = time.perf_counter() - started, time.process_time() - cpu
    print(f"start: {1000 * wall / count:.2f} ms wall, {1000 * used / count:.2f} ms CPU per call")
    app = ctx.apps[-1]
    with app.app_context():
        service = workflow_service(app)
        started, cpu = time.perf_counter(), time.process_time()
        for first in range(0, count, 100):
            service.start_many(NOOP3, [{"n": n} for n in range(first, min(first + 100, count))])
        wall, used = time.perf_counter() - started, time.process_time() - cpu
    print(
        f"start_many, 100 a call: {1000 * wall / count:.2f} ms wall, {1000 * used / count:.2f} ms CPU per run"
    )
    _pyinstrument("workflow start", lambda: [start(number) for number in range(count)])
    ctx.close_apps()


def profile_workflow_worker(count: int, seconds: int, gil: bool) -> None:
    """py-spy on one worker process draining ``count`` started workflows."""
    from bench._app import NOOP3

    ctx = _context()
    out = ctx.log_dir / "worker-stacks.txt"
    app = ctx.app()
    with app.app_context():
        service = get_engine(app).workflows
        assert service is not None
        for number in range(count):
            service.runner.start(NOOP3, {"n": number})
    worker = _workers.harvest_worker(ctx.log_dir, 32)
    try:
        _workers.wait_registered(1, workers=[worker])
        _py_spy(worker.pid, seconds, gil, out)
    finally:
        worker.stop()
    with ctx.engine.connect() as conn:
        done = conn.execute(
            sa.text("SELECT count(*) FROM harvest_workflow_executions WHERE state = 'Completed'")
        )
        print(f"worker: {done.scalar()} of {count} workflows completed")
    _summarise(out, gil)
    ctx.close_apps()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "what", choices=["dispatch", "attempt", "relay", "worker", "workflow", "workflow-worker", "start"]
    )
    parser.add_argument("--k", type=int, default=1, help="dispatch: matching subscriptions")
    parser.add_argument("--count", type=int, default=None, help="calls, deliveries or messages")
    parser.add_argument("--seconds", type=int, default=8, help="worker: seconds to sample")
    parser.add_argument("--gil", action="store_true", help="worker: sample only the thread holding the GIL")
    parser.add_argument("--subscriptions", type=int, default=1, help="worker: subscriptions to spread over")
    parser.add_argument(
        "--processes", type=int, default=1, help="worker: worker processes (the first is sampled)"
    )
    args = parser.parse_args(argv)
    if args.what == "dispatch":
        profile_dispatch(args.k, args.count or max(20, 2000 // args.k))
    elif args.what == "attempt":
        profile_attempt(args.count or 500)
    elif args.what == "relay":
        profile_relay(args.count or 5000)
    elif args.what == "workflow":
        profile_workflow(args.count or 400)
    elif args.what == "start":
        profile_start(args.count or 1000)
    elif args.what == "workflow-worker":
        profile_workflow_worker(args.count or 3000, args.seconds, args.gil)
    else:
        profile_worker(
            args.count or 3000,
            args.seconds,
            args.gil,
            subscriptions=args.subscriptions,
            processes=args.processes,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
