"""``python -m bench.compare RUN.json RUN.json ...``: the runs' figures side by side, as Markdown.

A goal counts as met only when it is met in every run given (a figure missing from a run is "not
in every run"); the bench README's table of its latest full runs is this command's output.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._report import fmt


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "(not run)"
    text = fmt(row["value"], row["unit"])
    if row.get("ratio") is not None:
        text += f" ({row['ratio']:.2f}x)"
    if row.get("of_ceiling") is not None:
        text += f", {row['of_ceiling']:.2f} of the Session loop"
    return text + (" **no**" if row["met"] is False else "")


def _met(rows: Sequence[dict[str, Any] | None]) -> str:
    verdicts = [None if row is None else row["met"] for row in rows]
    if all(verdict is None for verdict in verdicts):
        return "-"
    if False in verdicts:
        return "**no**"
    return "yes, in every run" if all(verdicts) else "not in every run"


def compare(runs: Sequence[dict[str, Any]], labels: Sequence[str]) -> str:
    """A Markdown table with one line per figure (in the first run's order) and a column per run.

    Figures are matched by scenario and position, not by text: a figure's text may carry the
    run's own counts (S15's requests)."""
    keys: list[tuple[str, int]] = []
    by_run: list[dict[tuple[str, int], dict[str, Any]]] = []
    shown: dict[tuple[str, int], dict[str, Any]] = {}
    for run in runs:
        rows: dict[tuple[str, int], dict[str, Any]] = {}
        seen: Counter[str] = Counter()  # rows so far per scenario: the next one's position
        for row in run["rows"]:
            key = (row["scenario"], seen[row["scenario"]])
            seen[row["scenario"]] += 1
            rows[key] = row
            if key not in shown:
                keys.append(key)
                shown[key] = row
        by_run.append(rows)
    lines = [
        "| id | figure | goal | " + " | ".join(labels) + " | met? |",
        "| --- | --- | --- | " + " | ".join("---" for _ in labels) + " | --- |",
    ]
    for key in keys:
        cells = [rows.get(key) for rows in by_run]
        lines.append(
            f"| {key[0]} | {shown[key]['figure']} | {shown[key]['goal']} | "
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
    labels = [
        f"{run['date'][:16].replace('T', ' ')} UTC" + (" (quick)" if run.get("quick") else "") for run in runs
    ]
    print(compare(runs, labels))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
