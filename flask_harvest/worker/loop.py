"""The worker process's outer loop: recover, work, and start a fresh worker when Redis drops."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis
from flask import Flask

from .._app import get_engine
from ..callbacks.service import CALLBACK_JOB
from ..errors import ConfigurationError, HarvestError
from ..jobs.rq import RqBackend
from .pool import DeliveryPool, OutboundRunner
from .process import HarvestWorker

log = logging.getLogger(__name__)


def serve(
    app: Flask,
    *,
    burst: bool = False,
    name: str | None = None,
    concurrency: int | None = None,
    say: Callable[[str], object] = log.warning,
) -> None:
    """Run ``flask harvest worker`` for ``app``: sweep once, then work until stopped.

    :param burst: quit when the queue is empty.
    :param name: the worker's name in RQ (default: random).
    :param concurrency: attempts in flight at once (default: ``HARVEST_WORKER_CONCURRENCY``).
    :param say: tells the operator how the start-up sweep went (the CLI prints it).
    :raises ConfigurationError: the app does not use the ``rq`` backend.
    """
    engine = get_engine(app)
    backend = engine.backend
    # The worker is an RQ worker: it needs the RQ queue and connection, which only this backend has.
    if not isinstance(backend, RqBackend):
        raise ConfigurationError(
            "the worker needs the rq backend: set HARVEST_JOBS_BACKEND = 'rq' (the local backend "
            "runs jobs inside the web process)"
        )
    settings = engine.settings
    with app.app_context():
        try:
            report = engine.sweep()  # recover what a dead worker or a lost Redis left, before waiting
            say(f"harvest: startup sweep released {report.released}, requeued {report.requeued}")
        except HarvestError as exc:
            # The database or Redis may be restarting: the worker waits for them, and sweeps again.
            say(f"harvest: startup sweep failed ({exc}); the worker will retry")

    def make_worker(on_stop: Callable[[], object]) -> HarvestWorker:
        return HarvestWorker(
            [backend.queue],
            connection=backend.connection,
            name=name,
            app=app,
            pool=delivery_pool(app, concurrency),
            periodic=engine.sweep,
            interval=settings.sweep_interval_seconds,
            on_stop=on_stop,
        )

    run_worker(app, make_worker, burst=burst, recover=engine.sweep)


def delivery_pool(app: Flask, concurrency: int | None = None) -> DeliveryPool:
    """The worker's pool for ``app``: webhooks, and completion callbacks when the app has them,
    under one admission."""
    engine = get_engine(app)
    settings = engine.settings
    lanes: dict[str, tuple[OutboundRunner, int]] = {}
    if engine.callbacks is not None:
        lanes[CALLBACK_JOB] = (engine.callbacks, settings.completion_callback_max_inflight_per_endpoint)
    return DeliveryPool(
        engine.runner,
        size=concurrency or settings.worker_concurrency,
        per_subscription=settings.webhooks_max_inflight_per_subscription,
        min_per_subscription=settings.webhooks_min_inflight_per_subscription,
        latency_tolerance=settings.webhooks_latency_tolerance,
        context=app.app_context,
        lanes=lanes,
    )


def run_worker(
    app: Flask,
    make_worker: Callable[[Callable[[], object]], HarvestWorker],
    *,
    burst: bool,
    recover: Callable[[], object],
    max_delay: float = 30.0,
) -> None:
    """Run workers from ``make_worker`` until stopped, starting a fresh one whenever Redis drops.

    RQ's worker quits when Redis goes away under it (a restart, a failover). Instead of leaving
    that to a process manager, wait with a growing delay, run ``recover`` (a sweep: Redis may
    have come back empty) and work again. A burst run ends when its queue is empty, a normal one
    when SIGINT or SIGTERM asks it to.
    """
    stop = threading.Event()
    delay = 1.0
    while not stop.is_set():
        try:
            make_worker(stop.set).work(burst=burst, with_scheduler=True)  # connects to Redis
            if burst:
                return
            reason = "the worker loop ended"
        except redis.RedisError as exc:
            reason = f"Redis failed ({type(exc).__name__})"
        if stop.is_set():
            return
        log.warning("harvest: %s; starting a new worker in %.0f s", reason, delay)
        if stop.wait(delay):
            return
        delay = min(delay * 2, max_delay)
        try:
            with app.app_context():
                recover()
            delay = 1.0
        except Exception:  # Redis or the database is still down: wait longer, try again
            log.warning("harvest: recovery sweep failed; retrying", exc_info=True)
