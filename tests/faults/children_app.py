"""Parent and child workflows for the child-run fault tests, on the workflow fault app.

Workers load it with ``--app tests.faults.children_app:create_app``: importing this module adds
these workflows to :mod:`tests.faults.workflow_app`'s extension, whose ``create_app`` it re-exports.
"""

from __future__ import annotations

from typing import Any

from flask_harvest.workflows import ChildFailedError, WorkflowContext

from .workflow_app import create_app, effect, hold, workflows

__all__ = ["create_app"]


@workflows.workflow("kid")
def kid(ctx: WorkflowContext, value: Any) -> Any:
    """Records its run; held until the test releases it when asked; fails when asked."""
    eid = ctx.execution_id
    if value.get("hold"):
        ctx.step("held", hold, value["parent"], "kid")
    ctx.step("work", effect, eid, "kid")
    if value.get("fail"):
        raise ValueError(f"kid {value['n']} failed")
    return value["n"] * 10


@workflows.workflow("brood")
def brood(ctx: WorkflowContext, value: Any) -> Any:
    """Starts ``count`` kids, optionally holds in a step (to kill its worker there), waits for all."""
    eid = ctx.execution_id
    count = value.get("count", 3)
    handles = [
        ctx.start_child(
            "kid",
            {"n": n, "parent": eid, "hold": value.get("hold_kids", False), "fail": n == value.get("fail")},
        )
        for n in range(count)
    ]
    if value.get("hold"):
        ctx.step("between", hold, eid, "between")
    results: list[Any] = []
    for handle in handles:
        try:
            results.append(handle.result())
        except ChildFailedError as exc:
            results.append(f"{exc.state}: {exc.error}")
    return results
