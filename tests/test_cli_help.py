"""``flask harvest ... --help`` through Flask's own command line: help builds no app.

Flask finds the ``harvest`` group as a ``flask.commands`` entry point (declared in setup.cfg), so
the help of every command is shown without importing the app, and a database that is down does
not matter; a command still loads the app when it runs.
"""

from __future__ import annotations

import configparser
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from flask import Flask
from flask.cli import FlaskGroup
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import InMemoryOutboundWebhookHandler, OutboundWebhookPlugin
from flask_harvest.cli import harvest_cli
from flask_harvest.errors import StoreError

ROOT = Path(__file__).resolve().parent.parent
#: Nothing listens on the discard port of the loopback: every connection is refused.
UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:9/harvest"


def declared_flask_commands() -> list[EntryPoint]:
    """The ``flask.commands`` entry points setup.cfg declares: what an install gives Flask."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config.get("options.entry_points", "flask.commands", fallback="").strip().splitlines()
    return [
        EntryPoint(name.strip(), value.strip(), "flask.commands")
        for name, _, value in (line.partition("=") for line in lines)
    ]


def flask_cli(create_app: Callable[[], Flask]) -> FlaskGroup:
    """The ``flask`` command as Flask builds it, with this checkout's plugin commands.

    The installed metadata may come from another checkout (an editable install made before the
    entry point existed), so the plugins are added from setup.cfg the way Flask adds them.
    """
    group = FlaskGroup(create_app=create_app)
    for entry_point in declared_flask_commands():
        group.add_command(entry_point.load(), entry_point.name)
    return group


def unreachable_app() -> Flask:
    """An app on a database that is down: the SQL store creates its tables in ``init_app``, so
    building it fails."""
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = UNREACHABLE
    OutboundWebhookPlugin.sql(SQLAlchemy(app), app)
    return app


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every group and command under ``group``, by each name it is registered under."""
    yield prefix
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from command_paths(command, (*prefix, name))
        else:
            yield (*prefix, name)


def test_the_unreachable_app_cannot_be_built() -> None:
    # The premise of the help test: loading this app for --help would fail.
    with pytest.raises(StoreError, match="Connection refused"):
        unreachable_app()


def test_harvest_is_a_flask_commands_entry_point() -> None:
    assert [(e.name, e.load()) for e in declared_flask_commands()] == [("harvest", harvest_cli)]


@pytest.mark.parametrize("path", list(command_paths(harvest_cli)), ids=" ".join)
def test_help_of_every_command_builds_no_app(path: tuple[str, ...]) -> None:
    built: list[Flask] = []

    def create_app() -> Flask:
        built.append(app := unreachable_app())
        return app

    result = CliRunner().invoke(flask_cli(create_app), ["harvest", *path, "--help"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: "), result.output
    assert built == []


def test_a_command_found_through_the_entry_point_loads_the_app_when_it_runs() -> None:
    built: list[Flask] = []

    def create_app() -> Flask:
        app = Flask(__name__)
        OutboundWebhookPlugin(InMemoryOutboundWebhookHandler(), app)
        built.append(app)
        return app

    result = CliRunner().invoke(flask_cli(create_app), ["harvest", "stats", "--json"])
    assert result.exit_code == 0, result.output
    assert '"overall"' in result.output
    assert len(built) == 1
