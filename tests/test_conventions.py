"""One of each small mechanism across the package."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import flask_harvest
from flask_harvest import _time
from flask_harvest.webhooks import models as webhook_models
from flask_harvest.workflows import models as workflow_models

PACKAGE = Path(flask_harvest.__file__).parent


def _sources() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield str(path.relative_to(PACKAGE)), ast.parse(path.read_text(encoding="utf-8"))


def _calls_of(attribute: str) -> list[str]:
    """The modules that call ``<anything>.<attribute>(...)``."""
    return sorted(
        {
            name
            for name, tree in _sources()
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == attribute
        }
    )


def test_the_package_reads_the_time_of_day_in_one_place() -> None:
    # Every "now" is the same aware UTC clock; a second copy could drift to a naive or local time.
    assert _calls_of("now") == ["_time.py"]
    assert _calls_of("utcnow") == []  # datetime.utcnow() is naive
    defined = [
        name
        for name, tree in _sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "utcnow"
    ]
    assert defined == ["_time.py"]
    # The models modules still offer it, as the same function.
    assert webhook_models.utcnow is workflow_models.utcnow is _time.utcnow
