"""Forks under real faults: real ``flask harvest worker`` processes (RQ, the group's own Redis,
PostgreSQL) running ``workflow_app.py``'s ``five_steps``, whose steps count their side effects by
execution.

* a live fork from step 2 whose worker is SIGKILLed inside step 3: another worker resumes the fork,
  the copied steps 1 and 2 never run for it, and the source is left as it was;
* a recorded fork runs no side effect at all, whichever worker takes it.
"""

from __future__ import annotations

from collections import Counter

import pytest

from flask_harvest import ExecutionState, ForkMode

from .test_workflow_faults import WorkflowFaults, wf  # noqa: F401 (wf: the fixture)

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

S = ExecutionState


def test_a_live_fork_whose_worker_is_killed_in_step_3_never_runs_its_copied_steps(
    wf: WorkflowFaults,  # noqa: F811
) -> None:
    workers = [wf.worker(), wf.worker()]
    source = wf.start("five_steps", {"n": 3, "hold": True})
    wf.wait_effect(source, "s3:start")
    wf.release(source)
    wf.wait_state([source], S.COMPLETED)
    before = (wf.get(source), wf.steps(source), wf.effects(source))

    fork = wf.service.fork(source, 2, ForkMode.LIVE).execution_id
    wf.wait_effect(fork, "s3:start")
    [pid] = wf.effect_pids(fork, "s3:start")
    [doomed] = [w for w in workers if w.pid == pid]
    doomed.kill()
    wf.release(fork)

    wf.wait_state([fork], S.COMPLETED)
    done = wf.get(fork)
    assert done.output == {"steps": ["s1", "s2", "s3", "s4", "s5"], "n": 3}
    assert done.recovery_count == 1 and done.forked_from == source
    # Steps 1 and 2 are the source's copies: they never ran for the fork.
    assert wf.effects(fork) == Counter({"s3:start": 2, "s3": 1, "s4": 1, "s5": 1})
    assert [s.name for s in wf.steps(fork)] == ["s1", "s2", "s3", "s4", "s5"]
    assert (wf.get(source), wf.steps(source), wf.effects(source)) == before


def test_a_recorded_fork_runs_no_side_effect(wf: WorkflowFaults) -> None:  # noqa: F811
    wf.worker()
    source = wf.start("five_steps", {"n": 4})
    wf.wait_state([source], S.COMPLETED)
    fork = wf.service.fork(source, 1).execution_id
    wf.wait_state([fork], S.COMPLETED)
    assert wf.get(fork).output == wf.get(source).output
    assert wf.effects(fork) == Counter()
    assert [(s.seq, s.name, s.output) for s in wf.steps(fork)] == [
        (s.seq, s.name, s.output) for s in wf.steps(source)
    ]
