"""GroupCommit: items handed in by many threads are written in batches, each caller getting its own
result (the delivery runner records attempts' outcomes with it)."""

from __future__ import annotations

import threading

import pytest

from flask_harvest._threads import GroupCommit


def test_a_lone_caller_writes_at_once() -> None:
    batches: list[list[int]] = []

    def write(items: list[int]) -> list[int]:
        batches.append(list(items))
        return [i * 2 for i in items]

    group = GroupCommit(write)
    assert group.submit(3) == 6
    assert group.submit(4) == 8
    assert batches == [[3], [4]]


def test_callers_arriving_during_a_write_share_the_next_batch() -> None:
    batches: list[list[int]] = []
    first_writing, release = threading.Event(), threading.Event()

    def write(items: list[int]) -> list[int]:
        batches.append(list(items))
        if items == [0]:
            first_writing.set()
            assert release.wait(10)
        return [-i for i in items]

    group = GroupCommit(write, limit=3)
    results: dict[int, int] = {}

    def call(item: int) -> None:
        results[item] = group.submit(item)

    leader = threading.Thread(target=call, args=(0,))
    leader.start()
    assert first_writing.wait(10)
    others = [threading.Thread(target=call, args=(n,)) for n in range(1, 6)]
    for thread in others:
        thread.start()
    # Every other caller is waiting before the first write ends.
    while sum(t.is_alive() for t in others) < 5 or len(group._waiting) < 5:
        threading.Event().wait(0.01)
    release.set()
    for thread in [leader, *others]:
        thread.join(10)
    assert results == {n: -n for n in range(6)}
    assert batches[0] == [0]
    assert sorted(n for batch in batches[1:] for n in batch) == [1, 2, 3, 4, 5]
    assert [len(batch) for batch in batches[1:]] == [3, 2]


def test_a_failed_write_raises_to_its_callers_and_the_next_batch_goes_on() -> None:
    def write(items: list[int]) -> list[int]:
        if 13 in items:
            raise ValueError("unlucky")
        return items

    group = GroupCommit(write)
    with pytest.raises(ValueError, match="unlucky"):
        group.submit(13)
    assert group.submit(7) == 7


def test_a_write_must_answer_every_item() -> None:
    group: GroupCommit[int, int] = GroupCommit(lambda items: [])
    with pytest.raises(RuntimeError, match="0 results for 1 items"):
        group.submit(1)


def test_the_writing_thread_may_submit_again_from_inside_its_write() -> None:
    # A write that submits (a terminal hook ending another run, say) must not wait for the batch
    # it is itself writing: its item is written alone, at once.
    written: list[list[int]] = []
    group: GroupCommit[int, int] = GroupCommit(lambda items: write(items))

    def write(items: list[int]) -> list[int]:
        written.append(list(items))
        if items == [1]:
            assert group.submit(2) == 20
        return [item * 10 for item in items]

    done: list[int] = []
    caller = threading.Thread(target=lambda: done.append(group.submit(1)), daemon=True)
    caller.start()
    caller.join(timeout=10)
    assert not caller.is_alive(), "the writer waited for itself"
    assert done == [10]
    assert written == [[1], [2]]
