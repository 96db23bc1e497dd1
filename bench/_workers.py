"""Worker processes: the documented ``flask harvest worker`` and the bare-job baseline worker.

Every worker starts in a session of its own, so that stopping it also reaches the scheduler child
RQ forks; whatever is left of the group is killed at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rq import Worker

from flask_harvest.config import Settings

from ._app import CONFIG_ENV
from ._receivers import ROOT, process_cpu_seconds
from ._services import redis_client

#: The documented production setup's ``--concurrency``: the default, whatever it is.
DEFAULT_CONCURRENCY = Settings().worker_concurrency


class WorkerProcess:
    """One worker subprocess; its output goes to a log file."""

    def __init__(self, command: Sequence[str], log_path: Path, config: dict[str, Any] | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), CONFIG_ENV: json.dumps(config or {})}
        self.log_path = log_path
        with open(log_path, "ab") as log:  # the child keeps its own copy of the file
            self.process = subprocess.Popen(  # noqa: S603 (our own command line, no shell)
                list(command), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_bytes(self) -> int | None:
        """The worker process's resident set size (its scheduler child not included)."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the worker process has used so far (its children not included)."""
        return process_cpu_seconds(self.pid)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM the group, wait up to ``grace`` seconds, then SIGKILL what is left."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        return self.process.returncode

    def jobs_done(self) -> int:
        """How many RQ jobs this worker finished (RQ logs one 'Job OK' line per job)."""
        try:
            return self.log_path.read_text(errors="replace").count(": Job OK (")
        except OSError:
            return 0

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def harvest_worker(
    log_dir: Path,
    concurrency: int,
    *,
    config: dict[str, Any] | None = None,
    burst: bool = False,
    tag: str = "",
) -> WorkerProcess:
    """Start ``flask --app bench._app:create_app harvest worker --concurrency N``."""
    command = [sys.executable, "-m", "flask", "--app", "bench._app:create_app", "harvest", "worker"]
    command += ["--concurrency", str(concurrency)]
    if burst:
        command.append("--burst")
    name = f"worker-{tag or 'c' + str(concurrency)}-{time.monotonic_ns()}.log"
    return WorkerProcess(command, log_dir / name, config)


def bare_worker(log_dir: Path, queue: str) -> WorkerProcess:
    """Start the baseline: the same worker class running bare POST jobs, no store, no signing."""
    command = [sys.executable, "-m", "bench._bare_worker", queue]
    return WorkerProcess(command, log_dir / f"bare-{time.monotonic_ns()}.log")


def wait_registered(count: int, timeout: float = 60.0, workers: Sequence[WorkerProcess] = ()) -> None:
    """Wait until ``count`` RQ workers are registered in Redis (they have started working)."""
    client = redis_client()
    try:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if Worker.count(connection=client) >= count:
                return
            for worker in workers:
                if not worker.alive():
                    raise RuntimeError(f"a worker exited early:\n{worker.log_tail()}")
            time.sleep(0.05)
    finally:
        client.close()
    raise RuntimeError(f"{count} worker(s) did not start within {timeout} s")


def stop_all(workers: Sequence[WorkerProcess], grace: float = 5.0) -> None:
    for worker in workers:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGTERM)
    for worker in workers:
        worker.stop(grace)


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
