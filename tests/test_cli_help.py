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


def commands(
    group: click.Group, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every group and command under ``group``, by each name it is registered under."""
    yield prefix, group
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


def test_the_unreachable_app_cannot_be_built() -> None:
    # The premise of the help test: loading this app for --help would fail.
    with pytest.raises(StoreError, match="Connection refused"):
        unreachable_app()


def test_harvest_is_a_flask_commands_entry_point() -> None:
    assert [(e.name, e.load()) for e in declared_flask_commands()] == [("harvest", harvest_cli)]


@pytest.mark.parametrize("path", [path for path, _ in commands(harvest_cli)], ids=" ".join)
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


def help_text(*path: str) -> str:
    result = CliRunner().invoke(flask_cli(unreachable_app), ["harvest", *path, "--help"])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


@pytest.mark.parametrize("path", [(), ("worker",)], ids=["harvest", "worker"])
def test_help_names_every_kind_of_work(path: tuple[str, ...]) -> None:
    text = help_text(*path)
    for kind in ("webhooks", "workflow", "completion callbacks", "completion triggers"):
        assert kind in text, text


#: The commands that delete something or end a run: each asks first, and ``--yes`` skips it.
ASKS_FIRST = {
    ("purge",),
    ("outbox", "purge"),
    ("subscriptions", "remove"),
    ("triggers", "delete"),
    ("workflows", "cancel"),
    ("workflows", "terminate"),
}


def test_exactly_the_commands_that_delete_or_end_something_take_yes() -> None:
    # A new command is classified here: a --yes flag means that it asks first.
    with_yes = {
        path
        for path, command in commands(harvest_cli)
        if any("--yes" in param.opts for param in command.params if isinstance(param, click.Option))
    }
    assert with_yes == ASKS_FIRST
