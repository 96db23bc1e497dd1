"""Background threads that survive ``fork``.

Threads do not cross a ``fork`` (gunicorn ``--preload``, RQ's forking workers): a child that inherits
an executor built by its parent inherits an executor with no threads. :class:`PerProcess` builds its
value lazily, once per process, so every process gets threads of its own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from ._fork import in_each_child

logger = logging.getLogger(__name__)

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
        # The pid check in get() alone would leave a forked child a lock that a parent thread held
        # at the fork, which nothing in the child ever releases.
        in_each_child(self, PerProcess._forget)

    def _forget(self) -> None:
        """In a forked child: drop the parent's value, and its lock."""
        self._lock = threading.Lock()
        self._pid = None
        self._value = None

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


Item = TypeVar("Item")
R = TypeVar("R")


class GroupCommit(Generic[Item, R]):
    """Writes items handed in by many threads in batches: each caller blocks until its item is
    written and gets its own result back.

    No thread of its own: the first caller to find no batch being written writes the batch (every
    item waiting, up to ``limit``), and keeps writing while more wait; the others wait for it. So
    a lone caller writes at once, and under load one statement and one commit carry many items.

    :param write: writes a batch; returns one result per item, in order. An exception it raises
        is raised to every caller of that batch.
    :param limit: the most items in one batch.
    """

    def __init__(self, write: Callable[[list[Item]], list[R]], *, limit: int = 64) -> None:
        self._write = write
        self._limit = max(1, limit)
        self._cond = threading.Condition()
        self._waiting: list[_Slot[Item, R]] = []
        self._writing = False
        self._writer: int | None = None  # the thread writing a batch

    def submit(self, item: Item) -> R:
        """Write ``item`` (with whatever else waits) and return its result.

        Called again by the thread that is writing a batch (from inside ``write``: a terminal
        hook that ends another run, say), the item is written alone at once: waiting for the
        batch in progress would wait for itself.
        """
        if self._writer == threading.get_ident():
            return self._write_alone(item)
        slot = _Slot[Item, R](item)
        with self._cond:
            self._waiting.append(slot)
            while not slot.done and self._writing:
                self._cond.wait()
            if slot.done:
                return slot.value()
            self._writing = True
            self._writer = threading.get_ident()
        try:
            while not slot.done:
                with self._cond:
                    batch, self._waiting = self._waiting[: self._limit], self._waiting[self._limit :]
                self._write_batch(batch)
        finally:
            with self._cond:
                self._writing = False
                self._writer = None
                self._cond.notify_all()
        return slot.value()

    def _write_alone(self, item: Item) -> R:
        results = self._write([item])
        if len(results) != 1:
            raise RuntimeError(f"a batch write returned {len(results)} results for 1 item")
        return results[0]

    def _write_batch(self, batch: list[_Slot[Item, R]]) -> None:
        try:
            results = self._write([slot.item for slot in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a batch write returned {len(results)} results for {len(batch)} items")
        except BaseException as exc:
            with self._cond:
                for slot in batch:
                    slot.fail(exc)
                self._cond.notify_all()
            return
        with self._cond:
            for slot, result in zip(batch, results, strict=True):
                slot.finish(result)
            self._cond.notify_all()


class _Slot(Generic[Item, R]):
    """One caller's item and, once written, its result or the batch's error."""

    __slots__ = ("done", "error", "item", "result")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.done = False
        self.result: R | None = None
        self.error: BaseException | None = None

    def finish(self, result: R) -> None:
        self.result, self.done = result, True

    def fail(self, error: BaseException) -> None:
        self.error, self.done = error, True

    def value(self) -> R:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


class Heartbeat:
    """One thread that renews the leases of every run in progress in its process.

    A thread per run cost about 0.15 ms of CPU to start and join, a twentieth of a short run's
    whole cost. This thread starts when a run registers and none is running, renews every
    registered lease each ``interval``, and ends once a pass finds nothing registered.

    :param renew: renews one lease; ``False`` when it is lost (ended, or taken over), and the
        run is forgotten (its code finds out at its next boundary). An exception it raises is
        logged, and the lease is tried again at the next pass.
    :param interval: seconds between passes.
    :param name: the thread's name.
    """

    def __init__(self, renew: Callable[[str, str], bool], interval: float, name: str) -> None:
        self._renew = renew
        self._interval = interval
        self._name = name
        self._lock = threading.Lock()
        self._leases: dict[str, str] = {}  # the runs in progress: id -> lease token
        self._beating = False

    @contextmanager
    def keeping(self, key: str, token: str) -> Iterator[None]:
        """Renew ``key``'s lease (held under ``token``) while the block runs."""
        with self._lock:
            self._leases[key] = token
            if not self._beating:
                self._beating = True
                threading.Thread(target=self._beat, name=self._name, daemon=True).start()
        try:
            yield
        finally:
            self._forget(key, token)

    def _forget(self, key: str, token: str) -> None:
        with self._lock:
            if self._leases.get(key) == token:
                del self._leases[key]

    def _beat(self) -> None:
        while True:
            time.sleep(self._interval)
            with self._lock:
                leases = list(self._leases.items())
                if not leases:
                    self._beating = False
                    return
            for key, token in leases:
                with self._lock:
                    if self._leases.get(key) != token:
                        continue  # ended while this pass renewed the others
                try:
                    alive = self._renew(key, token)
                except Exception:
                    logger.warning("renewing the lease of %s failed", key, exc_info=True)
                    continue
                if not alive:
                    self._forget(key, token)
