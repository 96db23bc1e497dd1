"""Heartbeat: one thread per process renews the leases of every run in progress."""

from __future__ import annotations

import threading
from collections import Counter

from flask_harvest._threads import Heartbeat

WAIT = 10.0


class Renewals:
    """A renew function that records its calls and lets the test decide each answer."""

    def __init__(self, passes: int) -> None:
        self.calls: Counter[str] = Counter()
        self.threads: set[int] = set()
        self.lost: set[str] = set()
        self.failing: set[str] = set()
        self.lock = threading.Lock()
        self.passes = passes
        self.done = threading.Event()

    def __call__(self, key: str, token: str) -> bool:
        with self.lock:
            self.calls[key] += 1
            self.threads.add(threading.get_ident())
            if all(self.calls[k] >= self.passes for k in ("a", "b")):
                self.done.set()
        if key in self.failing:
            raise RuntimeError("the database went away")
        return key not in self.lost


def heartbeat_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def test_one_thread_renews_every_run_in_progress() -> None:
    renew = Renewals(passes=3)
    beat = Heartbeat(renew, 0.01, name="heartbeat-of-two")
    with beat.keeping("a", "t1"), beat.keeping("b", "t2"):
        assert renew.done.wait(WAIT)
        assert len(heartbeat_threads("heartbeat-of-two")) == 1
    assert len(renew.threads) == 1


def test_a_run_is_no_longer_renewed_once_its_block_ends_or_its_lease_is_lost() -> None:
    renew = Renewals(passes=2)
    renew.lost.add("b")
    beat = Heartbeat(renew, 0.01, name="test-heartbeat")
    with beat.keeping("a", "t1"), beat.keeping("b", "t2"):
        with beat.keeping("c", "t3"):
            pass
        calls_of_c = renew.calls["c"]
        for _ in range(1000):  # wait for a few passes after b was found lost
            if renew.calls["a"] >= renew.calls["b"] + 3:
                break
            threading.Event().wait(0.01)
        assert renew.calls["b"] == 1, "a lost lease is renewed once, then forgotten"
        assert renew.calls["c"] == calls_of_c
    assert renew.calls["a"] >= 4


def test_a_failing_renewal_is_tried_again_and_does_not_stop_the_others() -> None:
    renew = Renewals(passes=3)
    renew.failing.add("b")
    beat = Heartbeat(renew, 0.01, name="test-heartbeat")
    with beat.keeping("a", "t1"), beat.keeping("b", "t2"):
        assert renew.done.wait(WAIT)


def test_the_thread_ends_when_no_run_is_in_progress_and_starts_again_for_the_next() -> None:
    renew = Renewals(passes=1)
    beat = Heartbeat(renew, 0.01, name="heartbeat-that-ends")
    with beat.keeping("a", "t1"):
        pass
    for _ in range(1000):
        if not heartbeat_threads("heartbeat-that-ends"):
            break
        threading.Event().wait(0.01)
    assert not heartbeat_threads("heartbeat-that-ends")
    renew.done.clear()
    with beat.keeping("a", "t1"), beat.keeping("b", "t2"):
        assert renew.done.wait(WAIT)
