"""``flask harvest worker`` as a real subprocess: an app module for it to load, starting it, and
stopping it with everything it started."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

#: The checkout this file is in.
ROOT = Path(__file__).resolve().parents[1]
#: The app the worker loads: the rq backend on ``TEST_REDIS_URL``, a SQL store on
#: ``TEST_DATABASE_URL``, and whatever ``HARVEST_*`` keys the test adds in ``TEST_HARVEST_CONFIG``.
WORKER_APP = """
import json
import os

import sqlalchemy as sa
from flask import Flask

from flask_harvest import OutboundWebhookPlugin
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore


def create_app():
    app = Flask("worker_app")
    app.config.update(
        HARVEST_JOBS_BACKEND="rq",
        HARVEST_REDIS_URL=os.environ["TEST_REDIS_URL"],
        HARVEST_SWEEP_INTERVAL_SECONDS=0.5,
        HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS=True,  # the receiver is on 127.0.0.1
    )
    app.config.update(json.loads(os.environ["TEST_HARVEST_CONFIG"]))
    engine = sa.create_engine(os.environ["TEST_DATABASE_URL"])
    OutboundWebhookPlugin(SqlOutboundWebhookStore(engine), app)
    return app
"""


def start_worker(
    folder: Path,
    store: SqlOutboundWebhookStore,
    redis_url: str,
    *args: str,
    config: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    app: str = "worker_app:create_app",
) -> subprocess.Popen[bytes]:
    """Start ``flask harvest worker *args`` in ``folder`` on ``store``'s database and ``redis_url``,
    its app configured with ``config`` on top of :data:`WORKER_APP`'s; its output goes to
    ``folder / "worker.log"``. Stop it with :func:`stop`.

    :param app: the ``--app`` the worker loads instead: a module of this checkout (such as
        ``tests.browser.workflow_live_app:create_app``) reading ``TEST_REDIS_URL`` and
        ``TEST_DATABASE_URL``.
    """
    (folder / "worker_app.py").write_text(WORKER_APP)
    environment = {
        **os.environ,
        # The worker imports this checkout's flask_harvest (and its tests' app modules), as the
        # test does.
        "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "TEST_REDIS_URL": redis_url,
        "TEST_DATABASE_URL": store.engine.url.render_as_string(hide_password=False),
        "TEST_HARVEST_CONFIG": json.dumps(config or {}),
        **(env or {}),
    }
    command = [sys.executable, "-m", "flask", "--app", app, "harvest", "worker", *args]
    with open(folder / "worker.log", "ab") as log:  # the child keeps its own copy of the file
        # A session of its own, so that stop() also reaches RQ's forked scheduler process.
        return subprocess.Popen(
            command, cwd=folder, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


#: How long a stopped worker may take to exit before the tests kill it: a liveness bound, far
#: above the second or two a graceful stop takes (a worker that outlives it is a failure).
STOP_SECONDS = 20.0


def stop_group(
    process: subprocess.Popen[Any], how: signal.Signals, timeout: float = STOP_SECONDS
) -> int | None:
    """Send ``how`` to ``process``'s session, then :func:`wait_or_kill` it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, how)
    return wait_or_kill(process, timeout)


def wait_or_kill(process: subprocess.Popen[Any], timeout: float = STOP_SECONDS) -> int | None:
    """Wait up to ``timeout`` s for ``process`` to end; then SIGKILL whatever is left of its
    session and reap the process. Return its exit status, or ``None`` if it had to be killed.

    Nothing outlives the call: a process still running when its test ends would be reaped, with a
    ResourceWarning, in whichever later test the garbage collector runs, and fail that test.
    """
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # whatever is left of the group (RQ's scheduler)
        process.wait(timeout=timeout)  # SIGKILL ends it at once; wait() reaps it


def stop(process: subprocess.Popen[bytes], how: signal.Signals) -> None:
    """Send ``how`` to the worker and everything it started; wait for the worker to end.

    :raises AssertionError: it did not end within :data:`STOP_SECONDS` (it was killed then).
    """
    status = stop_group(process, how)
    assert status is not None, f"the worker did not exit within {STOP_SECONDS} s of {how.name}; it was killed"
