"""What users read shows the one extension, :class:`flask_harvest.Harvest`: the README, the docs
pages and the examples name no extension object that no longer exists, and the store-first
compatibility name appears only where the compatibility names are listed."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Names of objects and modules that are gone (the changelog may still name them).
REMOVED = ("HarvestWorkflows", "HarvestTriggers", "workflow_extension", "trigger_extension")
#: The one page that lists the compatibility names.
COMPATIBILITY_PAGE = ROOT / "docs" / "api.rst"


def user_facing_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "bench" / "README.md"]
    files += sorted((ROOT / "docs").glob("*.rst"))
    files += sorted((ROOT / "examples").rglob("*.py"))
    files += sorted((ROOT / "examples").rglob("*.md"))
    return files


def test_no_page_or_example_names_a_removed_extension() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in user_facing_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(name in line for name in REMOVED)
    ]
    assert found == []


def test_the_store_first_name_is_shown_only_among_the_compatibility_names() -> None:
    pages = [
        str(path.relative_to(ROOT))
        for path in user_facing_files()
        if "OutboundWebhookPlugin" in path.read_text(encoding="utf-8")
    ]
    assert pages == [str(COMPATIBILITY_PAGE.relative_to(ROOT))]
    text = COMPATIBILITY_PAGE.read_text(encoding="utf-8")
    section = text[text.index("Compatibility names") :]
    for alias in (
        "OutboundWebhookPlugin",
        "OutboundWebhookStore",
        "InMemoryOutboundWebhookStore",
        "WebhookOutboundManager",
    ):
        assert alias in section
