"""``flask harvest event-types ...``: the event catalog, the event types the app sends."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import click

from ..webhooks.catalog import render_rst
from . import _common as out
from ._common import HarvestGroup as _Group
from ._common import operations as _ops

event_types_cli = _Group("event-types", help="The event catalog: the event types the app sends.")


def _rows(types: list[Mapping[str, Any]]) -> str:
    return out.table(
        [(t["name"], t["version"], t["description"]) for t in types],
        ("name", "version", "description"),
        empty="no event types (register them with harvest.event_type)",
    )


def _one(data: Mapping[str, Any]) -> str:
    head = out.fields(data, ("name", "version", "description"))
    schema = json.dumps(data["schema"], indent=2, ensure_ascii=False)
    example = json.dumps(data["example"], indent=2, ensure_ascii=False)
    return f"{head}\nschema:\n{schema}\nexample:\n{example}"


@event_types_cli.command("list")
@out.json_option
def event_types_list(as_json: bool) -> None:
    """Every event type, by name (--json: with its schema and example)."""
    out.output([t.to_dict() for t in _ops().event_types()], as_json, _rows)


@event_types_cli.command("show")
@click.argument("name")
@out.json_option
def event_types_show(name: str, as_json: bool) -> None:
    """One event type: its description, version, schema and example."""
    out.output(_ops().event_type(name).to_dict(), as_json, _one)


@event_types_cli.command("rst")
@click.option("--title", default="Event types", show_default=True, help="The page's title.")
def event_types_rst(title: str) -> None:
    """The catalog as a reStructuredText page, to write into your Sphinx docs."""
    click.echo(render_rst(_ops().event_types(), title=title), nl=False)
