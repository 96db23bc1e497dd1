"""S14: a realistic mix (issue 18, item 5). 1,000 subscriptions whose endpoints answer after a
long-tailed latency: most in 20 to 100 ms, 5% in 1 to 2 s, 1% never (their attempts time out after
the default 10 s). Events are dispatched at a steady rate, each to the 10 subscriptions of its
topic (100 topics), in the documented production setup (2 processes x the default ``--concurrency``, 64,
default settings).

Baseline: the same run with every endpoint healthy (the slow and the silent ones answer in 20 to
100 ms like the others). Reported, no goal: throughput, the healthy endpoints' p50/p99 dispatch ->
answered latency (the same 940 endpoints in both runs), worker CPU per delivery, and the
receiver's CPU (it serves all 1,000 endpoints from one process, and must not be the bottleneck).
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flask_harvest.config import Settings
from flask_harvest.webhooks.payload import encode_payload

from . import _workers
from ._receivers import Receiver, Record
from ._report import Context, Result, Row, median, percentile, rate
from ._scenario import SteadyDispatcher, delivery_states, payload, subscribe
from ._services import reset_all
from .s2_throughput import ceiling

ID = "S14"
TITLE = "realistic mix: 1,000 endpoints, 5% answer in 1-2 s, 1% never"
PROCESSES = 2
CONCURRENCY = _workers.DEFAULT_CONCURRENCY
SUBSCRIPTIONS = 1000
#: Subscriptions per topic: each event is one delivery to each of them.
FAN_OUT = 10
TOPICS = [f"mix.t{n}" for n in range(SUBSCRIPTIONS // FAN_OUT)]
SLOW_SHARE = 0.05
DEAD_SHARE = 0.01
#: Deliveries per second offered: about half of what S12 measured on this machine with an instant
#: receiver, so the all-healthy run keeps up and the comparison shows what the tail costs.
RATE = 200.0
#: How long to wait, after the last dispatch, for every delivery to an endpoint that answers.
DRAIN_SECONDS = 120.0


@dataclass(frozen=True)
class Endpoint:
    """One subscription's receiver: ``fast_ms`` when healthy; in the mix, ``slow_ms`` or silent."""

    number: int
    fast_ms: int
    slow_ms: int | None = None
    dead: bool = False

    @property
    def healthy(self) -> bool:
        return self.slow_ms is None and not self.dead

    def path(self, tag: str, mixed: bool) -> str:
        if mixed and self.dead:
            return f"/never/{tag}/{self.number}"
        ms = self.slow_ms if mixed and self.slow_ms is not None else self.fast_ms
        return f"/slow/{ms}/{tag}/{self.number}"


def endpoints(count: int = SUBSCRIPTIONS, seed: int = 14) -> list[Endpoint]:
    """``count`` endpoints, the same for every run: latencies log-uniform in 20-100 ms (most),
    uniform in 1-2 s (5%), and 1% that never answer, the slow and silent ones spread at random."""
    rng = random.Random(seed)  # noqa: S311 (a reproducible draw, not a secret)
    dead = round(count * DEAD_SHARE)
    slow = round(count * SLOW_SHARE)
    kinds = ["dead"] * dead + ["slow"] * slow + ["fast"] * (count - dead - slow)
    rng.shuffle(kinds)
    out = []
    for number, kind in enumerate(kinds):
        fast_ms = round(20 * 5 ** rng.random())  # 20 to 100 ms, most near the low end
        slow_ms = rng.randint(1000, 2000) if kind == "slow" else None
        out.append(Endpoint(number, fast_ms, slow_ms, dead=kind == "dead"))
    return out


def answering(points: Sequence[Endpoint], events: int, mixed: bool) -> int:
    """How many of ``events`` deliveries (event ``n`` to topic ``n`` mod the topics) get an answer."""
    per_topic = Counter(p.number % len(TOPICS) for p in points if not (mixed and p.dead))
    return sum(per_topic[n % len(TOPICS)] for n in range(events))


def timeline(
    records: Sequence[Record], healthy: set[str], timeout: float, step: float = 5.0
) -> list[dict[str, Any]]:
    """Per ``step`` seconds of dispatch time: the healthy endpoints' p50/p99, and how many attempts
    were in flight at the receiver at the window's start, to healthy, slow and silent endpoints
    (a silent one's attempt is held until the worker's timeout)."""
    sent = [r.sent_at for r in records if r.sent_at is not None]
    if not sent:
        return []
    start, end = min(sent), max(sent)
    spans = {
        kind: [
            (r.received_at, r.answered_at if r.answered_at is not None else r.received_at + timeout)
            for r in records
            if (r.status == 0) == (kind == "silent") and (r.path in healthy) == (kind == "healthy")
        ]
        for kind in ("healthy", "slow", "silent")
    }
    out = []
    at = start
    while at <= end:
        window = [
            (r.answered_at - r.sent_at) * 1000
            for r in records
            if r.path in healthy
            and r.sent_at is not None
            and r.answered_at is not None
            and at <= r.sent_at < at + step
        ]
        point: dict[str, Any] = {
            "t": round(at - start, 1),
            "p50_ms": median(window),
            "p99_ms": percentile(window, 99),
        }
        for kind, pairs in spans.items():
            point[f"{kind}_in_flight"] = sum(1 for a, b in pairs if a <= at < b)
        out.append(point)
        at += step
    return out


def one_run(ctx: Context, receiver: Receiver, events: int, *, mixed: bool) -> dict[str, Any]:
    reset_all(ctx.engine)
    receiver.reset()
    tag = "mix" if mixed else "healthy"
    points = endpoints()
    app = ctx.app()
    subscribe(app, [receiver.url(p.path(tag, mixed)) for p in points], topic=TOPICS)
    expected = answering(points, events, mixed)
    workers = [
        _workers.harvest_worker(ctx.log_dir, CONCURRENCY, tag=f"s14-{tag}-{n}") for n in range(PROCESSES)
    ]
    try:
        _workers.wait_registered(PROCESSES, workers=workers)
        cpu = sum(w.cpu_seconds() for w in workers)
        receiver_cpu, started = receiver.cpu_seconds(), time.monotonic()
        dispatcher = SteadyDispatcher(app, events, RATE / FAN_OUT, topic=TOPICS)
        dispatcher.start()
        dispatcher.join(timeout=events * FAN_OUT / RATE + 120)
        if dispatcher.error is not None:
            raise dispatcher.error
        dispatched = time.monotonic()
        finished = receiver.wait_count(expected, timeout=DRAIN_SECONDS)
        drained = time.monotonic()
        cpu = sum(w.cpu_seconds() for w in workers) - cpu
        receiver_cpu = receiver.cpu_seconds() - receiver_cpu
    finally:
        _workers.stop_all(workers, grace=2)
    records = receiver.records()
    answered = [r for r in records if r.status == 200]
    healthy = {p.path(tag, mixed) for p in points if p.healthy}
    latencies = [
        (r.answered_at - r.sent_at) * 1000
        for r in answered
        if r.path in healthy and r.answered_at is not None and r.sent_at is not None
    ]
    wall = drained - started
    return {
        "events": events,
        "deliveries": events * FAN_OUT,
        "expected_answers": expected,
        "answered": len(answered),
        "finished": finished,
        "per_s": rate([r.answered_at for r in answered if r.answered_at is not None]),
        "dispatch_seconds": dispatched - started,
        "drain_seconds": drained - dispatched,
        "dispatcher_behind_s": dispatcher.behind,
        "healthy_latency_ms": {
            "p50": median(latencies),
            "p90": percentile(latencies, 90),
            "p99": percentile(latencies, 99),
            "max": max(latencies, default=None),
            "n": len(latencies),
        },
        "worker_cpu_ms_per_delivery": 1000 * cpu / max(1, len(answered)),
        "receiver_cpu_share": receiver_cpu / wall,
        "receiver_cpu_us_per_request": 1e6 * receiver_cpu / max(1, len(records)),
        "receiver_peak_in_flight": receiver.stats()["peak"],
        "timeline": timeline(records, healthy, Settings().webhooks_timeout_seconds),
        "silent_attempts": sum(1 for r in records if r.status == 0),
        "states": dict(delivery_states(ctx.engine)),
        "jobs_per_delivery": sum(w.jobs_done() for w in workers) / (events * FAN_OUT),
    }


def run(ctx: Context) -> Result:
    events = ctx.pick(5_000, 500)  # x 10 deliveries
    result = Result()
    with Receiver() as receiver:
        top = ceiling(receiver, ctx.pick(5_000, 2_000), encode_payload(payload(0)).encode())
        base = one_run(ctx, receiver, events, mixed=False)
        ctx.close_apps()
        mix = one_run(ctx, receiver, events, mixed=True)
        ctx.close_apps()
    size = f"{events * FAN_OUT:,} deliveries at {RATE:g}/s"
    done = "" if mix["finished"] and base["finished"] else "; not every answering delivery arrived in time"
    result.rows += [
        Row(
            ID,
            f"deliveries/s, mix ({size})",
            mix["per_s"],
            "/s",
            "report",
            None,
            baseline=base["per_s"],
            baseline_label="all healthy",
            ratio=mix["per_s"] / base["per_s"],
            ceiling=top,
            note=f"drain after the last dispatch {mix['drain_seconds']:.1f} vs {base['drain_seconds']:.1f} s"
            + done,
        ),
        Row(
            ID,
            "healthy endpoints' p99, dispatch -> answered",
            mix["healthy_latency_ms"]["p99"],
            "ms",
            "report",
            None,
            baseline=base["healthy_latency_ms"]["p99"],
            baseline_label="all healthy",
            ratio=mix["healthy_latency_ms"]["p99"] / base["healthy_latency_ms"]["p99"],
            note=f"p50 {mix['healthy_latency_ms']['p50']:.0f} vs {base['healthy_latency_ms']['p50']:.0f} ms",
        ),
        Row(
            ID,
            "worker CPU per delivery (both processes)",
            mix["worker_cpu_ms_per_delivery"],
            "ms",
            "report",
            None,
            baseline=base["worker_cpu_ms_per_delivery"],
            baseline_label="all healthy",
            ratio=mix["worker_cpu_ms_per_delivery"] / base["worker_cpu_ms_per_delivery"],
            note=f"{mix['silent_attempts']} attempts to silent endpoints timed out or were cut",
        ),
        Row(
            ID,
            "receiver CPU (one process, 1,000 endpoints)",
            100 * max(mix["receiver_cpu_share"], base["receiver_cpu_share"]),
            "% of a core",
            "not the bottleneck (< 50%)",
            max(mix["receiver_cpu_share"], base["receiver_cpu_share"]) < 0.5,
            note=f"{mix['receiver_cpu_us_per_request']:.0f} us per request",
        ),
    ]
    result.details = {"ceiling_per_s": top, "healthy": base, "mix": mix}
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
