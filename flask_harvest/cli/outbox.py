"""``flask harvest outbox ...``: the transactional outbox of ``dispatch_in_tx``."""

from __future__ import annotations

import click

from .._app import get_engine
from ..webhooks.operations import MAX_RELAY_BATCH
from . import _common as out
from ._common import HarvestGroup as _Group
from ._common import operations as _ops

# -- outbox ----------------------------------------------------------------------------------------

outbox_cli = _Group("outbox", help="The transactional outbox of dispatch_in_tx.")


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
    out.finish_local_jobs(get_engine())
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
