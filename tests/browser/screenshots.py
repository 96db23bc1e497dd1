"""Regenerate the dashboard's screenshots (the docs show them) by running the browser tests,
which save one per page they visit::

    python -m tests.browser.screenshots docs/_static/screenshots

Needs what the browser tests need: PostgreSQL, Redis, Debian's chromium and chromedriver, and
npm's axe-core for the accessibility pages (see ``docs/dashboard.rst``). The exit status is
pytest's: a failing test fails the run, and its screenshots are not to be trusted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "docs" / "_static" / "screenshots"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.browser.screenshots", description="Regenerate the dashboard's screenshots."
    )
    parser.add_argument("directory", nargs="?", default=str(DEFAULT), help="where to write the PNG files")
    args = parser.parse_args(argv)
    target = Path(args.directory).resolve()
    target.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ, "HARVEST_SCREENSHOTS_DIR": str(target)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__).parent)]
    return subprocess.call(command, env=environment, cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main())
