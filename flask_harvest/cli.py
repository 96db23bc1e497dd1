"""``flask harvest ...``: operator commands, thin over :mod:`flask_harvest.webhooks.operations`.

Each command prints text for people or, with ``--json``, JSON for scripts. A failure exits with
status 1 (2 for misused options) and a one-line ``Error: ...`` reason, never a traceback. A secret is
printed only by ``subscriptions add`` and ``subscriptions rotate-secret``, once.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import click
from flask import current_app

from . import _cli_output as out
from ._app import METRICS_KEY, get_engine
from ._cli_output import HarvestGroup as _Group
from .callbacks.service import CompletionCallbacks
from .engine import HarvestEngine
from .errors import ConfigurationError
from .triggers_cli import triggers_cli
from .webhooks.models import WebhookSubscriptionStatus, isoformat, utcnow
from .webhooks.operations import MAX_BULK_REPLAY, MAX_DLQ_PAGE, MAX_RELAY_BATCH, NewSecret, WebhookOperations
from .worker import serve
from .workflow_cli import workflows_cli

if TYPE_CHECKING:  # only then: the metrics module needs the optional prometheus_client
    from .metrics import MetricsExposition

harvest_cli = _Group(
    "harvest",
    help="flask-harvest: outbound webhooks, durable workflows, their completion callbacks and "
    "completion triggers; the worker and maintenance.",
)
# In an app without workflows (or triggers) their commands say so in one line: the command list
# is the same for every app, whatever extensions it has.
harvest_cli.add_command(workflows_cli)
harvest_cli.add_command(triggers_cli)


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


@harvest_cli.command("sweep")
def sweep_command() -> None:
    """Once: relay waiting outbox messages, purge old relayed ones, free expired leases and queue
    due deliveries (and workflow executions) that have no job; end overdue workflow executions."""
    engine = get_engine()
    report = engine.sweep()
    _finish_local_jobs(engine)
    line = (
        f"relayed {report.relayed} outbox message(s), released {report.released} expired lease(s), "
        f"requeued {report.requeued} delivery(ies)"
    )
    if engine.workflows is not None:
        line += (
            f"; ended {report.timed_out} workflow execution(s) TimedOut and {report.poisoned} as poison pills"
        )
    click.echo(line)


def _finish_local_jobs(engine: HarvestEngine) -> None:
    """A backend that runs jobs on this process's threads (the local one): let them finish."""
    engine.backend.join(timeout=engine.settings.webhooks_deadline_seconds * 2)


def _ops() -> WebhookOperations:
    return get_engine().operations


@harvest_cli.command("init-db")
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


@harvest_cli.command("purge")
@click.option("--before", metavar="ISO_DATETIME", callback=out.iso_datetime, help="Cutoff (naive = UTC).")
@click.option("--older-than", type=out.Seconds(), default=None, help="Cutoff as seconds before now.")
@out.yes_option
@out.json_option
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


@harvest_cli.command("stats")
@out.json_option
def stats_command(as_json: bool) -> None:
    """Delivery counts by state, DLQ depth and the oldest pending delivery's age."""
    out.output(_ops().stats(), as_json, out.stats)


# -- subscriptions ---------------------------------------------------------------------------------

subscriptions_cli = _Group("subscriptions", help="Who receives which events.")
harvest_cli.add_command(subscriptions_cli)
_secret_option = click.option(
    "--secret",
    default=None,
    help="Signing secret: whsec_<base64>, or any string, stored as whsec_ and its base64 (the same key);"
    " default: a random one.",
)


def _print_new_secret(created: NewSecret, as_json: bool) -> None:
    # The only output with a secret in it: every other command prints to_dict(), which leaves it out.
    out.output({**created.subscription.to_dict(), "secret": created.secret}, as_json, out.with_secret)


@subscriptions_cli.command("add")
@click.argument("url")
@click.option("--topic", "topics", multiple=True, required=True, help="Topic or pattern (order.*); repeat.")
@_secret_option
@click.option("--id", "subscription_id", default=None, help="The subscription's id (default: sub_<random>).")
@click.option("--description", default="", help="A note for operators.")
@out.json_option
def subscriptions_add(
    url: str,
    topics: tuple[str, ...],
    secret: str | None,
    subscription_id: str | None,
    description: str,
    as_json: bool,
) -> None:
    """Subscribe URL to events; prints the signing secret, once."""
    created = _ops().create_subscription(
        target_url=url,
        event_topics=topics,
        secret=secret,
        subscription_id=subscription_id,
        description=description,
    )
    _print_new_secret(created, as_json)


@subscriptions_cli.command("list")
@out.json_option
def subscriptions_list(as_json: bool) -> None:
    """Every subscription, oldest first."""
    data = [s.to_dict() for s in _ops().list_subscriptions()]
    out.output(data, as_json, out.subscription_rows)


@subscriptions_cli.command("show")
@click.argument("subscription_id")
@out.json_option
def subscriptions_show(subscription_id: str, as_json: bool) -> None:
    """One subscription (its secret is never shown)."""
    out.output(_ops().get_subscription(subscription_id).to_dict(), as_json, out.fields)


def _set_status(subscription_id: str, status: WebhookSubscriptionStatus, as_json: bool) -> None:
    updated = _ops().update_subscription(subscription_id, status=status)
    out.output(updated.to_dict(), as_json, lambda d: f"subscription {d['id']} is now {d['status']}")


@subscriptions_cli.command("enable")
@click.argument("subscription_id")
@out.json_option
def subscriptions_enable(subscription_id: str, as_json: bool) -> None:
    """Deliver to the subscription again (clears its failure count)."""
    _set_status(subscription_id, WebhookSubscriptionStatus.ACTIVE, as_json)


@subscriptions_cli.command("disable")
@click.argument("subscription_id")
@out.json_option
def subscriptions_disable(subscription_id: str, as_json: bool) -> None:
    """Stop delivering to the subscription; its new deliveries are skipped until enabled."""
    _set_status(subscription_id, WebhookSubscriptionStatus.DISABLED, as_json)


@subscriptions_cli.command("rotate-secret")
@click.argument("subscription_id")
@_secret_option
@click.option(
    "--grace-seconds",
    type=out.Seconds(),
    default=None,
    help="How long the old secret keeps signing too (default: HARVEST_WEBHOOKS_SECRET_GRACE_SECONDS).",
)
@out.json_option
def subscriptions_rotate_secret(
    subscription_id: str, secret: str | None, grace_seconds: float | None, as_json: bool
) -> None:
    """Give the subscription a new secret; prints it, once."""
    rotated = _ops().rotate_secret(subscription_id, new_secret=secret, grace_seconds=grace_seconds)
    _print_new_secret(rotated, as_json)


@subscriptions_cli.command("remove")
@click.argument("subscription_id")
@out.yes_option
def subscriptions_remove(subscription_id: str, yes: bool) -> None:
    """Delete the subscription; its delivery logs stay. Asks first (--yes does not)."""
    subscription = _ops().get_subscription(subscription_id)
    out.confirm(f"Remove subscription {subscription.id} ({subscription.target_url})?", yes)
    _ops().remove_subscription(subscription_id)
    click.echo(f"removed subscription {subscription_id}; its delivery logs stay")


# -- dead letters and deliveries -------------------------------------------------------------------

dlq_cli = _Group("dlq", help="Dead-lettered deliveries: list and replay.")
harvest_cli.add_command(dlq_cli)


@dlq_cli.command("list")
@click.option(
    "--limit", type=click.IntRange(1, MAX_DLQ_PAGE), default=50, show_default=True, help="Rows per page."
)
@click.option("--cursor", default=None, help="Continue after a previous page (its 'more:' line).")
@click.option("--subscription", "subscription_id", default=None, help="Only this subscription's.")
@click.option("--topic", default=None, help="Only this topic's.")
@out.json_option
def dlq_list(
    limit: int, cursor: str | None, subscription_id: str | None, topic: str | None, as_json: bool
) -> None:
    """Dead-lettered deliveries, newest first."""
    page, next_cursor = _ops().dlq_page(
        limit=limit, cursor=cursor, subscription_id=subscription_id, topic=topic
    )
    data = {"deliveries": [d.to_dict() for d in page], "next_cursor": next_cursor}
    out.output(data, as_json, out.dlq_page)


@dlq_cli.command("replay")
@click.argument("log_id", required=False)
@click.option("--subscription", "subscription_id", default=None, help="Bulk: this subscription's DLQ.")
@click.option(
    "--since", metavar="ISO_DATETIME", callback=out.iso_datetime, help="Bulk: dead-lettered at or after."
)
@click.option(
    "--until", metavar="ISO_DATETIME", callback=out.iso_datetime, help="Bulk: dead-lettered before."
)
@click.option(
    "--limit", type=click.IntRange(1, MAX_BULK_REPLAY), default=None, help="Bulk: at most this many [100]."
)
@click.option("--dry-run", is_flag=True, help="Bulk: say what would be replayed, change nothing.")
@out.json_option
def dlq_replay(
    log_id: str | None,
    subscription_id: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Replay LOG_ID, or in bulk (--subscription and/or --since/--until), newest first.

    A replayed delivery starts again at attempt 1 with the same id, so the receiver can deduplicate.
    A bulk replay lists the deliveries it did not replay (they left the DLQ meanwhile), with why.
    """
    bulk = subscription_id is not None or since is not None or until is not None
    if log_id is not None and (bulk or limit is not None or dry_run):
        raise click.UsageError("give LOG_ID or the bulk options (--subscription, --since, --until), not both")
    if log_id is not None:
        result = _ops().replay(log_id)
    elif bulk:
        result = _ops().replay_many(
            subscription_id=subscription_id,
            since=since,
            until=until,
            limit=limit or 100,
            dry_run=dry_run,
        )
    else:
        raise click.UsageError("give LOG_ID, or --subscription and/or --since/--until for a bulk replay")
    data = result.to_dict()
    if "warning" in data:
        click.echo(f"Warning: {data['warning']}", err=True)
    out.output(data, as_json, out.replay_result)


deliveries_cli = _Group("deliveries", help="Delivery logs and their attempts.")
harvest_cli.add_command(deliveries_cli)


@deliveries_cli.command("show")
@click.argument("delivery_id")
@out.json_option
def deliveries_show(delivery_id: str, as_json: bool) -> None:
    """One delivery and its attempt history."""
    out.output(_ops().delivery_with_attempts(delivery_id), as_json, out.delivery)


# -- outbox ----------------------------------------------------------------------------------------

outbox_cli = _Group("outbox", help="The transactional outbox of dispatch_in_tx.")
harvest_cli.add_command(outbox_cli)


@outbox_cli.command("relay")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_RELAY_BATCH),
    default=500,
    show_default=True,
    help="Messages per batch.",
)
def outbox_relay_command(limit: int) -> None:
    """Relay committed messages whose relay never ran, until none are left."""
    relayed, failed = _ops().relay_outbox(limit=limit)
    _finish_local_jobs(get_engine())
    click.echo(f"relayed {relayed} outbox message(s), {failed} failed")
    if failed:
        raise SystemExit(1)


@outbox_cli.command("purge")
@click.option(
    "--older-than",
    type=out.Seconds(),
    default=None,
    help="Seconds since relay (default: HARVEST_OUTBOX_RETENTION_SECONDS).",
)
@out.yes_option
def outbox_purge_command(older_than: float | None, yes: bool) -> None:
    """Delete relayed outbox messages older than the retention period. Asks first (--yes does not)."""
    since = "the retention period" if older_than is None else f"{older_than:g} s"
    out.confirm(f"Delete the relayed outbox messages relayed more than {since} ago?", yes)
    removed, seconds = _ops().purge_outbox(older_than)
    click.echo(f"removed {removed} relayed outbox message(s) older than {seconds:g} s")


# -- completion callbacks --------------------------------------------------------------------------

completion_cli = _Group(
    "completion-delivery",
    help="Completion-callback deliveries of workflow executions: list and redrive "
    "(aliases: completion-deliveries, callbacks).",
)
harvest_cli.add_command(completion_cli)
harvest_cli.add_command(completion_cli, "completion-deliveries")
harvest_cli.add_command(completion_cli, "callbacks")

_DELIVERY_STATES = ("pending", "inflight", "delivered", "failed")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _callbacks() -> CompletionCallbacks:
    callbacks = get_engine().callbacks
    if callbacks is None:
        raise ConfigurationError(
            "workflows are off on this app: give Harvest the app's Flask-SQLAlchemy db (Harvest(app, db))"
        )
    return callbacks


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """Read ``90``, ``30s``, ``10m``, ``2h`` or ``1d`` as seconds."""
    if value is None:
        return None
    text = value.strip().lower()
    unit = next((u for u in ("ms", "s", "m", "h", "d") if text.endswith(u)), "")
    number = text[: len(text) - len(unit)] if unit else text
    try:
        seconds = float(number) * _DURATION_UNITS.get(unit, 1.0)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a duration such as 90, 30s, 10m, 2h or 1d") from None
    if not 0 <= seconds <= 7 * 86400 or seconds != seconds:
        raise click.BadParameter("must be between 0 and 7 days")
    return seconds


def _delivery_rows(data: Any) -> str:
    rows = [
        [d["callback_index"], d["delivery_id"], d["state"], d["attempts"], d["last_status"], d["target_url"]]
        for d in data["deliveries"]
    ]
    return out.table(rows, ["#", "delivery_id", "state", "attempts", "last_status", "target"])


@completion_cli.command("list")
@click.argument("execution_id")
@click.option(
    "--state", type=click.Choice(_DELIVERY_STATES), default=None, help="Only deliveries in this state."
)
@out.json_option
def completion_list(execution_id: str, state: str | None, as_json: bool) -> None:
    """The completion deliveries of EXECUTION_ID, by callback index."""
    rows = [d.to_json() for d in _callbacks().deliveries(execution_id)]
    if state is not None:  # applied here: an execution has few deliveries
        rows = [d for d in rows if d["state"] == state.upper()]
    out.output({"deliveries": rows}, as_json, _delivery_rows)


@completion_cli.command("redrive")
@click.argument("execution_id")
@click.argument("delivery_id")
@out.json_option
def completion_redrive(execution_id: str, delivery_id: str, as_json: bool) -> None:
    """Send a FAILED delivery again: fresh budget, same delivery id, byte-identical body."""
    outcome = _callbacks().redrive(execution_id, delivery_id)
    out.output({"outcome": outcome}, as_json, lambda d: f"{delivery_id}: {d['outcome']}")


@dlq_cli.command("redrive")
@click.option(
    "--queue",
    type=click.Choice(["completion-callback"]),
    required=True,
    help="The dead-letter queue to redrive.",
)
@click.option(
    "--window",
    callback=_duration,
    default="0s",
    show_default=True,
    help="Spread the next attempts evenly over this long (90, 30s, 10m, 2h), so the receiver gets no burst.",
)
@out.json_option
def dlq_redrive(queue: str, window: float, as_json: bool) -> None:
    """Send every FAILED completion callback again (after fixing the receiver)."""
    rows = _callbacks().redrive_failed(window)
    data = {"queue": queue, "redriven": len(rows), "window_seconds": window}
    out.output(
        data,
        as_json,
        lambda d: f"redriven {d['redriven']} completion deliveries over {d['window_seconds']:g} s",
    )
