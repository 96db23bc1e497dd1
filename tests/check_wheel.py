"""Check a built wheel the way a user meets it: installed in a fresh venv, used outside the tree.

``tox -e wheel`` builds the sdist and the wheel and runs this script on them::

    python tests/check_wheel.py DIST_DIR

It checks the sdist's and the wheel's contents and the metadata, creates a virtualenv in a
temporary directory, installs the wheel there (its dependencies come from the package index),
copies ``examples/quickstart.py`` and ``examples/receiver_app.py`` to another temporary directory
and runs them there, and checks that ``flask --app <a tiny app> harvest --help`` (and the help of
each command group) lists every command. Prints ``wheel check OK`` and exits 0, or names what
failed. Not collected by pytest (no ``test_`` prefix): it needs the network and a built wheel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The commands the CLI must offer (more may exist: every registered one is checked too).
EXPECTED = {
    "": {"worker", "sweep", "init-db", "purge", "stats", "subscriptions", "dlq", "deliveries", "outbox"},
    "subscriptions": {"add", "list", "show", "enable", "disable", "rotate-secret", "remove"},
    "dlq": {"list", "replay"},
    "deliveries": {"show"},
    "outbox": {"relay", "purge"},
}
#: The examples run from outside the tree, and the last line each prints when it worked.
EXAMPLES = [("quickstart.py", "quickstart OK"), ("receiver_app.py", "receiver example OK")]
TINY_APP = '''
"""The smallest app with flask-harvest registered, for `flask --app harvest_app harvest --help`."""

from flask import Flask

from flask_harvest import InMemoryOutboundWebhookHandler, OutboundWebhookPlugin


def create_app():
    app = Flask(__name__)
    OutboundWebhookPlugin(InMemoryOutboundWebhookHandler(), app)
    return app
'''


#: The dashboard's templates and stylesheet: package data that both archives must hold.
DASHBOARD_ASSETS = sorted(
    path.relative_to(ROOT).as_posix()
    for folder in ("templates", "static")
    for path in (ROOT / "flask_harvest" / "dashboard" / folder).rglob("*")
    if path.is_file()
)


class CheckFailed(Exception):
    pass


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise CheckFailed(f"{' '.join(command)} exited {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done.stdout


def check_contents(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(info).decode())
        entry_points = archive.read(info.replace("METADATA", "entry_points.txt")).decode()
    strays = [n for n in names if not n.startswith(("flask_harvest/", "flask_harvest-"))]
    if strays:
        raise CheckFailed(f"the wheel holds files outside the package: {strays[:5]}")
    for needed in (
        "flask_harvest/py.typed",
        "flask_harvest/receiver.py",
        "flask_harvest/testing.py",
        *DASHBOARD_ASSETS,
    ):
        if needed not in names:
            raise CheckFailed(f"the wheel lacks {needed}")
    if metadata["Description-Content-Type"] != "text/markdown" or "# flask-harvest" not in (
        metadata.get_payload() or ""
    ):
        raise CheckFailed("the long description is not the README in Markdown")
    if not metadata.get_all("Classifier") or not metadata.get_all("Project-URL"):
        raise CheckFailed("the metadata lacks classifiers or project URLs")
    if "flask_harvest = flask_harvest.pytest_plugin" not in entry_points:
        raise CheckFailed("the pytest11 entry point is missing")
    print(f"{wheel.name}: {len(names)} files, metadata and entry points in place")


def check_sdist(dist: Path) -> None:
    [sdist] = sorted(dist.glob("flask_harvest-*.tar.gz"))
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    needed = {
        "README.md",
        "CHANGELOG.md",
        "setup.cfg",
        "flask_harvest/py.typed",
        "examples/quickstart.py",
        *DASHBOARD_ASSETS,
    }
    if not needed <= names:
        raise CheckFailed(f"the sdist lacks {sorted(needed - names)}")
    compiled = [n for n in names if n.endswith(".pyc")]
    if compiled:
        raise CheckFailed(f"the sdist holds compiled files: {compiled[:3]}")
    print(f"{sdist.name}: {len(names)} files, README, changelog and py.typed in place")


def listed_commands(help_text: str) -> set[str]:
    """The command names in the ``Commands:`` section of a click help text."""
    section = help_text.split("Commands:", 1)[1] if "Commands:" in help_text else ""
    return set(re.findall(r"^  (\S+)", section, re.M))


def main() -> int:
    dist = Path(sys.argv[1])
    wheels = sorted(dist.glob("flask_harvest-*.whl"))
    if len(wheels) != 1:
        print(f"expected one flask_harvest wheel in {dist}, found {wheels}", file=sys.stderr)
        return 1
    wheel = wheels[0].resolve()
    # Nothing from this checkout or the calling venv may leak into the checks.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    with tempfile.TemporaryDirectory(prefix="harvest-wheel-") as temp:
        base = Path(temp)
        venv, work = base / "venv", base / "work"
        work.mkdir()
        python, flask = str(venv / "bin" / "python"), str(venv / "bin" / "flask")
        try:
            check_sdist(dist)
            check_contents(wheel)
            run([sys.executable, "-m", "venv", str(venv)], base, env)
            run([python, "-m", "pip", "install", "--quiet", str(wheel)], base, env, timeout=600)
            location = run([python, "-c", "import flask_harvest; print(flask_harvest.__file__)"], work, env)
            if not Path(location.strip()).is_relative_to(venv) or ROOT in Path(location.strip()).parents:
                raise CheckFailed(f"flask_harvest was imported from {location.strip()}, not the fresh venv")
            print(f"installed in a fresh venv: {location.strip()}")

            for example, last_line in (
                ("quickstart.py", "quickstart OK"),
                ("receiver_app.py", "receiver example OK"),
            ):
                shutil.copy(ROOT / "examples" / example, work / example)
                out = run([python, example], work, env, timeout=120)
                if out.rstrip().splitlines()[-1] != last_line:
                    raise CheckFailed(f"{example} did not end with {last_line!r}:\n{out}")
                print(f"{example} ran from {work}: {last_line}")

            (work / "harvest_app.py").write_text(textwrap.dedent(TINY_APP))
            registered = run(
                [python, "-c", "from flask_harvest.cli import harvest_cli as c; print(' '.join(c.commands))"],
                work,
                env,
            ).split()
            for group, expected in EXPECTED.items():
                command = [
                    flask,
                    "--app",
                    "harvest_app:create_app",
                    "harvest",
                    *([group] if group else []),
                    "--help",
                ]
                listed = listed_commands(run(command, work, env))
                wanted = expected | (set(registered) if not group else set())
                if not wanted <= listed:
                    raise CheckFailed(f"`{' '.join(command[3:])}` does not list {sorted(wanted - listed)}")
                print(f"flask harvest {group + ' ' if group else ''}--help lists {', '.join(sorted(listed))}")
        except (CheckFailed, subprocess.TimeoutExpired) as exc:
            print(f"wheel check FAILED: {exc}", file=sys.stderr)
            return 1
    print("wheel check OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
