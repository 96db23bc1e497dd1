"""What a forked child must not take over from its parent.

gunicorn ``--preload`` forks its workers from a master that ran ``init_app`` (which creates the
tables on a pooled connection), and ``multiprocessing`` forks too. A child gets copies of its
parent's objects but none of its threads, and shares its sockets: a pooled database connection
used by two processes interleaves their protocol, and an executor copied without its threads
never runs what it is given. :func:`in_each_child` is the one after-fork hook that resets both
(:class:`~flask_harvest._threads.PerProcess` and :func:`~flask_harvest._sql.new_pool_in_each_child`
use it).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# Weak keys: a hook keeps nothing alive, and goes with its owner.
_hooks: weakref.WeakKeyDictionary[Any, Callable[[Any], None]] = weakref.WeakKeyDictionary()


def in_each_child(owner: T, hook: Callable[[T], None]) -> None:
    """Call ``hook(owner)`` in every process forked from this one from now on, while ``owner``
    lives (one hook per owner: a second call replaces the first)."""
    _hooks[owner] = hook


def _after_fork_in_child() -> None:
    for owner, hook in list(_hooks.items()):
        hook(owner)


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
