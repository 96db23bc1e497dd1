"""What ``flask harvest`` prints: aligned tables for people, JSON for scripts, and the option types.

Every renderer takes the same JSON-ready data that ``--json`` prints, so the two formats always
show the same fields (and a secret only where the data holds one).
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import click
from flask.cli import AppGroup

from .._app import get_engine
from .._input import text_problem, to_utc
from ..engine import HarvestEngine
from ..errors import HarvestError, InvalidFieldError
from ..webhooks.models import count_text
from ..webhooks.operations import WebhookOperations
from ..webhooks.tenants import ALL_TENANTS, TenantScope

#: The ``--json`` flag every reporting command takes.
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
#: The ``--yes`` flag of every command that deletes or ends something: see :func:`confirm`.
yes_option = click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
tenant_option = click.option(
    "--tenant",
    default=None,
    metavar="TENANT",
    help="Only this tenant's subscriptions and deliveries: another tenant's are not found (default: "
    "every tenant's).",
)


def scope(tenant: str | None) -> TenantScope:
    """``--tenant`` as a scope: every tenant without it (the tenant is checked where it is used)."""
    return ALL_TENANTS if tenant is None else tenant


#: Longest value shown in a table cell; ``--json`` shows values whole.
CELL_WIDTH = 60
#: Longest duration an option accepts: a century, far past any retention or grace period, and
#: short enough that "now" minus or plus it stays a valid datetime.
MAX_SECONDS = 100 * 365 * 24 * 3600.0


def cell(value: object, width: int = CELL_WIDTH) -> str:
    """Return ``value`` as one printable line of at most ``width`` characters."""
    if value is None or value == "":
        return "-"
    if isinstance(value, (list, tuple)):
        value = ", ".join(str(v) for v in value)
    # Response bodies and errors come from receivers: no newlines or escape sequences on the terminal.
    text = " ".join("".join(c if c.isprintable() else " " for c in str(value)).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def table(rows: Sequence[Sequence[object]], columns: Sequence[str], *, empty: str = "(none)") -> str:
    """Return ``rows`` as a left-aligned text table under a ``columns`` header, or ``empty``."""
    if not rows:
        return empty
    cells = [list(columns), *([cell(v) for v in row] for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells
    )


def fields(data: Mapping[str, object], keys: Sequence[str] | None = None) -> str:
    """Return ``key  value`` lines of one object, keys aligned (all keys, or those in ``keys``)."""
    chosen = list(data) if keys is None else [k for k in keys if k in data]
    width = max((len(k) for k in chosen), default=0)
    return "\n".join(f"{k.ljust(width)}  {cell(data[k], width=200)}" for k in chosen)


def confirm(question: str, yes: bool) -> None:
    """Ask ``question`` unless ``--yes`` was given; any answer but yes aborts with status 1.

    The question goes to standard error, so that ``--json`` output stays one JSON document.
    """
    if not yes:
        click.confirm(question, abort=True, err=True)


def output(data: Any, as_json: bool, render: Callable[[Any], str]) -> None:
    """Print ``data`` as JSON, or as ``render(data)`` for people."""
    click.echo(json.dumps(data, indent=2) if as_json else render(data))


# -- commands ------------------------------------------------------------------------------------


def one_line(exc: BaseException) -> str:
    """Return the first non-empty line of an error's message (or its type's name)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _check_params(ctx: click.Context) -> None:
    """Refuse an argument that is not text a store can keep: bytes that are not UTF-8 (Python
    hands them over as lone surrogates) or a NUL character. The message never shows the value."""
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        for item in value if isinstance(value, tuple | list) else [value]:
            problem = text_problem(item) if isinstance(item, str) else None
            if problem is not None:
                label = param.opts[0] if isinstance(param, click.Option) else (param.name or "").upper()
                raise click.ClickException(f"{label} {problem}")


class HarvestCommand(click.Command):
    """A command whose :class:`HarvestError` ends it with ``Error: <reason>`` and exit status 1,
    like an argument that is not valid text."""

    def invoke(self, ctx: click.Context) -> Any:
        _check_params(ctx)
        try:
            return super().invoke(ctx)
        except HarvestError as exc:
            raise click.ClickException(one_line(exc)) from exc


class HarvestGroup(AppGroup):
    """The ``harvest`` groups: every command runs in the app context and reports errors in one line.

    :param aliases: other names of a subcommand (``alias -> name``): they run it, and the help
        lists the command once, under its own name.
    """

    command_class = HarvestCommand

    def __init__(self, *args: Any, aliases: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aliases = dict(aliases or {})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, self.aliases.get(cmd_name, cmd_name))


def finish_local_jobs(engine: HarvestEngine) -> None:
    """A backend that runs jobs on this process's threads (the local one): let them finish."""
    engine.backend.join(timeout=engine.settings.webhooks_deadline_seconds * 2)


def operations() -> WebhookOperations:
    """The current app's :class:`~flask_harvest.webhooks.operations.WebhookOperations`."""
    return get_engine().operations


# -- option types ----------------------------------------------------------------------------------


def iso_datetime(ctx: click.Context, param: click.Parameter, value: str | None) -> datetime | None:
    """Option callback: parse an ISO 8601 datetime (``2024-05-01T12:00:00Z``); naive means UTC.

    A callback rather than a ``ParamType``: that class is generic only from Click 8.4.
    """
    if value is None:
        return None
    text = value.strip()
    if text[-1:] in ("Z", "z"):  # fromisoformat takes a "Z" only from Python 3.11
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an ISO 8601 datetime such as 2024-05-01T12:00:00Z", ctx, param
        ) from None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=timezone.utc)
    try:
        return to_utc(parsed, param.name or "datetime")
    except InvalidFieldError as exc:
        raise click.BadParameter(f"{value!r} {exc.message}", ctx, param) from None


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def listen_address(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Option callback: an IP address or a host name (RFC 1123) to listen on, checked before any
    name lookup, so that a value neither can be is a usage error rather than the resolver's or the
    IDNA codec's exception."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        labels = value.removesuffix(".").split(".")
        if len(value) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
            raise click.BadParameter(
                f"{value!r} is neither an IP address nor a host name", ctx, param
            ) from None
    return value


class Seconds(click.FloatRange):
    """A number of seconds from 0 to :data:`MAX_SECONDS` (``nan`` slips through FloatRange)."""

    name = "seconds"

    def __init__(self) -> None:
        super().__init__(min=0, max=MAX_SECONDS)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if math.isnan(seconds):
            self.fail("is not a number of seconds", param, ctx)
        return seconds


def json_option_value(name: str, text: str | None) -> Any:
    """An option's JSON text decoded (``None`` when not given); malformed JSON is an error naming it."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        raise InvalidFieldError(name, "is not valid JSON") from None
    except RecursionError:
        raise InvalidFieldError(name, "is nested too deeply") from None


# -- renderers: each takes the data --json prints ------------------------------------------------


def subscription_rows(subscriptions: Sequence[Mapping[str, Any]]) -> str:
    return table(
        [
            (s["id"], s["status"], s["consecutive_failures"], s["event_topics"], s["target_url"])
            for s in subscriptions
        ],
        ("id", "status", "failures", "topics", "url"),
        empty="no subscriptions",
    )


def with_secret(data: Mapping[str, Any]) -> str:
    """A subscription that carries its new secret: the one time it is printed."""
    lines = [fields(data), "", "Store this secret now: it is not shown again."]
    expires = data.get("previous_secret_expires_at")
    if expires:
        lines.append(f"The previous secret keeps signing deliveries until {expires}.")
    return "\n".join(lines)


def dlq_page(data: Mapping[str, Any]) -> str:
    rows = [
        (
            d["id"],
            d["subscription_id"],
            d["topic"],
            f"{d['attempt']}/{d['max_attempts']}",
            d["response_status"],
            cell(d["last_error"], width=40),
            d["timestamp"],
        )
        for d in data["deliveries"]
    ]
    columns = ("id", "subscription", "topic", "attempt", "status", "last error", "timestamp")
    text = table(rows, columns, empty="the dead-letter queue has no matching deliveries")
    if data["next_cursor"]:
        text += f"\nmore: --cursor {data['next_cursor']}"
    return text


DELIVERY_FIELDS = (
    "id",
    "subscription_id",
    "topic",
    "state",
    "attempt",
    "max_attempts",
    "response_status",
    "elapsed_ms",
    "last_error",
    "timestamp",
    "next_attempt_at",
    "created_at",
    "payload",
)


def delivery(data: Mapping[str, Any]) -> str:
    attempts = [
        (a["attempt"], a["started_at"], a["response_status"], a["elapsed_ms"], a["error"])
        for a in data["attempts"]
    ]
    history = table(attempts, ("attempt", "started", "status", "ms", "error"), empty="no attempts recorded")
    return f"{fields(data, DELIVERY_FIELDS)}\n\nattempts:\n{history}"


def replay_result(data: Mapping[str, Any]) -> str:
    verb = "would replay" if data["dry_run"] else "replayed"
    lines = [f"{verb} {data['count']} delivery(ies)", *data["delivery_ids"]]
    skipped = [row for row in data["results"] if "reason" in row]
    if skipped:
        lines.append(f"not replayed: {len(skipped)}")
        lines += [f"{row['delivery_id']}  {row['outcome']}: {row['reason']}" for row in skipped]
    return "\n".join(lines)


STATS_COLUMNS = ("pending", "inflight", "delivered", "dlq", "skipped")


def stats(data: Mapping[str, Any]) -> str:
    def row(name: str, s: Mapping[str, Any]) -> list[object]:
        return [name, *(count_text(s, k) for k in STATS_COLUMNS), s["oldest_pending_age_seconds"]]

    rows = [row("(all)", data["overall"])]
    rows += [row(sub, s) for sub, s in data["subscriptions"].items()]
    return table(rows, ("subscription", *STATS_COLUMNS, "oldest pending (s)"))
