"""Write pip constraints that pin every declared dependency to its lowest allowed version.

    python .ci/pins.py OUT [EXTRA ...]

reads ``install_requires`` and the extras named (``test`` by default) from ``setup.cfg`` and
writes ``OUT`` with one ``name==lower`` line per requirement that has a ``>=`` bound, so that

    pip install -c OUT -e ".[test]"

installs the oldest release of each dependency that setup.cfg claims to support (what pip then
picks for the dependencies of those dependencies is the newest they allow). ``make lowest`` and
``tox -e lowest`` run the test suite on that install, so a lower bound cannot claim more than
works. A requirement without a lower bound is an error: every dependency must say what it needs.

Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import configparser
import re
import sys
from pathlib import Path

SETUP_CFG = Path(__file__).resolve().parent.parent / "setup.cfg"
# name, optional [extras], then the specifiers up to an optional ; marker.
_REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?P<specs>[^;]*)")
_LOWER = re.compile(r"^\s*>=\s*(?P<version>[^\s,]+)\s*$")


def requirements(setup_cfg: Path, extras: list[str]) -> list[str]:
    """Return the requirement lines of ``install_requires`` and of ``extras``, in order."""
    config = configparser.ConfigParser()
    config.read(setup_cfg, encoding="utf-8")
    lines = config.get("options", "install_requires").splitlines()
    for extra in extras:
        # ConfigParser's interpolation expands %(production)s inside the extras section.
        lines += config.get("options.extras_require", extra).splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def lower_bounds(lines: list[str]) -> dict[str, str]:
    """Return ``{name: lowest version}`` for each requirement; fail on one without a ``>=`` bound."""
    pins: dict[str, str] = {}
    for line in lines:
        match = _REQUIREMENT.match(line)
        if match is None:
            raise SystemExit(f"Error: cannot read the requirement {line!r} in setup.cfg")
        name = match["name"].lower().replace("_", "-")
        lowers = [m["version"] for spec in match["specs"].split(",") if (m := _LOWER.match(spec))]
        if len(lowers) != 1:
            raise SystemExit(f"Error: {line!r} in setup.cfg needs exactly one '>=' lower bound")
        if pins.get(name, lowers[0]) != lowers[0]:
            raise SystemExit(f"Error: {name} has two lower bounds in setup.cfg: {pins[name]}, {lowers[0]}")
        pins[name] = lowers[0]
    return pins


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out, extras = Path(argv[0]), argv[1:] or ["test"]
    pins = lower_bounds(requirements(SETUP_CFG, extras))
    header = f"# The lowest versions setup.cfg allows (install_requires + {', '.join(extras)}): .ci/pins.py\n"
    out.write_text(header + "".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
    print(f"{out}: {len(pins)} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
