"""A graceful stop of ``flask harvest worker``: every worker, idle or just busy, exits soon after
SIGTERM, and a ``--burst`` worker exits once its queue is empty; real worker processes, real Redis
and PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from rq.command import send_shutdown_command

from flask_harvest import DeliveryState, WebhookSubscription, generate_secret, get_engine
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .pipeline import rq_app, wait_final
from .worker_process import STOP_SECONDS, start_worker, stop_group, wait_or_kill

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow]

#: Workers that run a delivery just before they are asked to stop, and workers that never ran one.
BUSY = 10
IDLE = 10
#: Burst workers started on an empty queue.
BURST = 6
#: How long a worker may take to start and be waiting for work (20 processes share the CPU).
START_SECONDS = 120.0


def _wait_idle(connection: redis.Redis, names: list[str], processes: list[subprocess.Popen[bytes]]) -> None:
    """Wait until every worker in ``names`` is up and waiting for a job (RQ's state ``idle``)."""
    deadline = time.monotonic() + START_SECONDS
    waiting = set(names)
    while waiting:
        for process in processes:
            assert process.poll() is None, f"a worker exited before it was asked to ({process.returncode})"
        waiting = {name for name in waiting if connection.hget(f"rq:worker:{name}", "state") != b"idle"}
        assert time.monotonic() < deadline, f"workers not waiting for work after {START_SECONDS} s: {waiting}"
        time.sleep(0.1)


def _stop_all(processes: list[subprocess.Popen[bytes]]) -> list[int | None]:
    """SIGTERM every worker at once, then wait for each (killing one that outlives the bound)."""
    for process in processes:
        os.killpg(process.pid, signal.SIGTERM)
    return [wait_or_kill(process) for process in processes]


def _tails(folders: list[Path], statuses: list[int | None]) -> dict[int, str]:
    """The end of the log of each worker that did not exit 0, by its number."""
    return {
        n: (folders[n] / "worker.log").read_text()[-2000:] for n, status in enumerate(statuses) if status != 0
    }


def test_twenty_workers_busy_and_idle_all_exit_soon_after_sigterm(
    postgres_engine: sa.Engine,
    redis_conn: redis.Redis,
    redis_url: str,
    receiver: CapturingReceiver,
    tmp_path: Path,
) -> None:
    store = SqlOutboundWebhookStore(postgres_engine)
    store.add_subscription(
        WebhookSubscription(receiver.url("/hook"), ["stop.*"], generate_secret(), id="sub_1")
    )
    # Each busy worker has a queue of its own, so each surely runs the delivery queued there.
    queues = [f"stop-{n}" for n in range(BUSY)] + ["stop-idle"] * IDLE
    names = [f"stop-{n}-{uuid.uuid4().hex[:8]}" for n in range(BUSY + IDLE)]
    folders = [tmp_path / f"worker-{n}" for n in range(BUSY + IDLE)]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for queue, name, folder in zip(queues, names, folders, strict=True):
            folder.mkdir()
            config = {"HARVEST_WEBHOOKS_QUEUE": queue, "HARVEST_WEBHOOKS_CONNECT_TIMEOUT_SECONDS": 1}
            processes.append(start_worker(folder, store, redis_url, "--name", name, config=config))
        _wait_idle(redis_conn, names, processes)
        delivery_ids: list[str] = []
        for queue in queues[:BUSY]:
            with rq_app(store, redis_url, HARVEST_WEBHOOKS_QUEUE=queue).app_context():
                delivery_ids += get_engine().manager.dispatch("stop.now", {})
        assert wait_final(store, delivery_ids, timeout=START_SECONDS) == [DeliveryState.DELIVERED]
        _wait_idle(redis_conn, names, processes)  # the busy ones are back waiting for work
        statuses = _stop_all(processes)
    finally:
        for process in processes:
            stop_group(process, signal.SIGKILL)  # after a failure above; a no-op after _stop_all
    slow = _tails(folders, statuses)
    assert not slow, f"workers that did not exit 0 within {STOP_SECONDS} s of SIGTERM: {slow}"
    assert sorted(r.webhook_id or "" for r in receiver.requests) == sorted(delivery_ids)


def _wait_started(folder: Path, process: subprocess.Popen[bytes]) -> None:
    """Wait until the worker in ``folder`` is past its start-up (it prints how its first sweep went
    just before it starts working), or has exited."""
    deadline = time.monotonic() + START_SECONDS
    while process.poll() is None and "harvest: startup sweep" not in (folder / "worker.log").read_text():
        assert time.monotonic() < deadline, f"the worker did not start within {START_SECONDS} s"
        time.sleep(0.05)


def test_burst_workers_on_an_empty_queue_exit_soon_after_they_start(
    postgres_engine: sa.Engine, redis_conn: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    store = SqlOutboundWebhookStore(postgres_engine)
    folders = [tmp_path / f"worker-{n}" for n in range(BURST)]
    processes: list[subprocess.Popen[bytes]] = []
    statuses: list[int | None] = []
    try:
        for folder in folders:
            folder.mkdir()
            processes.append(start_worker(folder, store, redis_url, "--burst"))
        for folder, process in zip(folders, processes, strict=True):
            _wait_started(folder, process)
            statuses.append(wait_or_kill(process))  # it finds the queue empty, and ends
    finally:
        for process in processes:
            stop_group(process, signal.SIGKILL)
    slow = _tails(folders, statuses)
    assert not slow, f"burst workers that did not exit 0 within {STOP_SECONDS} s of starting to work: {slow}"


def test_a_worker_stops_on_rqs_shutdown_command(
    postgres_engine: sa.Engine, redis_conn: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    # The worker hears RQ's commands on a listener of its own: `rq shutdown` must still reach it.
    store = SqlOutboundWebhookStore(postgres_engine)
    name = f"stop-{uuid.uuid4().hex[:8]}"
    process = start_worker(tmp_path, store, redis_url, "--name", name)
    try:
        _wait_idle(redis_conn, [name], [process])
        channel = f"rq:pubsub:{name}"
        deadline = time.monotonic() + START_SECONDS
        while redis_conn.pubsub_numsub(channel) != [(channel.encode(), 1)]:
            assert time.monotonic() < deadline, "the worker is not listening for commands"
            time.sleep(0.05)
        send_shutdown_command(redis_conn, name)
        status = wait_or_kill(process)
    finally:
        stop_group(process, signal.SIGKILL)
    assert status == 0, (tmp_path / "worker.log").read_text()[-2000:]
