"""S2: deliveries per second of one worker process, as documented (``flask harvest worker
--concurrency 32``), to a receiver that answers 200 at once.

Baseline: the same worker class (:class:`HarvestWorker`) running a bare RQ job that POSTs the same
body with ``requests`` (no store, no signing). Ceiling: a plain ``requests.Session`` POST loop.
Goal: at least 0.75x the baseline's deliveries/s.
"""

from __future__ import annotations

import sys
import time

import requests
from rq import Queue

from flask_harvest.webhooks.payload import encode_payload

from . import _workers
from ._receivers import Receiver
from ._report import Context, Result, Row, rate
from ._scenario import delivery_states, dispatch_many, payload, subscribe
from ._services import redis_client, reset_all

ID = "S2"
TITLE = "throughput of one worker process, instant receiver"
BARE_QUEUE = "bench-bare"


def ceiling(receiver: Receiver, count: int, body: bytes) -> float:
    """A plain requests.Session loop: the most one Python process gets from this receiver."""
    session = requests.Session()
    session.trust_env = False
    url = receiver.url("/ok/ceiling")
    started = time.perf_counter()
    for _ in range(count):
        session.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=10).close()
    elapsed = time.perf_counter() - started
    session.close()
    return count / elapsed


def bare_baseline(
    ctx: Context, receiver: Receiver, count: int, body: bytes, path: str
) -> tuple[float, float]:
    """Run the bare-job worker over ``count`` POSTs; return deliveries/s and CPU ms per delivery."""
    client = redis_client()
    queue = Queue(BARE_QUEUE, connection=client)
    url = receiver.url(path)
    jobs = [Queue.prepare_data("bench._jobs.bare_post", args=(url, body), result_ttl=0) for _ in range(count)]
    for start in range(0, count, 1000):
        with client.pipeline() as pipe:
            queue.enqueue_many(jobs[start : start + 1000], pipeline=pipe)
            pipe.execute()
    client.close()
    worker = _workers.bare_worker(ctx.log_dir, BARE_QUEUE)
    try:
        cpu_ms = _cpu_ms_per_delivery(worker, receiver, count, path, "the bare worker")
    finally:
        worker.stop()
    return rate([r.received_at for r in receiver.records() if r.path == path]), cpu_ms


def _cpu_ms_per_delivery(
    worker: _workers.WorkerProcess, receiver: Receiver, count: int, path: str, who: str
) -> float:
    """Wait for all ``count`` deliveries; return the worker's CPU per delivery from the first on
    (its start-up excluded)."""
    if not receiver.wait_count(1, timeout=60, prefix=path):
        raise RuntimeError(f"{who} sent nothing\n{worker.log_tail()}")
    cpu, first = worker.cpu_seconds(), receiver.count(path)
    if not receiver.wait_count(count, timeout=60 + count / 20, prefix=path):
        raise RuntimeError(f"{who} sent {receiver.count(path)} of {count}\n{worker.log_tail()}")
    return 1000 * (worker.cpu_seconds() - cpu) / max(1, count - first)


def harvest_run(ctx: Context, receiver: Receiver, count: int, path: str) -> tuple[float, dict[str, object]]:
    reset_all(ctx.engine)
    app = ctx.app()
    subscribe(app, [receiver.url(path)])
    prep = dispatch_many(app, count)
    worker = _workers.harvest_worker(ctx.log_dir, 32)
    try:
        cpu_ms = _cpu_ms_per_delivery(worker, receiver, count, path, "the worker")
        rss = worker.rss_bytes()
    finally:
        worker.stop()
    records = [r for r in receiver.records() if r.path == path]
    states = delivery_states(ctx.engine)
    return rate([r.received_at for r in records]), {
        "dispatch_seconds": prep,
        "received": len(records),
        "distinct_ids": len({r.webhook_id for r in records}),
        "states": dict(states),
        "worker_rss_mib": (rss or 0) / 2**20,
        "worker_cpu_ms_per_delivery": cpu_ms,
    }


def run(ctx: Context) -> Result:
    count = ctx.pick(5000, 500)
    rounds = ctx.pick(2, 1)
    body = encode_payload(payload(0)).encode()
    result = Result()
    with Receiver() as receiver:
        reset_all(ctx.engine)
        top = ceiling(receiver, count, body)
        bare: list[float] = []
        bare_cpu: list[float] = []
        ours: list[float] = []
        runs: list[dict[str, object]] = []
        for number in range(rounds):
            bare_rate, bare_cpu_ms = bare_baseline(ctx, receiver, count, body, f"/ok/bare{number}")
            bare.append(bare_rate)
            bare_cpu.append(bare_cpu_ms)
            value, details = harvest_run(ctx, receiver, count, f"/ok/harvest{number}")
            ours.append(value)
            runs.append(details)
            ctx.close_apps()
    best, best_bare = max(ours), max(bare)
    delivered = all(d["states"] == {"delivered": count} for d in runs)
    ratio = best / best_bare
    result.rows.append(
        Row(
            ID,
            f"deliveries/s, 1 process, --concurrency 32 ({count:,})",
            best,
            "/s",
            ">= 0.75x baseline",
            ratio >= 0.75 and delivered,
            baseline=best_bare,
            baseline_label="bare RQ job",
            ratio=ratio,
            note="" if delivered else "not every delivery ended DELIVERED",
        )
    )
    result.rows.append(
        Row(
            ID,
            "fraction of a plain Session loop (ceiling)",
            best / top,
            "",
            "report",
            None,
            baseline=top,
            baseline_label="Session loop /s",
        )
    )
    ours_cpu = min(float(d["worker_cpu_ms_per_delivery"]) for d in runs)  # type: ignore[arg-type]
    result.rows.append(
        Row(
            ID,
            "worker CPU per delivery (best run)",
            ours_cpu,
            "ms",
            "report",
            None,
            baseline=min(bare_cpu),
            baseline_label="bare RQ job",
            ratio=ours_cpu / min(bare_cpu),
        )
    )
    result.details = {
        "count": count,
        "bare_cpu_ms_per_delivery": bare_cpu,
        "ceiling_per_s": top,
        "bare_per_s": bare,
        "harvest_per_s": ours,
        "harvest_runs": runs,
        "best_of": rounds,
    }
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
