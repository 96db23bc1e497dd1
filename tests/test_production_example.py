"""The production example runs as its docstring says: gunicorn, 2 workers, PostgreSQL, Redis.

``examples/production/run_local.py`` starts everything as subprocesses against the local services
(its own database ``harvest_example`` and Redis database 13) and proves one delivery end to end.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from .conftest import DATABASE_URL, REDIS_URL

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "production" / "run_local.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.skipif(
        os.environ.get("HARVEST_TEST_DB", "") == "sqlite", reason="the example runs on PostgreSQL"
    ),
]


def test_run_local_proves_one_delivery(postgres_url: sa.URL, redis_url: str) -> None:
    # The fixtures check that the services answer (a failure under CI=true, a skip otherwise).
    # The example gets servers of its own choosing on the same hosts as the tests'.
    database_url = sa.make_url(DATABASE_URL).set(database="harvest_example")
    example_redis = REDIS_URL.rsplit("/", 1)[0] + "/13"
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    process = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            "--database-url",
            database_url.render_as_string(hide_password=False),
            "--redis-url",
            example_redis,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=110)
    except subprocess.TimeoutExpired:
        process.terminate()  # SIGTERM: the script stops gunicorn and the workers on its way out
        stdout, stderr = process.communicate(timeout=30)
        pytest.fail(f"run_local.py took more than 110 s\n{stdout}\n{stderr}")
    assert process.returncode == 0, f"exit {process.returncode}\n{stdout}\n{stderr}"
    out = stdout
    assert "from 2 web processes; 2 harvest workers are up" in out
    assert re.search(r"^POST /orders -> 201, order 1, event evt_[0-9a-f]{32}$", out, re.M)
    assert re.search(r"^receiver verified delivery msg_[0-9a-f]{32}: ", out, re.M)
    assert re.search(r"^flask harvest deliveries show msg_[0-9a-f]{32}: delivered$", out, re.M)
    assert out.rstrip().endswith("production example OK")
