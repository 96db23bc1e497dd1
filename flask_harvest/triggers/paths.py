"""Dotted JSON paths: the paths of :mod:`flask_harvest.conditions.paths`, under their old name."""

from __future__ import annotations

from ..conditions.paths import *  # noqa: F403 - this module is the old name of that one
from ..conditions.paths import __all__ as __all__
