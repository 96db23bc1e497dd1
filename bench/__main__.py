"""``python -m bench [--quick] [--only S1,S3] [--out FILE]``: run the scenarios, print the table,
write the JSON."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ._report import Context, Row, format_table
from ._services import DATABASE_URL, REDIS_URL, ensure_database

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
SCENARIOS = {
    "S1": "bench.s1_dispatch",
    "S2": "bench.s2_throughput",
    "S3": "bench.s3_slow_receiver",
    "S4": "bench.s4_dead_endpoint",
    "S5": "bench.s5_latency",
    "S6": "bench.s6_outbox",
    "S7": "bench.s7_memory",
    "S8": "bench.s8_workflow_latency",
    "S9": "bench.s9_workflow_throughput",
    "S10": "bench.s10_callbacks",
    "S11": "bench.s11_many_subscriptions",
    "S12": "bench.s12_machine_throughput",
    "S13": "bench.s13_history",
    "S14": "bench.s14_realistic_mix",
    "S15": "bench.s15_overload",
    "S16": "bench.s16_dashboard_render",
    "S17": "bench.s17_fanout",
    "S18": "bench.s18_queue_cost",
    "S19": "bench.s19_metrics_scrape",
    "S20": "bench.s20_shards",
    "S21": "bench.s21_rate_limit",
    "S22": "bench.s22_ordered",
    "S23": "bench.s23_dispatch_checks",
    "S24": "bench.s24_portal_render",
}


def machine() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller counts: the whole run in < 2 minutes")
    parser.add_argument("--only", default="", help="comma-separated scenario ids, e.g. S1,S3")
    parser.add_argument("--out", type=Path, default=None, help="the JSON file (default: bench/results/)")
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the worker logs and print their folder"
    )
    args = parser.parse_args(argv)
    chosen = [s.strip().upper() for s in args.only.split(",") if s.strip()] or list(SCENARIOS)
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    args.scenarios = chosen
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = datetime.now(timezone.utc)
    out = args.out or RESULTS_DIR / f"{started:%Y%m%dT%H%M%SZ}{'-quick' if args.quick else ''}.json"
    ensure_database()
    engine = sa.create_engine(DATABASE_URL)
    log_dir = Path(tempfile.mkdtemp(prefix="harvest-bench-"))
    report: dict[str, Any] = {
        "date": started.isoformat(),
        "quick": args.quick,
        "machine": machine(),
        "services": {"database": sa.make_url(DATABASE_URL).render_as_string(), "redis": REDIS_URL},
        "scenarios": {},
    }
    rows: list[Row] = []
    failed = False
    try:
        for scenario in args.scenarios:
            module = importlib.import_module(SCENARIOS[scenario])
            ctx = Context(quick=args.quick, log_dir=log_dir, engine=engine, chart_dir=BENCH_DIR)
            print(f"== {scenario}: {module.TITLE} ...", file=sys.stderr, flush=True)
            begun = time.monotonic()
            entry: dict[str, Any] = {"title": module.TITLE}
            try:
                result = module.run(ctx)
            except Exception as exc:
                failed = True
                traceback.print_exc()
                entry["error"] = f"{type(exc).__name__}: {exc}"
                rows.append(Row(scenario, "did not complete", None, "", "-", False, note=entry["error"]))
            else:
                entry["rows"] = [row.as_dict() for row in result.rows]
                entry["details"] = result.details
                rows.extend(result.rows)
            finally:
                ctx.close_apps()
            entry["seconds"] = round(time.monotonic() - begun, 1)
            # Others share this machine: its load during the scenario explains outliers.
            entry["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
            report["scenarios"][scenario] = entry
            print(f"   {scenario} took {entry['seconds']} s", file=sys.stderr, flush=True)
    finally:
        engine.dispose()
        if args.keep_logs:
            print(f"worker logs: {log_dir}", file=sys.stderr)
        else:
            shutil.rmtree(log_dir, ignore_errors=True)
    report["rows"] = [row.as_dict() for row in rows]
    report["seconds"] = round((datetime.now(timezone.utc) - started).total_seconds(), 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(format_table(rows))
    print(f"\nwrote {out} ({report['seconds']} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
