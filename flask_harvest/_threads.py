"""Background threads that survive ``fork``.

Threads do not cross a ``fork`` (gunicorn ``--preload``, RQ's forking workers): a child that inherits
an executor built by its parent inherits an executor with no threads. :class:`PerProcess` builds its
value lazily, once per process, so every process gets threads of its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """A value (an executor, a started thread) built on first use in each process.

    :param factory: builds the value; called at most once per process.
    """

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._value: T | None = None

    def get(self) -> T:
        """Return this process's value, building it if this process has none yet."""
        with self._lock:
            if self._value is None or self._pid != os.getpid():
                self._value = self._factory()
                self._pid = os.getpid()
            return self._value

    def take(self) -> T | None:
        """Return this process's value if it was built, and forget it (to shut it down)."""
        with self._lock:
            value, self._value = self._value, None
            return value if self._pid == os.getpid() else None
