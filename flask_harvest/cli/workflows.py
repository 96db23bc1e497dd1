"""``flask harvest workflows ...``: operator commands, thin over
:class:`~flask_harvest.workflows.service.WorkflowService`.

The same conventions as the rest of ``flask harvest`` (:mod:`flask_harvest.cli`): text for people,
``--json`` for scripts, and a failure as one ``Error: ...`` line with exit status 1. The commands
print what the HTTP API answers: :func:`~flask_harvest.workflows.service.execution_to_dict` and
:func:`~flask_harvest.workflows.service.step_to_dict` are the one source of both shapes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import click

from .._app import workflow_service
from ..errors import InvalidFieldError
from ..workflows.models import ExecutionState, ForkMode, IdReusePolicy, JsonValue
from ..workflows.queue_views import queue_views
from ..workflows.schemas import MAX_PAGE
from ..workflows.service import WorkflowService, execution_to_dict, step_to_dict
from . import _common as out

__all__ = ["workflows_cli"]

workflows_cli = out.HarvestGroup(
    "workflows", help="Durable workflow executions: start, inspect, cancel, terminate, fork."
)

EXECUTION_FIELDS = (
    "execution_id",
    "workflow_name",
    "workflow_id",
    "state",
    "created_at",
    "started_at",
    "completed_at",
    "deadline",
    "attempt",
    "recovery_count",
    "charged_recoveries",
    "isolation",
    "cancel_requested",
    "trigger_depth",
    "forked_from",
    "fork_from_step",
    "fork_mode",
    "continued_from",
    "continued_to",
    "queue_name",
    "concurrency_key",
    "priority",
    "parent_execution_id",
    "parent_close_policy",
    "input",
    "output",
    "error",
)


def _service() -> WorkflowService:
    return workflow_service()


def _json_argument(text: str | None, field: str) -> JsonValue:
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidFieldError(field, f"is not JSON ({exc})") from None


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _execution(data: Mapping[str, Any]) -> str:
    shown = {k: _compact(v) if k in ("input", "output") else v for k, v in data.items()}
    return out.fields(shown, EXECUTION_FIELDS)


def _execution_rows(data: Mapping[str, Any]) -> str:
    rows = [
        (
            e["execution_id"],
            e["workflow_name"],
            e["workflow_id"],
            e["state"],
            e["created_at"],
            e["completed_at"],
        )
        for e in data["executions"]
    ]
    columns = ("execution_id", "workflow", "workflow_id", "state", "created", "completed")
    text = out.table(rows, columns, empty="no matching workflow executions")
    if data["next_cursor"]:
        text += f"\nmore: --cursor {data['next_cursor']}"
    return text


def _step_rows(data: Mapping[str, Any]) -> str:
    rows = [
        (s["seq"], s["name"], "failed" if "error" in s else "ok", s.get("error", _compact(s.get("output"))))
        for s in data["steps"]
    ]
    return out.table(rows, ("seq", "step", "outcome", "result / error"), empty="no step checkpoints yet")


def _started(data: Mapping[str, Any]) -> str:
    verb = "started" if data["created"] else "already open:"
    return (
        f"{verb} {data['workflow_name']} execution {data['execution_id']} "
        f"(workflow_id {data['workflow_id']}, {data['state']})"
    )


@workflows_cli.command("start")
@click.argument("name")
@click.option(
    "--input", "input_text", metavar="JSON", default=None, help="The input, as JSON (default: null)."
)
@click.option(
    "--input-file",
    type=click.File("r", encoding="utf-8"),
    default=None,
    help="Read the input's JSON from this file ('-' for standard input).",
)
@click.option("--workflow-id", default=None, help="Your business key (default: a new UUID).")
@click.option(
    "--id-reuse-policy",
    type=click.Choice([p.value for p in IdReusePolicy]),
    default=IdReusePolicy.ALLOW_DUPLICATE.value,
    show_default=True,
    help="What to do when an earlier run of --workflow-id has ended.",
)
@click.option("--completion-callbacks", metavar="JSON", default=None, help="Completion callbacks, as JSON.")
@click.option("--queue", default=None, help="The workflow queue to run in (default: the workflow's).")
@click.option("--concurrency-key", default=None, help="Runs sharing this key in the queue are limited.")
@click.option("--concurrency-limit", type=int, default=None, help="Running runs per key (default 1).")
@click.option("--priority", type=int, default=None, help="Lower runs first in the queue.")
@out.json_option
def workflows_start(
    name: str,
    input_text: str | None,
    input_file: Any,
    workflow_id: str | None,
    id_reuse_policy: str,
    completion_callbacks: str | None,
    queue: str | None,
    concurrency_key: str | None,
    concurrency_limit: int | None,
    priority: int | None,
    as_json: bool,
) -> None:
    """Start a run of the workflow NAME (or show the open run of --workflow-id)."""
    if input_text is not None and input_file is not None:
        raise click.UsageError("give --input or --input-file, not both")
    if input_file is not None:
        input_text = input_file.read()
    handle, created = _service().start(
        name,
        _json_argument(input_text, "input"),
        workflow_id=workflow_id,
        policy=id_reuse_policy,
        completion_callbacks=_json_argument(completion_callbacks, "completion_callbacks"),
        queue=queue,
        concurrency_key=concurrency_key,
        concurrency_limit=concurrency_limit,
        priority=priority,
    )
    data = {**execution_to_dict(handle.execution(), with_io=False), "created": created}
    out.output(data, as_json, _started)


@workflows_cli.command("list")
@click.option("--name", default=None, help="Only runs of this workflow.")
@click.option(
    "--state",
    type=click.Choice([s.value for s in ExecutionState]),
    default=None,
    help="Only runs in this state.",
)
@click.option(
    "--limit", type=click.IntRange(1, MAX_PAGE), default=50, show_default=True, help="Rows per page."
)
@click.option("--cursor", default=None, help="Continue after a previous page (its 'more:' line).")
@out.json_option
def workflows_list(
    name: str | None, state: str | None, limit: int, cursor: str | None, as_json: bool
) -> None:
    """Workflow executions, newest first."""
    page, next_cursor = _service().list_executions(name=name, state=state, cursor=cursor, limit=limit)
    data = {"executions": [execution_to_dict(e, with_io=False) for e in page], "next_cursor": next_cursor}
    out.output(data, as_json, _execution_rows)


@workflows_cli.command("show")
@click.argument("execution_id")
@out.json_option
def workflows_show(execution_id: str, as_json: bool) -> None:
    """One execution: state, timestamps, input, and output or error."""
    out.output(execution_to_dict(_service().get(execution_id)), as_json, _execution)


@workflows_cli.command("steps")
@click.argument("execution_id")
@out.json_option
def workflows_steps(execution_id: str, as_json: bool) -> None:
    """The execution's step checkpoints, in order."""
    checkpoints = _service().steps(execution_id)
    data = {"execution_id": execution_id, "steps": [step_to_dict(s) for s in checkpoints]}
    out.output(data, as_json, _step_rows)


@workflows_cli.command("chain")
@click.argument("execution_id")
@out.json_option
def workflows_chain(execution_id: str, as_json: bool) -> None:
    """The runs of the execution's continue-as-new chain, first to last (the 1000 most recent)."""
    runs = _service().chain(execution_id)
    data = {"execution_id": execution_id, "executions": [execution_to_dict(e, with_io=False) for e in runs]}
    out.output(data, as_json, _chain_rows)


def _chain_rows(data: Mapping[str, Any]) -> str:
    rows = [
        (e["execution_id"], e["state"], e["created_at"], e["completed_at"], e["continued_to"] or "")
        for e in data["executions"]
    ]
    return out.table(rows, ("execution_id", "state", "created", "completed", "continued as"))


@workflows_cli.command("children")
@click.argument("execution_id")
@click.option(
    "--limit", type=click.IntRange(1, MAX_PAGE), default=50, show_default=True, help="Rows per page."
)
@click.option("--cursor", default=None, help="Continue after a previous page (its 'more:' line).")
@out.json_option
def workflows_children(execution_id: str, limit: int, cursor: str | None, as_json: bool) -> None:
    """The runs the execution started as children, oldest first."""
    page, next_cursor = _service().children(execution_id, cursor=cursor, limit=limit)
    data = {
        "execution_id": execution_id,
        "children": [execution_to_dict(e, with_io=False) for e in page],
        "next_cursor": next_cursor,
    }
    # The same JSON as GET /workflows/<id>/children; the same table as the list.
    out.output(data, as_json, lambda d: _execution_rows({**d, "executions": d["children"]}))


@workflows_cli.command("result")
@click.argument("execution_id")
@click.option("--wait", type=out.Seconds(), default=0.0, help="Seconds to wait for the run to end.")
@click.option(
    "--follow/--no-follow",
    default=True,
    show_default=True,
    help="Follow a continue-as-new chain to its last run (--no-follow: this run only).",
)
@out.json_option
def workflows_result(execution_id: str, wait: float, follow: bool, as_json: bool) -> None:
    """Print the run's result; exit status 1 if it ended otherwise than Completed, or is still open."""
    execution = _service().wait(execution_id, wait, follow=follow)
    data: dict[str, Any] = {
        "execution_id": execution.execution_id,
        "workflow_id": execution.workflow_id,
        "state": execution.state.value,
    }
    if execution.state is ExecutionState.COMPLETED:
        data["result"] = execution.output
        out.output(data, as_json, lambda d: json.dumps(d["result"], indent=2, ensure_ascii=False))
        return
    if execution.state is ExecutionState.CONTINUED_AS_NEW:
        data["continued_to"] = execution.continued_to
        reason = (
            f"execution {execution.execution_id} continued as another run, {execution.continued_to}; "
            "drop --no-follow for the workflow's outcome"
        )
    elif execution.terminal:
        data["error"] = execution.error
        reason = f"execution {execution.execution_id} ended {execution.state.value}: {execution.error}"
    else:
        reason = (
            f"execution {execution.execution_id} is still {execution.state.value}; wait longer with --wait"
        )
    if as_json:
        out.output(data, as_json, str)
    raise click.ClickException(out.cell(reason, width=500))


@workflows_cli.command("cancel")
@click.argument("execution_id")
@click.option("--reason", default=None, help="Why; recorded as the run's error.")
@out.yes_option
@out.json_option
def workflows_cancel(execution_id: str, reason: str | None, yes: bool, as_json: bool) -> None:
    """Cancel cooperatively: a pending run ends now, a running one at its next step or sleep.
    Given a run that continued as new, its chain's open run. Asks first (--yes does not)."""
    service = _service()
    current = service.last_run(execution_id)
    if not current.terminal:
        out.confirm(
            f"Cancel {current.workflow_name} execution {current.execution_id} ({current.state.value})?", yes
        )
    execution = service.cancel(execution_id, reason)
    out.output(execution_to_dict(execution), as_json, _cancelled)


def _cancelled(data: Mapping[str, Any]) -> str:
    if data["state"] == ExecutionState.CANCELLED.value:
        return f"execution {data['execution_id']} is Cancelled"
    if data["cancel_requested"]:
        return f"cancel requested: execution {data['execution_id']} ends Cancelled at its next step or sleep"
    return f"execution {data['execution_id']} ended {data['state']} before the cancel"


@workflows_cli.command("terminate")
@click.argument("execution_id")
@click.option("--reason", default=None, help="Why; recorded as the run's error.")
@out.yes_option
@out.json_option
def workflows_terminate(execution_id: str, reason: str | None, yes: bool, as_json: bool) -> None:
    """End the run Terminated at once: its code records nothing more. Given a run that continued
    as new, its chain's open run. Asks first (--yes does not)."""
    service = _service()
    current = service.last_run(execution_id)
    if not current.terminal:
        out.confirm(
            f"Terminate {current.workflow_name} execution {current.execution_id} ({current.state.value})?",
            yes,
        )
    execution = service.terminate(execution_id, reason)
    out.output(
        execution_to_dict(execution),
        as_json,
        lambda d: f"execution {d['execution_id']} is {d['state']}",
    )


@workflows_cli.command("fork")
@click.argument("execution_id")
@click.option(
    "--from-step",
    type=click.IntRange(min=0),
    required=True,
    help="The first position the fork does not copy (0: copy no step).",
)
@click.option(
    "--mode",
    type=click.Choice([m.value for m in ForkMode]),
    default=ForkMode.RECORDED.value,
    show_default=True,
    help="recorded: the source's results, nothing runs, no one is notified; live: the steps run "
    "for real, callbacks and triggers as usual; live_quiet: the steps run, no one is notified.",
)
@out.json_option
def workflows_fork(execution_id: str, from_step: int, mode: str, as_json: bool) -> None:
    """Retry a run from step --from-step: a new run whose earlier steps are the source's results.
    The source is not changed."""
    handle = _service().fork(execution_id, from_step, mode)
    out.output(execution_to_dict(handle.execution(), with_io=False), as_json, _forked)


def _forked(data: Mapping[str, Any]) -> str:
    return (
        f"forked execution {data['forked_from']} from step {data['fork_from_step']} as "
        f"{data['execution_id']} (workflow_id {data['workflow_id']}, mode {data['fork_mode']}, "
        f"{data['state']})"
    )


def _queue_rows(data: Mapping[str, Any]) -> str:
    def limit(value: object) -> object:
        return "-" if value is None else value

    rows = [
        (
            q["name"],
            limit(q["concurrency"]),
            "-" if q["rate_limit"] is None else f"{q['rate_limit'][0]}/{q['rate_limit'][1]:g}s",
            q["running"],
            q["waiting"],
            q["due"],
        )
        for q in data["queues"]
    ]
    columns = ("queue", "concurrency", "rate limit", "running", "waiting", "due")
    return out.table(rows, columns, empty="no workflow queues are declared")


@workflows_cli.command("queues")
@out.json_option
def workflows_queues(as_json: bool) -> None:
    """The workflow queues: their limits, and their running, waiting and due runs."""
    data = {"queues": [view.as_dict() for view in queue_views(_service())]}
    out.output(data, as_json, _queue_rows)
