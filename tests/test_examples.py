"""The examples run as documented (``python examples/NAME.py``) and say that they worked.

Each runs in a fresh interpreter, as a user would run it: SQLite in a temporary folder, the local
job backend and a receiver on 127.0.0.1, so they need no service.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def run_example(name: str) -> str:
    """Run ``examples/<name>``; assert it exits 0 and return its standard output."""
    # This checkout's package first, as when the examples run from a source tree.
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{name} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_quickstart() -> None:
    out = run_example("quickstart.py")
    assert "dispatched 7 deliveries" in out
    assert len(re.findall(r"received msg_[0-9a-f]{32} .* \(both signatures valid\)", out)) == 4
    assert "dead-letter queue: 3 deliveries" in out
    assert out.count("-> sub_broken: server returned status: 503 after 3 attempts") == 3
    assert out.rstrip().endswith("quickstart OK")


def test_outbox_app() -> None:
    out = run_example("outbox_app.py")
    assert re.search(r"^POST /orders ord_1001 -> 201, outbox message evt_[0-9a-f]{32}$", out, re.M)
    assert 'receiver got 1 delivery: /hooks/orders {"reference":"ord_1001","total":42}' in out
    assert re.search(r"^  webhook-id msg_[0-9a-f]{32}$", out, re.M)
    assert "equals outbox_delivery_id(message id, 'sub_orders'): True" in out
    assert "POST /orders/import [ord_1002, ord_1001] -> 409, rolled back" in out
    assert (
        "after the failed import: 1 order(s), 1 delivery(ies), sweep relayed 0, receiver has 1 request(s)"
        in out
    )
    assert out.rstrip().endswith("outbox example OK")


def test_workflows_app() -> None:
    out = run_example("workflows_app.py")
    assert re.search(r"^started process_refund as refund-ord_1: execution [0-9a-f-]{36}$", out, re.M)
    assert "starting refund-ord_1 again while it runs returns the same execution: True" in out
    assert "refund-ord_1 ended Completed: {'refund_id': 're_1', 'amount': 4200}" in out
    assert "checkpointed steps: check_order, issue_refund, harvest:sleep, notify_customer" in out
    assert "refund-ord_2 ended Cancelled: the customer kept the goods" in out
    assert out.count("mails sent: 1") == 2
    assert out.rstrip().endswith("workflows example OK")


def test_portal_app() -> None:
    out = run_example("portal_app.py")
    assert "alice's portal link: http://localhost/portal/open?token=<signed, 10 minutes>" in out
    assert "session cookie: harvest_portal, path /portal/, HttpOnly True" in out
    refusal = "That URL cannot receive events: it is a link-local address, not reachable from the internet."
    assert f"refused URL (422): {refusal}" in out
    assert re.search(r"^endpoint sub_[0-9a-f]{32} added for http://127\.0\.0\.1:\d+/hooks; ", out, re.M)
    assert "test event from the portal: 303" in out
    verified = re.findall(r"^  receiver verified msg_[0-9a-f]{32} (.*)$", out, re.M)
    assert sorted(verified) == ['{"order_id":"ord_1","total":42}', '{"order_id":"ord_example","total":12.5}']
    assert "alice's deliveries page lists 2 delivered" in out
    assert "bob opening acme's endpoint: 404" in out
    assert out.rstrip().endswith("portal OK")


def test_completion_triggers() -> None:
    out = run_example("completion_triggers.py")
    assert "etl_ingest 2026-06-24: Completed" in out
    assert "  -> daily_report (trigger depth 1): report for 2026-06-24: 12000 rows" in out
    assert "  -> page_on_call (trigger depth 1): paged: 12000 rows is a big day" in out
    assert "  -> daily_report (trigger depth 1): report for 2026-06-25: 3000 rows" in out
    assert out.count("-> page_on_call") == 1  # the guard skipped the small day
    assert "etl_ingest 2026-06-26: Failed" in out
    assert "  -> ingest_postmortem (trigger depth 1): postmortem of etl_ingest: FAILED, ValueError:" in out
    assert out.count("-> daily_report") == 2  # the failed ingest started no report
    assert "page_on_call fires ledger: condition_unmet, fired" in out
    assert out.rstrip().endswith("completion triggers example OK")


def test_scheduled_workflows() -> None:
    out = run_example("scheduled_workflows.py")
    assert len(re.findall(r"^snapshot@\S+: snapshot of \S+$", out, re.M)) == 3
    assert "paused: True" in out
    assert "runs started while paused: 0" in out
    assert re.search(r"^after resuming: snapshot@\S+ ran", out, re.M)
    assert out.rstrip().endswith("scheduled workflows example OK")
