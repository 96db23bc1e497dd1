"""The benchmark harness runs end to end: ``python -m bench --quick --only S1`` completes and writes
its JSON. It asserts no timing, only that the benchmark code has not rotted."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.s9_workflow_throughput import VARIANTS
from bench.s24_portal_render import pages as portal_pages
from flask_harvest.config import Settings

from .conftest import IN_CI

ROOT = Path(__file__).resolve().parent.parent


def run_bench(out: Path, only: str, timeout: float, **env: str) -> tuple[dict[str, Any], str]:
    """Run ``python -m bench --quick --only <only>`` and return its JSON report and its stdout.

    It gets a database and Redis number of its own (a benchmark running meanwhile keeps its own),
    plus ``env``. A service that does not answer skips the test, except under ``CI=true``.
    """
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", only, "--out", str(out)],
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "HARVEST_BENCH_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:5432/harvest_bench_test",
            "HARVEST_BENCH_REDIS_URL": "redis://127.0.0.1:6379/12",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    services_down = "Connection refused" in done.stderr or "OperationalError" in done.stderr
    if done.returncode != 0 and services_down and not IN_CI:
        pytest.skip("PostgreSQL or Redis is not running")
    assert done.returncode == 0, done.stdout + done.stderr
    report: dict[str, Any] = json.loads(out.read_text())
    return report, done.stdout


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
def test_quick_benchmark_writes_valid_json(tmp_path: Path) -> None:
    report, stdout = run_bench(tmp_path / "s1.json", "S1", timeout=240)
    assert {"date", "quick", "machine", "scenarios", "rows"} <= set(report)
    assert report["quick"] is True
    assert report["machine"]["nproc"] >= 1
    s1 = report["scenarios"]["S1"]
    assert "error" not in s1
    assert {"rows", "details", "seconds"} <= set(s1)
    figures = [row["figure"] for row in s1["rows"]]
    for k in (1, 10, 100):
        assert f"dispatch, K={k} (median)" in figures, figures
    for row in s1["rows"]:
        assert {"scenario", "figure", "value", "unit", "goal", "met", "baseline", "ratio"} <= set(row)
        assert row["scenario"] == "S1"
        assert isinstance(row["value"], float)
    assert "| S1 |" in stdout  # the printed table


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
def test_quick_workflow_benchmarks_compare_with_dbos(tmp_path: Path) -> None:
    if importlib.util.find_spec("dbos") is None:
        # The dev extra installs it (through bench): under CI=true its absence fails, as a missing
        # service does (conftest.service_unavailable); locally it skips.
        message = "DBOS Transact (the bench extra) is not installed"
        if IN_CI:
            pytest.fail(f"{message}; CI=true requires it", pytrace=False)
        pytest.skip(message)
    report, _ = run_bench(
        tmp_path / "s8s9.json",
        "S8,S9",
        timeout=600,  # about 2 minutes on an idle machine; S9 runs 7 drains
        HARVEST_BENCH_DBOS_URL="postgresql+psycopg://postgres@127.0.0.1:5432/harvest_bench_dbos_test",
    )
    for scenario in ("S8", "S9"):
        entry = report["scenarios"][scenario]
        assert "error" not in entry, entry
        for row in entry["rows"]:
            assert row["scenario"] == scenario
            assert isinstance(row["value"], float) and isinstance(row["baseline"], float), row
    s9 = report["scenarios"]["S9"]["details"]
    # Every run of both engines completed (the scenario counts them from their rows).
    assert s9["count"] == 300
    assert all(len(s9[variant]) == 1 for variant in VARIANTS), s9
    # The default-settings rows run at the package's default, whatever it is.
    assert s9["default_workflow_concurrency"] == Settings().workflow_concurrency


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
def test_quick_rate_limit_benchmark_reports_the_rate_against_the_limit(tmp_path: Path) -> None:
    report, stdout = run_bench(tmp_path / "s21.json", "S21", timeout=240)
    entry = report["scenarios"]["S21"]
    assert "error" not in entry, entry
    details = entry["details"]
    # Both subscriptions were served (how much within the window is the benchmark's figure).
    assert 0 < details["free_received"] <= details["free_dispatched"]
    assert 0 < details["limited_received"] <= details["limited_dispatched"]
    for row in entry["rows"]:
        assert row["scenario"] == "S21" and isinstance(row["value"], float), row
    assert "| S21 |" in stdout


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
def test_quick_dispatch_checks_benchmark_compares_checked_with_plain_dispatch(tmp_path: Path) -> None:
    report, stdout = run_bench(tmp_path / "s23.json", "S23", timeout=240)
    entry = report["scenarios"]["S23"]
    assert "error" not in entry, entry
    assert [row["figure"] for row in entry["rows"]] == [
        f"dispatch with schema check and filters, K={k} (median)" for k in (1, 10)
    ]
    for row in entry["rows"]:
        assert row["scenario"] == "S23" and isinstance(row["value"], float), row
        assert row["baseline"] > 0 and row["ratio"] > 0
    assert "| S23 |" in stdout


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
def test_quick_portal_benchmark_renders_every_page_for_both_tenants(tmp_path: Path) -> None:
    report, stdout = run_bench(tmp_path / "s24.json", "S24", timeout=300)
    entry = report["scenarios"]["S24"]
    assert "error" not in entry, entry
    details = entry["details"]
    labels = [page.label for page in portal_pages()]
    # A row per page, then the slowest.
    assert [row["figure"] for row in entry["rows"][:-1]] == [f"{label}, big tenant (p95)" for label in labels]
    for label in labels:
        assert set(details[label]["render_ms"]) == {"big", "ordinary"}, details[label]
        assert isinstance(details[label]["statements"], int)
    assert details["tenants"]["big"] != details["tenants"]["ordinary"]
    for row in entry["rows"]:
        assert row["scenario"] == "S24" and isinstance(row["value"], float), row
    for row in entry["rows"][:-1]:  # the ordinary tenant's time beside the big one's
        assert row["baseline"] > 0 and row["ratio"] > 0, row
    assert "| S24 |" in stdout
