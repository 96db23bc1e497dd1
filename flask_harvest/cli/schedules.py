"""``flask harvest workflows schedules [pause|resume NAME]``: the workflows' cron schedules, thin
over :class:`~flask_harvest.workflows.schedules.WorkflowSchedules`.

The same conventions as the rest of ``flask harvest``: text for people, ``--json`` for scripts
(the HTTP API's shape, :func:`~flask_harvest.workflows.schedules.schedule_to_dict`), a failure as
one ``Error: ...`` line with exit status 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click
from flask import current_app
from flask.cli import ScriptInfo

from .._app import get_engine, workflow_service
from ..errors import ConfigurationError, HarvestError
from ..workflows.schedules import WorkflowSchedules, schedule_to_dict
from . import _common as out

__all__ = ["schedules_cli"]


def _schedules() -> WorkflowSchedules:
    workflow_service()  # says so in one line on an app without workflows
    schedules = get_engine().schedules
    if schedules is None:  # pragma: no cover - workflows always come with their schedules
        raise ConfigurationError("this app runs no workflow schedules")
    return schedules


def _rows(data: Mapping[str, Any]) -> str:
    rows = [
        (
            s["name"],
            s["cron"],
            "paused" if s["paused"] else ("active" if s["declared"] else "not declared"),
            s["last_tick_at"],
            s["next_tick_at"],
        )
        for s in data["schedules"]
    ]
    columns = ("name", "cron", "status", "last tick", "next tick")
    return out.table(rows, columns, empty="no workflow is scheduled")


def _one(data: Mapping[str, Any]) -> str:
    state = "paused" if data["paused"] else "active"
    return f"schedule {data['name']} ({data['cron']}) is {state}; next tick: {data['next_tick_at'] or '-'}"


@click.group("schedules", cls=out.HarvestGroup, invoke_without_command=True)
@out.json_option
@click.pass_context
def schedules_cli(ctx: click.Context, as_json: bool) -> None:
    """The workflows' cron schedules: name, cron, paused, last tick and next tick (UTC);
    pause or resume one."""
    if ctx.invoked_subcommand is not None:
        return  # the subcommand loads the app itself (its --help must build none)
    if not current_app:
        ctx.with_resource(ctx.ensure_object(ScriptInfo).load_app().app_context())
    try:
        data = {"schedules": [schedule_to_dict(v) for v in _schedules().list_schedules()]}
    except HarvestError as exc:
        raise click.ClickException(out.one_line(exc)) from exc
    out.output(data, as_json, _rows)


@schedules_cli.command("pause")
@click.argument("name")
@out.json_option
def schedules_pause(name: str, as_json: bool) -> None:
    """Pause the schedule NAME: no tick starts a run until it is resumed."""
    out.output(schedule_to_dict(_schedules().pause(name)), as_json, _one)


@schedules_cli.command("resume")
@click.argument("name")
@out.json_option
def schedules_resume(name: str, as_json: bool) -> None:
    """Resume the schedule NAME from the next tick; ticks that fell while it was paused are not run."""
    out.output(schedule_to_dict(_schedules().resume(name)), as_json, _one)
