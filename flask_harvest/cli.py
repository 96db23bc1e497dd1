"""``flask harvest ...``: operator commands, thin over the library's functions."""

from __future__ import annotations

from datetime import timedelta

import click
from flask import current_app
from flask.cli import AppGroup

from .errors import HarvestError
from .jobs.base import JobBackendError
from .jobs.local import LocalBackend
from .jobs.pool import DeliveryPool
from .jobs.rq import HarvestWorker, RqBackend
from .webhooks.manager import OutboundWebhookManager
from .webhooks.models import utcnow
from .webhooks.plugin import get_state

harvest_cli = AppGroup("harvest", help="Outbound webhooks: workers and maintenance.")


@harvest_cli.command("worker")
@click.option("--burst", is_flag=True, help="Quit when the queue is empty instead of waiting.")
@click.option(
    "--name",
    default=None,
    help="Worker name shown by RQ (default: random; a fixed name is unusable for minutes after a crash).",
)
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
    state = get_state()
    try:
        report = state.sweep()
    except HarvestError as exc:
        raise click.ClickException(str(exc)) from exc
    if isinstance(state.backend, LocalBackend):
        # The local backend runs the requeued attempts on this process's threads: let them finish.
        state.backend.join(timeout=state.settings.webhooks_deadline_seconds * 2)
    click.echo(
        f"relayed {report.relayed} outbox message(s), released {report.released} expired lease(s), "
        f"requeued {report.requeued} delivery(ies)"
    )


outbox_cli = AppGroup("outbox", help="The transactional outbox of dispatch_in_tx.")
harvest_cli.add_command(outbox_cli)


def _outbox_manager() -> OutboundWebhookManager:
    manager = get_state().manager
    if manager.outbox is None:
        raise click.ClickException("the outbox needs the SQL store; this app uses another store")
    return manager


@outbox_cli.command("relay")
@click.option(
    "--limit", type=click.IntRange(min=1), default=500, show_default=True, help="Messages per batch."
)
def outbox_relay_command(limit: int) -> None:
    """Relay committed messages whose relay never ran, until none are left."""
    manager = _outbox_manager()
    relayed = failed = 0
    while True:
        try:
            report = manager.relay_outbox(limit=limit)
        except HarvestError as exc:
            raise click.ClickException(str(exc)) from exc
        relayed += report.relayed
        failed += report.failed
        if report.relayed + report.failed < limit or report.failed:
            break
    click.echo(f"relayed {relayed} outbox message(s), {failed} failed")
    if failed:
        raise SystemExit(1)


@outbox_cli.command("purge")
@click.option(
    "--older-than",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds since relay (default: HARVEST_OUTBOX_RETENTION_SECONDS).",
)
def outbox_purge_command(older_than: float | None) -> None:
    """Delete relayed outbox messages older than the retention period."""
    manager = _outbox_manager()
    assert manager.outbox is not None
    seconds = older_than if older_than is not None else manager.settings.outbox_retention_seconds
    try:
        removed = manager.outbox.purge_relayed_before(utcnow() - timedelta(seconds=seconds))
    except HarvestError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"removed {removed} relayed outbox message(s) older than {seconds:g} s")
