"""``flask harvest triggers ...``: list, show, register, delete, fires, evaluate.

Thin over :class:`~flask_harvest.triggers.service.TriggerService` (outside the ``triggers`` package,
which the ``cli`` module's engine imports); an invalid definition ends with
a one-line ``Error:`` naming the field, like every ``flask harvest`` command.
"""

from __future__ import annotations

import json
from typing import Any

import click

from .._app import trigger_service
from ..triggers.definitions import trigger_from_json, trigger_to_json
from ..triggers.service import TriggerService, fire_to_json, stored_to_json
from . import _common as out
from ._common import HarvestGroup as _Group

__all__ = ["triggers_cli"]

triggers_cli = _Group("triggers", help="Completion triggers: start a workflow when another one ends.")

_COLUMNS = ("id", "source_workflow_name", "terminal_states", "target_workflow_name", "condition")


def _service() -> TriggerService:
    return trigger_service()


def _rows(data: list[dict[str, Any]]) -> str:
    rows = [
        [
            d["id"],
            d["source_workflow_name"],
            d["terminal_states"],
            d["target_workflow_name"],
            "yes" if d["condition"] is not None else "-",
        ]
        for d in data
    ]
    return out.table(rows, _COLUMNS)


@triggers_cli.command("list")
@out.json_option
def triggers_list(as_json: bool) -> None:
    """Every registered trigger, oldest first."""
    out.output([stored_to_json(s) for s in _service().list_triggers()], as_json, _rows)


@triggers_cli.command("show")
@click.argument("trigger_id")
@out.json_option
def triggers_show(trigger_id: str, as_json: bool) -> None:
    """One trigger, with its mapping and condition as JSON."""
    data = stored_to_json(_service().get(trigger_id))
    shown = {k: json.dumps(v) if isinstance(v, dict | list) else v for k, v in data.items()}
    out.output(data, as_json, lambda _: out.fields(shown))


@triggers_cli.command("register")
@click.option("--source", "source", required=True, help="The source workflow's name.")
@click.option("--target", "target", required=True, help="The workflow to start.")
@click.option(
    "--state",
    "states",
    multiple=True,
    help="A terminal state that fires it (Completed, Failed, Cancelled, TimedOut, Terminated); repeat. "
    "Default: Completed.",
)
@click.option(
    "--mapping",
    default=None,
    help='The input mapping as JSON, e.g. \'{"type": "Projection", "data": "summary"}\'.',
)
@click.option("--condition", default=None, help="The guard condition as JSON (default: none).")
@click.option(
    "--id", "trigger_id", default=None, help="The trigger's UUID; an existing one is replaced whole."
)
@click.option(
    "--allow-unknown",
    is_flag=True,
    help="Accept --source and --target names that no workflow of this app is registered under "
    "(workflows that only other processes register).",
)
@out.json_option
def triggers_register(
    source: str,
    target: str,
    states: tuple[str, ...],
    mapping: str | None,
    condition: str | None,
    trigger_id: str | None,
    allow_unknown: bool,
    as_json: bool,
) -> None:
    """Register a trigger, or replace every field of the trigger with --id.

    --source and --target must name workflows registered in this app (see --allow-unknown).
    """
    body: dict[str, Any] = {"source_workflow_name": source, "target_workflow_name": target}
    if states:
        body["terminal_states"] = list(states)
    if mapping is not None:
        body["input_mapping"] = out.json_option_value("--mapping", mapping)
    if condition is not None:
        body["condition"] = out.json_option_value("--condition", condition)
    if trigger_id is not None:
        body["id"] = trigger_id
    stored = _service().register(trigger_from_json(body), allow_unknown_workflows=allow_unknown)
    out.output(trigger_to_json(stored), as_json, lambda d: f"registered completion trigger {d['id']}")


@triggers_cli.command("delete")
@click.argument("trigger_id")
@out.yes_option
def triggers_delete(trigger_id: str, yes: bool) -> None:
    """Delete a trigger and its fires rows. Asks first (--yes does not)."""
    service = _service()
    stored = service.get(trigger_id)
    out.confirm(
        f"Delete completion trigger {stored.id} ({stored.source_workflow_name} -> "
        f"{stored.target_workflow_name}) and its fires?",
        yes,
    )
    service.delete(trigger_id)
    click.echo(f"deleted completion trigger {trigger_id}")


@triggers_cli.command("fires")
@click.argument("trigger_id")
@click.option("--limit", type=click.IntRange(1, 500), default=100, help="At most this many rows (1-500).")
@out.json_option
def triggers_fires(trigger_id: str, limit: int, as_json: bool) -> None:
    """The trigger's fires ledger, newest first: outcome '-' means the target was started;
    validation_failed or payload_too_large that it could not be (see 'triggers evaluate')."""
    service = _service()
    trigger_id = service.get(trigger_id).id
    data = [fire_to_json(f) for f in service.fires(trigger_id=trigger_id, limit=limit)]
    columns = ("source_exec_id", "fired_at", "outcome", "target_execution_id")
    out.output(data, as_json, lambda d: out.table([[r[c] for c in columns] for r in d], columns))


@triggers_cli.command("evaluate")
@click.argument("execution_id")
@out.json_option
def triggers_evaluate(execution_id: str, as_json: bool) -> None:
    """Evaluate the triggers of an ended execution again (pairs already decided stay as they are):
    how a fire lost to an invalid condition is recovered once the trigger is fixed."""
    events = _service().evaluate(execution_id)
    data = [
        {
            "trigger_id": e.trigger_id,
            "outcome": e.outcome.value,
            "reason": e.reason.value if e.reason else None,
            "target_execution_id": e.target_execution_id,
        }
        for e in events
    ]
    columns = ("trigger_id", "outcome", "reason", "target_execution_id")
    out.output(data, as_json, lambda d: out.table([[r[c] for c in columns] for r in d], columns))
