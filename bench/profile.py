"""Profile the pieces the scenarios found slow.

    python -m bench.profile dispatch --k 1      # dispatch() to K subscriptions (pyinstrument)
    python -m bench.profile attempt            # claim, send, record of one delivery, no RQ
    python -m bench.profile relay              # relay_outbox of committed messages (pyinstrument)
    python -m bench.profile worker --gil       # py-spy on a worker draining a filled queue
    python -m bench.profile worker --gil --processes 2 --subscriptions 100 --count 20000   # S12's setup
    python -m bench.profile workflow           # run() of started 3-step workflows in-process, no RQ
    python -m bench.profile workflow-worker    # py-spy on a worker draining started workflows
    python -m bench.profile start              # workflow starts as S9's harness makes them (pyinstrument)
    python -m bench.profile workflow-breakdown # S9's per-run breakdown at the default settings
    python -m bench.profile workflow-breakdown --workflow-concurrency 8 --gil   # CPU, 8 at once

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
from flask_harvest.config import Settings
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


#: S9's per-run phases, by the first frame of a sample's stack that names one (innermost wins).
_PHASES = (
    ("claim", ("claim_many (", "Leases.claim (", "claim (flask_harvest/workflows/_leases", "after_miss")),
    ("replay", ("list_steps (",)),
    ("checkpoint", ("checkpoint (",)),
    ("terminal transition", ("finish (flask_harvest/workflows", "_end (flask_harvest/workflows")),
    ("heartbeat", ("_heartbeat (",)),
    ("job overhead", ("rq/", "take_jobs (", "submit_many (", "execute_job (")),
)


def _run_phase(frames: list[str]) -> str | None:
    """The phase of one sample, or ``None`` for a sample that is no part of a run's time: a
    background thread (sweeper, command listener, a heartbeat asleep), a run thread waiting for
    work, the RQ thread waiting for a run handed over."""
    thread, body = frames[0], frames[1:]
    if not ("MainThread" in thread or "harvest-workflow" in thread):
        return None
    if "harvest-workflow" in thread and body and body[-1].startswith("_worker (concurrent/futures"):
        return None
    if "MainThread" in thread and any("submit_many (" in f for f in body) and "wait" in body[-1]:
        return None
    for frame in reversed(body):
        for name, marks in _PHASES:
            if any(mark in frame for mark in marks):
                return name
    return "other"


def _analyze(engine: sa.Engine) -> None:
    """Give the planner the started runs' statistics, as a database in service has them: a table
    emptied by TRUNCATE has none until autovacuum's next pass, and then the claim's plan walks every
    pending run (about 0.45 s a claim with 2,000 pending)."""
    with engine.begin() as conn:
        conn.execute(sa.text("ANALYZE harvest_workflow_executions"))


def profile_workflow_breakdown(count: int, seconds: int, gil: bool, concurrency: int | None) -> None:
    """S9's setup (runs started before the workers start) with one worker process at
    ``--workflow-concurrency`` (default: the library's default), py-spy on it for ``seconds``: the
    time per completed run in each phase. Without ``--gil``, wall time of every thread, idle
    included (at one run at a time the phases follow one another, so they add up to a run's
    time); with it, CPU (GIL-holding) time."""
    from bench._app import NOOP3

    ctx = _context()
    out = ctx.log_dir / "worker-stacks.txt"
    app = ctx.app()
    with app.app_context():
        service = get_engine(app).workflows
        assert service is not None
        for number in range(count):
            service.runner.start(NOOP3, {"n": number})
    _analyze(ctx.engine)
    config = {} if concurrency is None else {"HARVEST_WORKFLOW_CONCURRENCY": concurrency}
    if concurrency is None:
        # The bench app sets 32 for S8 to S10; the library's own default is what users get.
        config = {"HARVEST_WORKFLOW_CONCURRENCY": Settings().workflow_concurrency}

    def completed() -> int:
        with ctx.engine.connect() as conn:
            query = "SELECT count(*) FROM harvest_workflow_executions WHERE state = 'Completed'"
            return int(conn.execute(sa.text(query)).scalar() or 0)

    worker = _workers.harvest_worker(ctx.log_dir, _workers.DEFAULT_CONCURRENCY, config=config)
    try:
        _workers.wait_registered(1, workers=[worker])
        _workers.wait_for(lambda: completed() >= 20, timeout=60)
        before, cpu = completed(), worker.cpu_seconds()
        _py_spy(worker.pid, seconds, gil, out)
        runs, used = completed() - before, worker.cpu_seconds() - cpu
    finally:
        worker.stop()
    phases: Counter[str] = Counter()
    for line in out.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        phase = _run_phase(stack.split(";"))
        if phase is not None:
            phases[phase] += int(samples)
    rate_hz = 200
    per_run = {name: 1000 * samples / rate_hz / max(1, runs) for name, samples in phases.items()}
    print(
        f"workflow concurrency {config['HARVEST_WORKFLOW_CONCURRENCY']}: {runs} runs in {seconds} s "
        f"({runs / seconds:.1f}/s, {1000 * seconds / max(1, runs):.2f} ms per run), "
        f"worker CPU {1000 * used / max(1, runs):.2f} ms per run"
    )
    kind = "CPU (GIL held)" if gil else "wall, the RQ thread and the runs' threads, idle waits left out"
    print(f"ms per run by phase ({kind}):")
    for name, _ in _PHASES:
        print(f"  {name:22} {per_run.get(name, 0.0):8.2f}")
    print(f"  {'other':22} {per_run.get('other', 0.0):8.2f}")
    print(f"  {'total':22} {sum(per_run.values()):8.2f}")
    _summarise(out, gil)
    ctx.close_apps()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "what",
        choices=[
            "dispatch",
            "attempt",
            "relay",
            "worker",
            "workflow",
            "workflow-worker",
            "workflow-breakdown",
            "start",
        ],
    )
    parser.add_argument("--k", type=int, default=1, help="dispatch: matching subscriptions")
    parser.add_argument("--count", type=int, default=None, help="calls, deliveries or messages")
    parser.add_argument("--seconds", type=int, default=8, help="worker: seconds to sample")
    parser.add_argument("--gil", action="store_true", help="worker: sample only the thread holding the GIL")
    parser.add_argument("--subscriptions", type=int, default=1, help="worker: subscriptions to spread over")
    parser.add_argument(
        "--processes", type=int, default=1, help="worker: worker processes (the first is sampled)"
    )
    parser.add_argument(
        "--workflow-concurrency",
        type=int,
        default=None,
        help="workflow-breakdown: runs at once (default: the default)",
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
    elif args.what == "workflow-breakdown":
        profile_workflow_breakdown(args.count or 3000, args.seconds, args.gil, args.workflow_concurrency)
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
