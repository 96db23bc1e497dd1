"""Completion triggers: start workflow B when workflow A ends in a matching state.

The pure cores are :mod:`.paths`, :mod:`.conditions`, :mod:`.mappings` and :mod:`.definitions`;
:mod:`.store` keeps definitions and the fires ledger in SQL, :mod:`.firing` is the terminal hook
that fires them inside the source's terminal transaction.
"""

from __future__ import annotations

from . import conditions
from .definitions import CompletionTrigger, trigger_from_json, trigger_to_json
from .mappings import InputMapping, Outcome, Passthrough, Projection, Static

__all__ = [
    "CompletionTrigger",
    "InputMapping",
    "Outcome",
    "Passthrough",
    "Projection",
    "Static",
    "conditions",
    "trigger_from_json",
    "trigger_to_json",
]
