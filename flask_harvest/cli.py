"""``flask harvest ...``: operator commands, thin over the library's functions."""

from __future__ import annotations

import click
from flask import current_app
from flask.cli import AppGroup

from .jobs.base import JobBackendError
from .jobs.pool import DeliveryPool
from .jobs.rq import HarvestWorker, RqBackend
from .webhooks.plugin import get_state

harvest_cli = AppGroup("harvest", help="Outbound webhooks: workers and maintenance.")


@harvest_cli.command("worker")
@click.option("--burst", is_flag=True, help="Quit when the queue is empty instead of waiting.")
@click.option("--name", default=None, help="Worker name shown by RQ (default: host and pid).")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Attempts in flight at once in this process (default: HARVEST_WORKER_CONCURRENCY).",
)
def worker_command(burst: bool, name: str | None, concurrency: int | None) -> None:
    """Run one RQ worker for the webhook queue, with the scheduler and the sweeper.

    The process keeps up to --concurrency attempts in flight on a thread pool; run one or two
    per core (see the deployment docs).
    """
    state = get_state()
    backend = state.backend
    if not isinstance(backend, RqBackend):
        raise click.ClickException(
            "the worker needs the rq backend: set HARVEST_JOBS_BACKEND = 'rq' (the local backend "
            "runs deliveries inside the web process)"
        )
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    try:
        report = state.sweep()  # recover what a dead worker or a lost Redis left, before waiting
    except JobBackendError as exc:
        raise click.ClickException(f"cannot reach Redis: {exc}") from exc
    click.echo(f"harvest: startup sweep released {report.released}, requeued {report.requeued}")
    settings = state.settings
    pool = DeliveryPool(
        state.runner,
        size=concurrency or settings.worker_concurrency,
        per_subscription=settings.webhooks_max_inflight_per_subscription,
        context=app.app_context,
    )
    worker = HarvestWorker(
        [backend.queue],
        connection=backend.connection,
        name=name,
        app=app,
        pool=pool,
        periodic=state.sweep,
        interval=state.settings.sweep_interval_seconds,
    )
    worker.work(burst=burst, with_scheduler=True)


@harvest_cli.command("sweep")
def sweep_command() -> None:
    """Once: free expired leases and queue due deliveries that have no job."""
    try:
        report = get_state().sweep()
    except JobBackendError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"released {report.released} expired lease(s), requeued {report.requeued} delivery(ies)")
