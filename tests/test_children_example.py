"""The child-runs example runs as documented (``python examples/children_app.py``)."""

from __future__ import annotations

from .test_examples import run_example


def test_children_app() -> None:
    out = run_example("children_app.py")
    assert "batch-1 ended Completed: {'shipped': {'o-1': 'label-o-1', 'o-3': 'label-o-3'}," in out
    assert "'failed': {'o-2': \"StepFailedError: step 'print_label' failed: ValueError: order o-2 has" in out
    assert "  child :0: Completed" in out and "  child :1: Failed" in out and "  child :2: Completed" in out
    assert "restock-1 ended Completed; its children: " in out
    assert "'Terminate': 'Terminated'" in out and "'Abandon': 'Pending'" in out
    assert out.rstrip().endswith("child runs example OK")
