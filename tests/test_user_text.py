"""What users read says what the behaviour is: no internal references (the specifications' word
"seed", issue numbers, benchmark scenario ids) in the docs, the README, the examples, the metrics'
help texts or the command line's help. Code comments for developers are not checked."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from flask_harvest.cli import harvest_cli

from .test_cli_help import commands

ROOT = Path(__file__).resolve().parent.parent
INTERNAL = re.compile(r"\b(?i:seeds?|issues? #?\d+)\b|\bS(?:1[0-6]|[1-9])\b")
PAGES = sorted(
    [
        *(ROOT / "docs").glob("*.rst"),
        ROOT / "README.md",
        *(ROOT / "examples").rglob("*.py"),
        *(ROOT / "examples").rglob("*.md"),
    ]
)


def internal_words(text: str) -> list[str]:
    return [m.group(0) for m in INTERNAL.finditer(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_users_read_names_internal_references(page: Path) -> None:
    found = [
        f"{n}: {line.strip()}"
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if internal_words(line)
    ]
    assert found == []


def test_no_metric_help_text_names_internal_references() -> None:
    tree = ast.parse((ROOT / "flask_harvest" / "metrics.py").read_text(encoding="utf-8"))
    texts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert [t for t in texts if internal_words(t)] == []


def test_no_command_help_names_internal_references() -> None:
    runner = CliRunner()
    for path, _ in commands(harvest_cli):
        text = runner.invoke(harvest_cli, [*path, "--help"]).output
        assert internal_words(text) == [], (path, text)
