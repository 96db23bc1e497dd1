"""S8: completion-callback latency: a workflow's terminal commit -> the receiver has the callback,
at 20 workflows/s with 2 worker processes, beside what Temporal and DBOS users do today, measured in
the same run on the same workflows: a client polling the execution's result every second.

Both figures start from the same instant: ``sent_at``, read by the workflow as it returns (just
before the terminal transition commits, so both are slightly conservative). The callback figure
ends when the receiver (a process of its own) reads the POST; the polling figure ends when a poll
first sees the execution ended. Each execution's poller starts polling at its start and then every
second, as a client would.

Goal: callback p50 < 100 ms, and at least 5x sooner than polling at p50.
"""

from __future__ import annotations

import heapq
import sys
import threading
import time

from flask import Flask

from flask_harvest import get_engine

from . import _workers
from ._receivers import Receiver
from ._report import Context, Result, Row, median, percentile
from ._services import reset_all

ID = "S8"
TITLE = "completion-callback latency vs polling (20 workflows/s)"
PROCESSES = 2
CONCURRENCY = 32
RATE = 20.0
POLL_INTERVAL = 1.0


class Poller(threading.Thread):
    """Polls each started execution's result every second until it has ended (the baseline)."""

    def __init__(self, app: Flask) -> None:
        super().__init__(name="bench-poller", daemon=True)
        self.app = app
        self._heap: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self.seen: dict[str, float] = {}  # execution id -> poll that saw it ended - sent_at, in s
        self.polls = 0
        self._stop = False
        self.error: BaseException | None = None

    def add(self, execution_id: str, first_poll: float) -> None:
        with self._cond:
            heapq.heappush(self._heap, (first_poll, execution_id))
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()

    def run(self) -> None:
        try:
            with self.app.app_context():
                service = get_engine(self.app).workflows
                assert service is not None
                while True:
                    with self._cond:
                        while not self._stop and (not self._heap or self._heap[0][0] > time.time()):
                            timeout = self._heap[0][0] - time.time() if self._heap else None
                            self._cond.wait(timeout)
                        if self._stop:
                            return
                        due, execution_id = heapq.heappop(self._heap)
                    execution = service.get(execution_id)  # what GET .../result reads
                    seen_at = time.time()
                    self.polls += 1
                    if execution.terminal and isinstance(execution.output, dict):
                        self.seen[execution_id] = seen_at - float(execution.output["sent_at"])
                    else:
                        self.add(execution_id, due + POLL_INTERVAL)
        except BaseException as exc:  # reported by the scenario
            self.error = exc


def run(ctx: Context) -> Result:
    from ._app import create_workflow_app

    count = ctx.pick(600, 100)
    result = Result()
    reset_all(ctx.engine)
    with Receiver() as receiver:
        app = create_workflow_app()
        ctx.apps.append(app)
        service = get_engine(app).workflows
        assert service is not None
        command = [
            sys.executable,
            "-m",
            "flask",
            "--app",
            "bench._app:create_workflow_app",
            "harvest",
            "worker",
        ]
        workers = [
            _workers.WorkerProcess(
                [*command, "--concurrency", str(CONCURRENCY)],
                ctx.log_dir / f"worker-s8-{n}-{time.monotonic_ns()}.log",
            )
            for n in range(PROCESSES)
        ]
        poller = Poller(app)
        try:
            _workers.wait_registered(PROCESSES, workers=workers)
            poller.start()
            target = [{"url": receiver.url("/ok/s8"), "filter": {"type": "AnyTerminal"}}]
            behind = 0.0
            start = time.monotonic()
            with app.app_context():
                for number in range(count):
                    wait = start + number / RATE - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    else:
                        behind = max(behind, -wait)
                    handle, _ = service.start("bench_callback", number, completion_callbacks=target)
                    poller.add(handle.execution_id, time.time())
            finished = receiver.wait_count(count, timeout=60, prefix="/ok/s8")
            _workers.wait_for(lambda: len(poller.seen) >= count, timeout=30)
        finally:
            poller.stop()
            _workers.stop_all(workers)
        records = receiver.records()
    if poller.error is not None:
        raise poller.error
    callback = [r.latency * 1000 for r in records if r.latency is not None]
    polling = [seconds * 1000 for seconds in poller.seen.values()]
    p50, p99 = median(callback), percentile(callback, 99)
    poll_p50, poll_p99 = median(polling), percentile(polling, 99)
    ratio = poll_p50 / p50 if p50 > 0 else None
    result.rows += [
        Row(
            ID,
            f"callback p50 latency ({count:,} workflows at {RATE:g}/s)",
            p50,
            "ms",
            "< 100 ms, >= 5x sooner than polling",
            p50 < 100 and ratio is not None and ratio >= 5 and finished,
            baseline=poll_p50,
            baseline_label="polling every 1 s, p50",
            ratio=ratio,
        ),
        Row(
            ID, "callback p99 latency", p99, "ms", "-", None, baseline=poll_p99, baseline_label="polling p99"
        ),
    ]
    result.details = {
        "workflows": count,
        "callbacks_received": len(records),
        "finished": finished,
        "starter_behind_s": behind,
        "polls": poller.polls,
        "callback_ms": {
            "p50": p50,
            "p90": percentile(callback, 90),
            "p99": p99,
            "max": max(callback, default=None),
        },
        "polling_ms": {
            "p50": poll_p50,
            "p90": percentile(polling, 90),
            "p99": poll_p99,
            "max": max(polling, default=None),
        },
        "ratio_p50": ratio,
    }
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
