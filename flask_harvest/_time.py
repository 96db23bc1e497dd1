"""The one clock: the current time as the stores, the sweeper and the job seam compare it.

Pure: no Flask, SQL or network. Everything that stamps or compares a time takes it from here (or
from a ``clock`` argument defaulting to it), so a naive or local time never meets an aware one.
"""

from __future__ import annotations

from datetime import datetime, timezone

__all__ = ["utcnow"]


def utcnow() -> datetime:
    """Return the current time as an aware UTC datetime."""
    return datetime.now(timezone.utc)
