"""``flask harvest subscriptions ...``: who receives which events."""

from __future__ import annotations

from typing import Any

import click

from ..errors import InvalidFieldError
from ..webhooks.models import WebhookSubscriptionStatus
from ..webhooks.operations import NewSecret
from ..webhooks.ordering import DEFAULT_ORDERING_POLICY, OrderingPolicy
from . import _common as out
from ._common import HarvestGroup as _Group
from ._common import operations as _ops

# -- subscriptions ---------------------------------------------------------------------------------

subscriptions_cli = _Group("subscriptions", help="Who receives which events.")
_secret_option = click.option(
    "--secret",
    default=None,
    help="Signing secret: whsec_<base64>, or any string, stored as whsec_ and its base64 (the same key);"
    " default: a random one.",
)


_filter_option = click.option(
    "--filter",
    "payload_filter",
    default=None,
    metavar="JSON",
    help='Deliver only the payloads this condition holds on, e.g. \'{"type": "Eq", "data": {"path": '
    '"region", "value": "EU"}}\' (the completion triggers\' condition language).',
)
_header_option = click.option(
    "--header",
    "headers",
    multiple=True,
    metavar="'NAME: VALUE'",
    help="A header sent with every delivery; repeat. Not a secret: it is shown wherever the "
    "subscription is (authenticate receivers with the signature).",
)


_rate_option = click.option(
    "--rate",
    "per_second",
    type=float,
    default=None,
    metavar="PER_SECOND",
    help="At most this many deliveries per second across every worker (give --burst too); a "
    "delivery over it waits its turn.",
)
_burst_option = click.option(
    "--burst", type=int, default=None, metavar="N", help="With --rate: up to N deliveries at once."
)


def _rate_limit(per_second: float | None, burst: int | None) -> dict[str, Any] | None:
    """``--rate`` and ``--burst`` as a rate limit's JSON form (validated with the subscription)."""
    if per_second is None and burst is None:
        return None
    if per_second is None or burst is None:
        raise InvalidFieldError("--rate", "give --rate and --burst together")
    return {"per_second": per_second, "burst": burst}


def _headers(values: tuple[str, ...]) -> dict[str, str]:
    """``NAME: VALUE`` options as a mapping (validated with the subscription)."""
    headers: dict[str, str] = {}
    for value in values:
        name, colon, text = value.partition(":")
        if not colon:
            raise InvalidFieldError("--header", f"{name!r:.80} is not 'NAME: VALUE'")
        if name.strip() in headers:
            raise InvalidFieldError("--header", f"{name.strip()!r:.80} is given twice")
        headers[name.strip()] = text.strip()
    return headers


def _print_new_secret(created: NewSecret, as_json: bool, warnings: list[str] | None = None) -> None:
    # The only output with a secret in it: every other command prints to_dict(), which leaves it out.
    shown = {**created.subscription.to_dict(), "secret": created.secret}
    if warnings and as_json:
        shown["warnings"] = warnings
    out.output(shown, as_json, out.with_secret)
    for warning in [] if as_json else warnings or []:
        # On stderr, so the text on stdout stays what it was; the subscription was saved.
        click.echo(f"Warning: {warning}", err=True)


@subscriptions_cli.command("add")
@click.argument("url")
@click.option("--topic", "topics", multiple=True, required=True, help="Topic or pattern (order.*); repeat.")
@_secret_option
@click.option("--id", "subscription_id", default=None, help="The subscription's id (default: sub_<random>).")
@click.option("--description", default="", help="A note for operators.")
@_filter_option
@_header_option
@_rate_option
@_burst_option
@click.option(
    "--ordering-policy",
    type=click.Choice([p.value for p in OrderingPolicy]),
    default=DEFAULT_ORDERING_POLICY.value,
    show_default=True,
    help="What an ordering key does when its head is dead-lettered: wait for an operator, or move on.",
)
@click.option(
    "--tenant",
    default=None,
    metavar="TENANT",
    help="The tenant the subscription belongs to: it receives the events dispatched for that tenant "
    "only (default: none, the events dispatched without a tenant).",
)
@out.json_option
def subscriptions_add(
    url: str,
    topics: tuple[str, ...],
    secret: str | None,
    subscription_id: str | None,
    description: str,
    payload_filter: str | None,
    headers: tuple[str, ...],
    per_second: float | None,
    burst: int | None,
    ordering_policy: str,
    tenant: str | None,
    as_json: bool,
) -> None:
    """Subscribe URL to events; prints the signing secret, once."""
    created = _ops().create_subscription(
        target_url=url,
        event_topics=topics,
        secret=secret,
        subscription_id=subscription_id,
        description=description,
        payload_filter=out.json_option_value("--filter", payload_filter),
        headers=_headers(headers),
        rate_limit=_rate_limit(per_second, burst),
        ordering_policy=ordering_policy,
        tenant=tenant,
    )
    _print_new_secret(created, as_json, _ops().topic_warnings(created.subscription.event_topics))


@subscriptions_cli.command("update")
@click.argument("subscription_id")
@_filter_option
@click.option("--no-filter", is_flag=True, help="Remove the payload filter: deliver every payload.")
@_header_option
@click.option("--no-headers", is_flag=True, help="Remove every custom header.")
@_rate_option
@_burst_option
@click.option("--no-rate", is_flag=True, help="Remove the rate limit.")
@click.option(
    "--ordering-policy",
    type=click.Choice([p.value for p in OrderingPolicy]),
    default=None,
    help="What an ordering key does when its head is dead-lettered (skip releases blocked keys).",
)
@out.tenant_option
@out.json_option
def subscriptions_update(
    subscription_id: str,
    payload_filter: str | None,
    no_filter: bool,
    headers: tuple[str, ...],
    no_headers: bool,
    per_second: float | None,
    burst: int | None,
    no_rate: bool,
    ordering_policy: str | None,
    tenant: str | None,
    as_json: bool,
) -> None:
    """Change the subscription's payload filter, custom headers (--header replaces them all),
    rate limit or ordering policy."""
    if headers and no_headers:
        raise InvalidFieldError("--header", "give --header or --no-headers, not both")
    rate_limit = _rate_limit(per_second, burst)
    if rate_limit is not None and no_rate:
        raise InvalidFieldError("--rate", "give --rate and --burst, or --no-rate, not both")
    changes = (
        payload_filter is not None,
        no_filter,
        headers,
        no_headers,
        rate_limit,
        no_rate,
        ordering_policy,
    )
    if not any(changes):
        raise InvalidFieldError(
            "--filter",
            "give --filter, --no-filter, --header, --no-headers, --rate and --burst, --no-rate, "
            "or --ordering-policy",
        )
    updated = _ops().update_subscription(
        subscription_id,
        payload_filter=out.json_option_value("--filter", payload_filter),
        remove_payload_filter=no_filter,
        headers={} if no_headers else (_headers(headers) if headers else None),
        rate_limit=rate_limit,
        remove_rate_limit=no_rate,
        ordering_policy=ordering_policy,
        tenant=out.scope(tenant),
    )
    out.output(updated.to_dict(), as_json, out.fields)


@subscriptions_cli.command("list")
@out.tenant_option
@out.json_option
def subscriptions_list(tenant: str | None, as_json: bool) -> None:
    """Every subscription, oldest first."""
    data = [s.to_dict() for s in _ops().list_subscriptions(tenant=out.scope(tenant))]
    out.output(data, as_json, out.subscription_rows)


@subscriptions_cli.command("show")
@click.argument("subscription_id")
@out.tenant_option
@out.json_option
def subscriptions_show(subscription_id: str, tenant: str | None, as_json: bool) -> None:
    """One subscription (its secret is never shown)."""
    shown = _ops().get_subscription(subscription_id, tenant=out.scope(tenant))
    out.output(shown.to_dict(), as_json, out.fields)


def _set_status(
    subscription_id: str, status: WebhookSubscriptionStatus, tenant: str | None, as_json: bool
) -> None:
    updated = _ops().update_subscription(subscription_id, status=status, tenant=out.scope(tenant))
    out.output(updated.to_dict(), as_json, lambda d: f"subscription {d['id']} is now {d['status']}")


@subscriptions_cli.command("enable")
@click.argument("subscription_id")
@out.tenant_option
@out.json_option
def subscriptions_enable(subscription_id: str, tenant: str | None, as_json: bool) -> None:
    """Deliver to the subscription again (clears its failure count)."""
    _set_status(subscription_id, WebhookSubscriptionStatus.ACTIVE, tenant, as_json)


@subscriptions_cli.command("disable")
@click.argument("subscription_id")
@out.tenant_option
@out.json_option
def subscriptions_disable(subscription_id: str, tenant: str | None, as_json: bool) -> None:
    """Stop delivering to the subscription; its new deliveries are skipped until enabled."""
    _set_status(subscription_id, WebhookSubscriptionStatus.DISABLED, tenant, as_json)


@subscriptions_cli.command("rotate-secret")
@click.argument("subscription_id")
@_secret_option
@click.option(
    "--grace-seconds",
    type=out.Seconds(),
    default=None,
    help="How long the old secret keeps signing too (default: HARVEST_WEBHOOKS_SECRET_GRACE_SECONDS).",
)
@out.tenant_option
@out.json_option
def subscriptions_rotate_secret(
    subscription_id: str, secret: str | None, grace_seconds: float | None, tenant: str | None, as_json: bool
) -> None:
    """Give the subscription a new secret; prints it, once."""
    rotated = _ops().rotate_secret(
        subscription_id, new_secret=secret, grace_seconds=grace_seconds, tenant=out.scope(tenant)
    )
    _print_new_secret(rotated, as_json)


@subscriptions_cli.command("remove")
@click.argument("subscription_id")
@out.tenant_option
@out.yes_option
def subscriptions_remove(subscription_id: str, tenant: str | None, yes: bool) -> None:
    """Delete the subscription; its delivery logs stay. Asks first (--yes does not)."""
    subscription = _ops().get_subscription(subscription_id, tenant=out.scope(tenant))
    out.confirm(f"Remove subscription {subscription.id} ({subscription.target_url})?", yes)
    _ops().remove_subscription(subscription_id, tenant=out.scope(tenant))
    click.echo(f"removed subscription {subscription_id}; its delivery logs stay")
