"""``flask harvest dlq ...``: dead-lettered webhook deliveries and completion callbacks."""

from __future__ import annotations

from datetime import datetime

import click

from ..webhooks.operations import MAX_BULK_REPLAY, MAX_DLQ_PAGE
from . import _common as out
from ._common import HarvestGroup as _Group
from ._common import operations as _ops
from .callbacks import _callbacks, _duration

# -- dead letters and deliveries -------------------------------------------------------------------

dlq_cli = _Group("dlq", help="Dead-lettered deliveries: list, replay and skip.")


@dlq_cli.command("list")
@click.option(
    "--limit", type=click.IntRange(1, MAX_DLQ_PAGE), default=50, show_default=True, help="Rows per page."
)
@click.option("--cursor", default=None, help="Continue after a previous page (its 'more:' line).")
@click.option("--subscription", "subscription_id", default=None, help="Only this subscription's.")
@click.option("--topic", default=None, help="Only this topic's.")
@out.tenant_option
@out.json_option
def dlq_list(
    limit: int,
    cursor: str | None,
    subscription_id: str | None,
    topic: str | None,
    tenant: str | None,
    as_json: bool,
) -> None:
    """Dead-lettered deliveries, newest first."""
    page, next_cursor = _ops().dlq_page(
        limit=limit, cursor=cursor, subscription_id=subscription_id, topic=topic, tenant=out.scope(tenant)
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
@out.tenant_option
@out.json_option
def dlq_replay(
    log_id: str | None,
    subscription_id: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int | None,
    dry_run: bool,
    tenant: str | None,
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
        result = _ops().replay(log_id, tenant=out.scope(tenant))
    elif bulk:
        result = _ops().replay_many(
            subscription_id=subscription_id,
            since=since,
            until=until,
            limit=limit or 100,
            dry_run=dry_run,
            tenant=out.scope(tenant),
        )
    else:
        raise click.UsageError("give LOG_ID, or --subscription and/or --since/--until for a bulk replay")
    data = result.to_dict()
    if "warning" in data:
        click.echo(f"Warning: {data['warning']}", err=True)
    out.output(data, as_json, out.replay_result)


@dlq_cli.command("skip")
@click.argument("log_id")
@out.tenant_option
@out.json_option
def dlq_skip(log_id: str, tenant: str | None, as_json: bool) -> None:
    """Give up on a dead-lettered delivery: it is never sent, and the next delivery of its
    ordering key is queued (the way to release a key held under the block policy without a replay)."""
    out.output(_ops().skip(log_id, tenant=out.scope(tenant)).to_dict(), as_json, out.fields)


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
