"""``flask harvest worker | sweep | init-db | purge | stats``: the worker and maintenance."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import click
from flask import current_app
from flask.cli import with_appcontext

from .._app import METRICS_KEY, get_engine
from .._time import utcnow
from ..webhooks.models import isoformat
from ..worker import serve
from . import _common as out
from ._common import operations as _ops

if TYPE_CHECKING:  # only then: the metrics module needs the optional prometheus_client
    from ..metrics import MetricsExposition


@click.command("worker", cls=out.HarvestCommand)
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
@click.option(
    "--metrics-port",
    type=click.IntRange(min=1, max=65535),
    default=None,
    help="Serve the Prometheus metrics on this port, without authentication (needs HARVEST_METRICS).",
)
@click.option(
    "--metrics-address",
    default="127.0.0.1",
    callback=out.listen_address,
    show_default=True,
    help="The address --metrics-port listens on.",
)
@with_appcontext
def worker_command(
    burst: bool, name: str | None, concurrency: int | None, metrics_port: int | None, metrics_address: str
) -> None:
    """Run one RQ worker for the app's queue, with the scheduler and the sweeper: it delivers
    webhooks, runs workflow executions (those completion triggers start too) and sends completion
    callbacks.

    The process keeps up to --concurrency attempts in flight on a thread pool; run one or two
    per core (see the deployment docs).
    """
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    if metrics_port is not None:
        exposition: MetricsExposition | None = app.extensions.get(METRICS_KEY)
        if exposition is None:
            raise click.UsageError("--metrics-port needs HARVEST_METRICS = True")
        try:
            exposition.serve(metrics_port, metrics_address)
        except OSError as exc:
            where = f"{metrics_address}:{metrics_port}"
            raise click.UsageError(f"cannot serve metrics on {where} ({exc})") from None
        click.echo(f"harvest: metrics on http://{metrics_address}:{metrics_port}/")
    serve(app, burst=burst, name=name, concurrency=concurrency, say=click.echo)


@click.command("sweep", cls=out.HarvestCommand)
@with_appcontext
def sweep_command() -> None:
    """Once: relay waiting outbox messages, purge old relayed ones, free expired leases and queue
    due deliveries (and workflow executions) that have no job; end overdue workflow executions."""
    engine = get_engine()
    report = engine.sweep()
    out.finish_local_jobs(engine)
    line = (
        f"relayed {report.relayed} outbox message(s), released {report.released} expired lease(s), "
        f"requeued {report.requeued} delivery(ies)"
    )
    if engine.workflows is not None:
        line += (
            f"; ended {report.timed_out} workflow execution(s) TimedOut and {report.poisoned} as poison pills"
        )
    if report.scheduled:
        line += f"; started {report.scheduled} scheduled workflow run(s)"
    if report.trigger_starts or report.trigger_starts_waiting:
        line += (
            f"; started {report.trigger_starts} completion-trigger target(s) on other shards "
            f"({report.trigger_starts_waiting} still waiting)"
        )
    if report.triggers_repaired:
        line += f"; repaired {report.triggers_repaired} completion trigger(s) on shards"
    click.echo(line)


@click.command("init-db", cls=out.HarvestCommand)
@with_appcontext
def init_db_command() -> None:
    """Create the tables of every part the app runs (webhooks; workflows, completion callbacks and
    triggers when they are on) where they do not exist yet (existing ones are left alone)."""
    engine = get_engine()
    store = engine.store
    if not store.capabilities.schema:
        click.echo(f"{type(store).__name__} keeps no tables: there is nothing to create")
    else:
        store.ensure_schema()
        click.echo("the webhook tables are in place")
    # The release step of an app whose init_app creates no tables (create_tables=False): each
    # part that is on sweeps its tables, so each must be created here.
    if engine.workflows is not None:
        engine.workflows.store.ensure_schema()
        click.echo("the workflow tables are in place")
    if engine.callbacks is not None:
        engine.callbacks.store.ensure_schema()
        click.echo("the completion callback tables are in place")
    if engine.triggers is not None:
        engine.triggers.store.ensure_schema()
        click.echo("the completion trigger tables are in place")
    if engine.schedules is not None:
        engine.schedules.store.ensure_schema()
        click.echo("the workflow schedules table is in place")


@click.command("purge", cls=out.HarvestCommand)
@click.option("--before", metavar="ISO_DATETIME", callback=out.iso_datetime, help="Cutoff (naive = UTC).")
@click.option("--older-than", type=out.Seconds(), default=None, help="Cutoff as seconds before now.")
@out.yes_option
@out.json_option
@with_appcontext
def purge_command(before: datetime | None, older_than: float | None, yes: bool, as_json: bool) -> None:
    """Delete delivered logs whose last attempt is older than the cutoff; give exactly one.

    Pending, in-flight, dead-lettered and skipped logs stay. Asks first (--yes does not).
    """
    if (before is None) == (older_than is None):
        raise click.UsageError("give exactly one of --before and --older-than")
    cutoff = before if before is not None else utcnow() - timedelta(seconds=older_than or 0)
    out.confirm(f"Delete the delivered logs from before {isoformat(cutoff)}?", yes)
    removed = _ops().purge_delivered(cutoff)
    data = {"removed": removed, "before": isoformat(cutoff)}
    out.output(data, as_json, lambda d: f"removed {d['removed']} delivered log(s) from before {d['before']}")


@click.command("stats", cls=out.HarvestCommand)
@out.tenant_option
@out.json_option
@with_appcontext
def stats_command(tenant: str | None, as_json: bool) -> None:
    """Delivery counts by state, DLQ depth and the oldest pending delivery's age."""
    out.output(_ops().stats(tenant=out.scope(tenant)), as_json, out.stats)
