"""S3: deliveries per second to a receiver that takes 100 ms per request, with the documented
production setup on this 2-core machine: 2 worker processes, the default ``--concurrency`` (64)
each, default settings (the adaptive per-subscription limit, ceiling 32 per process).

The figure is a sustained rate, so the full run sends 5,000 deliveries (about 8 s): with 1,000
(about 2 s) the endpoint's slow start from 4 in flight and the last round trip's stragglers were a
fifth of the run.

Baseline: one delivery at a time (one process, ``--concurrency 1``), about 10/s.
Goal: at least 500 deliveries/s (issue 18; 20x the baseline) with bounded memory. The chart
sweeps ``--concurrency`` (ceiling raised to match, so it does not bind) against deliveries in
flight.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

from flask_harvest.config import Settings
from flask_harvest.webhooks.payload import encode_payload

from . import _workers
from ._receivers import Receiver, Record
from ._report import NO_CHART, Context, Result, Row, optional_chart, rate
from ._scenario import delivery_states, dispatch_many, payload, subscribe
from ._services import reset_all
from .s2_throughput import ceiling

ID = "S3"
TITLE = "slow receiver (100 ms), documented production setup"
PROCESSES = 2
CONCURRENCY = _workers.DEFAULT_CONCURRENCY
#: The documented default ceiling of the adaptive per-subscription limit.
CAP = Settings().webhooks_max_inflight_per_subscription
#: Issue 18's goal at the default settings.
GOAL = 500
SLOW = "/slow/100"


def in_flight(records: list[Record]) -> float:
    """Mean requests in flight at the receiver over the run (total time held / time span)."""
    spans = [(r.received_at, r.answered_at) for r in records if r.answered_at is not None]
    if not spans:
        return 0.0
    span = max(end for _, end in spans) - min(start for start, _ in spans)
    held = sum(end - start for start, end in spans)
    return held / span if span > 0 else 0.0


def measure(
    ctx: Context,
    receiver: Receiver,
    count: int,
    *,
    processes: int,
    concurrency: int,
    config: dict[str, Any] | None = None,
    subscriptions: int = 1,
    tag: str,
) -> dict[str, Any]:
    """Dispatch ``count`` deliveries, start the workers, and time them from first to last receipt."""
    reset_all(ctx.engine)
    receiver.reset()
    app = ctx.app()
    paths = [f"{SLOW}/{tag}/{n}" for n in range(subscriptions)]
    subscribe(app, [receiver.url(p) for p in paths])
    dispatch_many(app, count // subscriptions)
    prefix = f"{SLOW}/{tag}/"
    workers = [
        _workers.harvest_worker(ctx.log_dir, concurrency, config=config, tag=f"{tag}-{n}")
        for n in range(processes)
    ]
    samples: list[tuple[float, int, list[int | None]]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            samples.append((time.time(), receiver.count(prefix), [w.rss_bytes() for w in workers]))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        if not receiver.wait_count(count, timeout=120 + count / 5, prefix=prefix):
            got = receiver.count(prefix)
            raise RuntimeError(f"{tag}: {got} of {count} delivered\n{workers[0].log_tail()}")
    finally:
        done.set()
        sampler.join()
        _workers.stop_all(workers)
    records = [r for r in receiver.records() if r.path.startswith(prefix)]
    jobs = sum(w.jobs_done() for w in workers)
    rss = [[x for x in s[2] if x] for s in samples]
    first = next((r for (_, n, _), r in zip(samples, rss, strict=True) if n >= count // 10 and r), None)
    peak = [max(r[i] for r in rss if len(r) > i) for i in range(processes)] if rss and rss[-1] else []
    return {
        "count": count,
        "processes": processes,
        "concurrency": concurrency,
        "config": config or {},
        "subscriptions": subscriptions,
        "per_s": rate([r.received_at for r in records]),
        # More than one job per delivery: deliveries given back for the per-subscription cap.
        "jobs_per_delivery": jobs / count,
        "mean_in_flight": in_flight(records),
        "peak_in_flight": receiver.stats()["peak"],
        "states": dict(delivery_states(ctx.engine)),
        "rss_mib_after_10pct": [x / 2**20 for x in first] if first else None,
        "rss_mib_peak": [x / 2**20 for x in peak],
    }


def chart(points: list[dict[str, Any]], default: dict[str, Any], path: Path) -> None:
    """Deliveries/s against the deliveries allowed in flight (processes x N), and the number
    actually in flight (measured at the receiver), with the ideal of 10/s per request in flight."""
    import matplotlib.pyplot as plt  # only through optional_chart, which checked matplotlib

    allowed = [p["processes"] * p["concurrency"] for p in points]
    default_allowed = default["processes"] * min(default["concurrency"], CAP)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    left.plot(
        allowed, [p["per_s"] for p in points], "o-", label=f"{PROCESSES} processes x --concurrency N, cap = N"
    )
    left.plot(
        allowed, [10 * a for a in allowed], ":", color="grey", label="ideal: 10/s per delivery in flight"
    )
    left.plot(
        [default_allowed],
        [default["per_s"]],
        "s",
        color="tab:red",
        label=(
            f"documented default: N={CONCURRENCY}, adaptive limit up to {CAP} "
            f"({default_allowed} for one endpoint)"
        ),
    )
    left.axhline(GOAL, color="tab:green", linestyle="--", linewidth=1, label=f"goal: {GOAL}/s")
    left.set_xscale("log", base=2)
    left.set_xticks(allowed, [str(a) for a in allowed])
    left.set_ylim(0, max(GOAL * 1.2, default["per_s"], *(p["per_s"] for p in points)) * 1.1)
    left.set_xlabel("deliveries allowed in flight (processes x N)")
    left.set_ylabel("deliveries/s (100 ms receiver)")
    left.legend(fontsize=7, loc="upper left")
    left.grid(alpha=0.3)
    right.plot(allowed, [p["mean_in_flight"] for p in points], "o-", label="mean in flight (receiver)")
    right.plot(allowed, [p["peak_in_flight"] for p in points], "^--", label="peak in flight (receiver)")
    right.plot(allowed, allowed, ":", color="grey", label="allowed")
    right.set_xscale("log", base=2)
    right.set_yscale("log", base=2)
    right.set_xticks(allowed, [str(a) for a in allowed])
    right.set_xlabel("deliveries allowed in flight (processes x N)")
    right.set_ylabel("deliveries in flight")
    right.legend(fontsize=7, loc="upper left")
    right.grid(alpha=0.3)
    fig.suptitle(
        "S3: throughput against deliveries in flight (2 cores, PostgreSQL, Redis, receiver on one machine)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(ctx: Context) -> Result:
    count = ctx.pick(5000, 200)
    result = Result()
    with Receiver() as receiver:
        # The machine's HTTP ceiling in this run, beside the absolute goal (machines differ 2x).
        top = ceiling(receiver, ctx.pick(5_000, 2_000), encode_payload(payload(0)).encode())
        base = measure(ctx, receiver, ctx.pick(30, 15), processes=1, concurrency=1, tag="base")
        ctx.close_apps()
        main = measure(ctx, receiver, count, processes=PROCESSES, concurrency=CONCURRENCY, tag="main")
        ctx.close_apps()
        sweep: list[dict[str, Any]] = []
        for n in ctx.pick((1, 2, 4, 8, 16, 32, 64), (32,)):
            expected = min(2 * n * 10, 300)
            sweep_count = max(40, min(ctx.pick(1000, 200), int(expected * ctx.pick(5, 2))))
            cap = {"HARVEST_WEBHOOKS_MAX_INFLIGHT_PER_SUBSCRIPTION": n}
            sweep.append(
                measure(
                    ctx, receiver, sweep_count, processes=PROCESSES, concurrency=n, config=cap, tag=f"n{n}"
                )
            )
            ctx.close_apps()
    chart_path = ctx.chart_dir / ("results/s3_throughput-quick.png" if ctx.quick else "s3_throughput.png")
    drawn = optional_chart(lambda path: chart(sweep, main, path), chart_path)
    ok = main["states"] == {"delivered": count}
    growth = None
    if main["rss_mib_after_10pct"] and main["rss_mib_peak"]:
        growth = max(
            p / f - 1 for p, f in zip(main["rss_mib_peak"], main["rss_mib_after_10pct"], strict=True)
        )
    best = max(sweep, key=lambda p: p["per_s"])
    result.rows += [
        Row(
            ID,
            f"deliveries/s, {PROCESSES} proc x --concurrency {CONCURRENCY}, adaptive limit ({count:,})",
            main["per_s"],
            "/s",
            f">= {GOAL}/s and >= 20x baseline",
            main["per_s"] >= GOAL and main["per_s"] >= 20 * base["per_s"] and ok,
            baseline=base["per_s"],
            baseline_label="one at a time",
            ratio=main["per_s"] / base["per_s"],
            ceiling=top,
            note=(
                f"mean in flight {main['mean_in_flight']:.1f}, peak {main['peak_in_flight']}, "
                f"{main['jobs_per_delivery']:.1f} jobs per delivery; "
                f"{main['per_s'] / (10 * PROCESSES * min(CONCURRENCY, CAP)):.2f} of the ideal "
                f"{10 * PROCESSES * min(CONCURRENCY, CAP)}/s"
            ),
        ),
        Row(
            ID,
            "worker RSS growth, 10% -> peak (max of processes)",
            None if growth is None else growth * 100,
            "%",
            "bounded (<= 10%)",
            None if growth is None else growth <= 0.10,
            note=f"peak RSS {', '.join(f'{x:.0f}' for x in main['rss_mib_peak'])} MiB",
        ),
        Row(
            ID,
            f"best of sweep: N={best['concurrency']}, ceiling=N",
            best["per_s"],
            "/s",
            "report",
            None,
            baseline=base["per_s"],
            baseline_label="one at a time",
            ratio=best["per_s"] / base["per_s"],
            note=f"mean in flight {best['mean_in_flight']:.1f}",
        ),
    ]
    if drawn == NO_CHART:
        result.rows[-1].note += f"; {NO_CHART}"
    result.details = {"baseline": base, "main": main, "sweep": sweep, "chart": drawn, "ceiling_per_s": top}
    return result


if __name__ == "__main__":
    from .__main__ import main as bench_main

    raise SystemExit(bench_main(["--only", ID, *sys.argv[1:]]))
