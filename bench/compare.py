"""``python -m bench.compare RUN.json RUN.json ...``: the runs' figures side by side, as Markdown.

A goal counts as met only when it is met in every run given; the README's results table is this
command's output for two full runs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._report import _fmt


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "(not run)"
    text = _fmt(row["value"], row["unit"])
    if row.get("ratio") is not None:
        text += f" ({row['ratio']:.2f}x)"
    if row.get("of_ceiling") is not None:
        text += f", {row['of_ceiling']:.2f} of the Session loop"
    return text + (" **no**" if row["met"] is False else "")


def _met(rows: Sequence[dict[str, Any] | None]) -> str:
    verdicts = [None if row is None else row["met"] for row in rows]
    if all(verdict is None for verdict in verdicts):
        return "-"
    return "yes, in every run" if all(verdicts) else "**no**"


def compare(runs: Sequence[dict[str, Any]], labels: Sequence[str]) -> str:
    """A Markdown table with one line per figure (in the first run's order) and a column per run."""
    keys: list[tuple[str, str]] = []
    by_run: list[dict[tuple[str, str], dict[str, Any]]] = []
    goals: dict[tuple[str, str], str] = {}
    for run in runs:
        rows = {(row["scenario"], row["figure"]): row for row in run["rows"]}
        by_run.append(rows)
        for key, row in rows.items():
            if key not in goals:
                keys.append(key)
                goals[key] = row["goal"]
    lines = [
        "| id | figure | goal | " + " | ".join(labels) + " | met? |",
        "| --- | --- | --- | " + " | ".join("---" for _ in labels) + " | --- |",
    ]
    for key in keys:
        cells = [rows.get(key) for rows in by_run]
        lines.append(
            f"| {key[0]} | {key[1]} | {goals[key]} | "
            + " | ".join(_cell(cell) for cell in cells)
            + f" | {_met(cells)} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    paths = [Path(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    runs = [json.loads(path.read_text()) for path in paths]
    labels = [f"{run['date'][:16].replace('T', ' ')} UTC" for run in runs]
    print(compare(runs, labels))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
