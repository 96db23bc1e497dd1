"""The documented alerting rules and Grafana dashboard: promtool checks the rules and runs their
unit tests, and every metric they use exists in what a scrape shows, so they cannot drift from
the code."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from .metrics_worker_app import TOKEN, build
from .pipeline import close_later

DOCS = Path(__file__).resolve().parents[1] / "docs"
RULES = DOCS / "prometheus" / "harvest-alerts.yml"
RULE_TESTS = DOCS / "prometheus" / "harvest-alerts-tests.yml"
DASHBOARD = DOCS / "grafana" / "harvest.json"

_NAME = re.compile(r"\bharvest_[a-z0-9_]+\b")
#: The sample names each metric type adds to its family's name.
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def promtool() -> str:
    """promtool's path; under CI a missing promtool fails the test instead of skipping it."""
    found = shutil.which("promtool")
    if found is None:
        message = "promtool is not installed (Debian: apt-get install prometheus)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def rule_expressions() -> list[str]:
    # The rules file keeps every expression on one `expr:` line (no YAML parser needed).
    return re.findall(r"^\s*expr:\s*(.+)$", RULES.read_text(), flags=re.MULTILINE)


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    tool = promtool()
    checked = subprocess.run([tool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [tool, "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    # promtool parses recording rules' expressions: one rule per panel query.
    tool = promtool()
    rules = [
        f"      - record: harvest:dashboard:q{n}\n        expr: {json.dumps(expr)}"
        for n, expr in enumerate(dashboard_expressions())
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text("groups:\n  - name: dashboard\n    rules:\n" + "\n".join(rules) + "\n")
    checked = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.redis
def test_every_metric_the_rules_and_the_dashboard_use_exists(
    tmp_path: Path, redis_url: str, redis_conn: redis.Redis
) -> None:
    # Every part on (webhooks, workflows, callbacks, triggers, the rq backend's workers).
    app = close_later(build(f"sqlite:///{tmp_path / 'app.db'}", redis_url))
    response = app.test_client().get(
        "/actuator/webhooks/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert response.status_code == 200
    exposed = {
        family.name + suffix
        for family in text_string_to_metric_families(response.get_data(as_text=True))
        for suffix in _SUFFIXES.get(family.type, ("",))
    }
    used = {name for expr in rule_expressions() + dashboard_expressions() for name in _NAME.findall(expr)}
    assert len(rule_expressions()) >= 8 and len(dashboard_expressions()) >= 20
    assert used - exposed == set()
    # And the dashboard shows every family the code exposes.
    ours = {name for name in exposed if name.startswith("harvest_")}
    shown = {name for expr in dashboard_expressions() for name in _NAME.findall(expr)}
    families = {re.sub(r"_(total|bucket|count|sum)$", "", name) for name in ours}
    assert {f for f in families if not any(s.startswith(f) for s in shown)} == set()
