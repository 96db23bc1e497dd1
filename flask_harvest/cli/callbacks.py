"""``flask harvest completion-delivery ...``: the completion-callback deliveries of workflow
executions (aliases ``completion-deliveries`` and ``callbacks``)."""

from __future__ import annotations

from typing import Any

import click

from .._app import get_engine
from ..callbacks.service import CompletionCallbacks
from ..errors import ConfigurationError
from . import _common as out
from ._common import HarvestGroup as _Group

# -- completion callbacks --------------------------------------------------------------------------

completion_cli = _Group(
    "completion-delivery",
    help="Completion-callback deliveries of workflow executions: list and redrive "
    "(aliases: completion-deliveries, callbacks).",
)

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
