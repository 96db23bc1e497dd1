"""The documentation build: it refuses to run without Graphviz's ``dot`` rather than publishing the
architecture page without its diagrams (sphinx.ext.graphviz alone only warns)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Without the docs extra (``make lowest`` leaves this file out; ``make test`` installs it).
pytest.importorskip("sphinx", reason="the docs extra (sphinx) is not installed")

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_docs_build_stops_with_a_clear_error_when_dot_is_missing(tmp_path: Path) -> None:
    missing = tmp_path / "no-graphviz" / "dot"
    html = tmp_path / "html"
    # No -W: the check must stop a plain build too, where a warning would pass unnoticed.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-q",
            "-b",
            "html",
            "-d",
            str(tmp_path / "doctrees"),
            "-D",
            f"graphviz_dot={missing}",
            str(DOCS),
            str(html),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,  # a guard against a hang, not a measure: the check stops the build at start-up
    )
    assert result.returncode != 0, result.stdout + result.stderr
    assert "apt-get install graphviz" in result.stderr
    assert str(missing) in result.stderr
    assert not (html / "architecture.html").exists()
