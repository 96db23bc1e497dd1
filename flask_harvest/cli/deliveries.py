"""``flask harvest deliveries ...``: delivery logs and their attempts."""

from __future__ import annotations

import click

from . import _common as out
from ._common import HarvestGroup as _Group
from ._common import operations as _ops

deliveries_cli = _Group("deliveries", help="Delivery logs and their attempts.")


@deliveries_cli.command("show")
@click.argument("delivery_id")
@out.tenant_option
@out.json_option
def deliveries_show(delivery_id: str, tenant: str | None, as_json: bool) -> None:
    """One delivery and its attempt history."""
    out.output(_ops().delivery_with_attempts(delivery_id, tenant=out.scope(tenant)), as_json, out.delivery)
