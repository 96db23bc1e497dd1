"""The triggers' guard conditions: the condition language of :mod:`flask_harvest.conditions`.

Kept so that ``from flask_harvest.triggers.conditions import Eq`` goes on working; the language
moved to :mod:`flask_harvest.conditions` when webhook subscriptions began filtering with it.
"""

from __future__ import annotations

from ..conditions import *  # noqa: F403 - this module is the old name of that one
from ..conditions import __all__ as __all__
