"""A worker warns at start-up when its database pool cannot serve every workflow run at once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from flask_harvest.config import Settings
from flask_harvest.engine import _check_pool_room


def warnings_for(engine: sa.Engine, concurrency: int, caplog: pytest.LogCaptureFixture) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flask_harvest.engine"):
        _check_pool_room(engine, concurrency)
    return [r.getMessage() for r in caplog.records]


def test_the_default_concurrency_fits_sqlalchemys_default_pool(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")  # 5 + 10 overflow
    assert warnings_for(engine, Settings().workflow_concurrency, caplog) == []


def test_a_pool_too_small_for_the_runs_is_named_with_the_room_it_needs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}", pool_size=4, max_overflow=2)
    (message,) = warnings_for(engine, 12, caplog)
    assert "holds 6 connections" in message and "at least 15" in message
    assert "HARVEST_WORKFLOW_CONCURRENCY" in message
    assert warnings_for(engine, 3, caplog) == []


def test_pools_without_a_limit_are_not_checked(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    unlimited = sa.create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}", poolclass=NullPool)
    overflowing = sa.create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}", pool_size=1, max_overflow=-1)
    assert warnings_for(unlimited, 64, caplog) == []
    assert warnings_for(overflowing, 64, caplog) == []
