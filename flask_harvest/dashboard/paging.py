"""What a dashboard list page renders: its rows and the cursor of the next page.

The cursors and the keyset walks behind them belong to the services the pages call
(``WebhookOperations``, ``WorkflowService``, ``TriggerService``), which the admin APIs share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
__all__ = ["PAGE_SIZE", "Page"]
#: Rows on one dashboard list page.
PAGE_SIZE = 50


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list and the cursor of the next (``None`` on the last page)."""

    items: list[T]
    next_cursor: str | None
