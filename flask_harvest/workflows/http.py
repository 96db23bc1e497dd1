"""The workflow HTTP API: a blueprint thin over :class:`~flask_harvest.workflows.service.WorkflowService`.

:class:`~flask_harvest.Harvest` registers it under
``HARVEST_WORKFLOW_API_PREFIX`` (``/api/harvest``). Access is the actuator's, from
:mod:`flask_harvest.http.admin`: deny by default, ``Authorization: Bearer <HARVEST_ACTUATOR_TOKEN>``
or the registered authorizer; errors are ``{"error": {"code", "message", "fields"}}``.

Statuses: 201 a run was created, 200 an existing open run of the ``workflow_id`` was returned (the
start collapsed into it); 400 a malformed body (not JSON, not an object); 422 a field or query
parameter with a wrong value, or a refused completion callback target; 404 an unknown workflow name
or execution; 409 the id reuse policy refused, or the execution had already ended (cancel,
terminate); 413 the input is over ``HARVEST_WORKFLOW_MAX_INPUT_BYTES``; 415 a body that is not
JSON; 503 the database is unavailable. Each error carries its status, which
:func:`~flask_harvest.http.admin.error_answer` maps, as on every admin API.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, url_for

from .._app import get_engine, workflow_service
from ..http.admin import MAX_BODY_BYTES, install_admin_api, load_body, load_query, no_such_route
from ._chain import MAX_CHAIN
from .models import Execution, ExecutionState
from .queue_views import queue_views
from .schemas import (
    CancelSchema,
    ChildrenQuerySchema,
    ForkSchema,
    ListQuerySchema,
    ResultQuerySchema,
    StartSchema,
    TerminateSchema,
)
from .service import execution_to_dict, step_to_dict

__all__ = ["workflows_api"]

workflows_api = Blueprint("harvest_workflows", __name__)


def _max_body_bytes() -> int:
    # Room for the largest input the settings allow, written less compactly than we store it.
    return 2 * get_engine().settings.workflow_max_input_bytes + MAX_BODY_BYTES


install_admin_api(workflows_api, realm="harvest-workflows", max_body_bytes=_max_body_bytes)


def _summary(execution: Execution) -> dict[str, Any]:
    return execution_to_dict(execution, with_io=False)


@workflows_api.post("/workflows/<name>/start")
def start(name: str) -> tuple[Response, int]:
    """Start a run of ``name`` (or return the open run of ``workflow_id``)."""
    body = load_body(StartSchema())
    handle, created = workflow_service().start(
        name,
        body["input"],
        workflow_id=body.get("workflow_id"),
        policy=body["id_reuse_policy"],
        completion_callbacks=body["completion_callbacks"],
        queue=body.get("queue"),
        concurrency_key=body.get("concurrency_key"),
        concurrency_limit=body.get("concurrency_limit"),
        priority=body.get("priority"),
    )
    execution = handle.execution()
    response = jsonify({**_summary(execution), "created": created})
    response.headers["Location"] = url_for(".show", execution_id=execution.execution_id)
    return response, 201 if created else 200


@workflows_api.get("/workflows")
def list_executions() -> Response:
    """One page of executions, newest first; ``next_cursor`` (and ``X-Next-Cursor``) continues."""
    query = load_query(ListQuerySchema())
    page, next_cursor = workflow_service().list_executions(
        name=query.get("name"), state=query.get("state"), cursor=query.get("cursor"), limit=query["limit"]
    )
    response = jsonify({"executions": [_summary(e) for e in page], "next_cursor": next_cursor})
    if next_cursor:
        response.headers["X-Next-Cursor"] = next_cursor
    return response


@workflows_api.get("/workflows/<execution_id>")
def show(execution_id: str) -> Response:
    """An execution: its state, timestamps, input, and output or error."""
    return jsonify(execution_to_dict(workflow_service().get(execution_id)))


@workflows_api.get("/workflows/<execution_id>/steps")
def steps(execution_id: str) -> Response:
    """The execution's step checkpoints, in order."""
    checkpoints = workflow_service().steps(execution_id)
    return jsonify({"execution_id": execution_id, "steps": [step_to_dict(s) for s in checkpoints]})


@workflows_api.get("/workflows/<execution_id>/children")
def children(execution_id: str) -> Response:
    """One page of the runs the execution started as children, oldest first; ``next_cursor`` (and
    ``X-Next-Cursor``) continues."""
    query = load_query(ChildrenQuerySchema())
    page, next_cursor = workflow_service().children(
        execution_id, cursor=query.get("cursor"), limit=query["limit"]
    )
    response = jsonify(
        {"execution_id": execution_id, "children": [_summary(e) for e in page], "next_cursor": next_cursor}
    )
    if next_cursor:
        response.headers["X-Next-Cursor"] = next_cursor
    return response


@workflows_api.get("/workflows/<execution_id>/result")
def result(execution_id: str) -> tuple[Response, int]:
    """200 with ``result`` (or ``error``) once ended; 202 while open, after waiting up to ``wait`` s.

    ``follow`` (default true) answers for the last run of a continue-as-new chain; with
    ``follow=false`` a run that continued as new answers ``ContinuedAsNew`` with ``continued_to``.
    """
    query = load_query(ResultQuerySchema())
    cap = get_engine().settings.workflow_result_max_wait_seconds
    execution = workflow_service().wait(execution_id, min(query["wait"], cap), follow=query["follow"])
    body: dict[str, Any] = {
        "execution_id": execution.execution_id,
        "workflow_id": execution.workflow_id,
        "state": execution.state.value,
    }
    if not execution.terminal:
        return jsonify(body), 202
    if execution.state is ExecutionState.COMPLETED:
        body["result"] = execution.output
    elif execution.state is ExecutionState.CONTINUED_AS_NEW:
        body["continued_to"] = execution.continued_to
    else:
        body["error"] = execution.error
    return jsonify(body), 200


@workflows_api.get("/workflows/<execution_id>/chain")
def chain(execution_id: str) -> Response:
    """The runs of the execution's continue-as-new chain, first to last (at most ``max_runs``, the
    most recent; ``complete`` says whether the first run of the chain is among them)."""
    runs = workflow_service().chain(execution_id)
    return jsonify(
        {
            "execution_id": execution_id,
            "runs": [_summary(run) for run in runs],
            "max_runs": MAX_CHAIN,
            "complete": runs[0].continued_from is None,
        }
    )


@workflows_api.post("/workflows/<execution_id>/cancel")
def cancel(execution_id: str) -> tuple[Response, int]:
    """Cancel: 200 when it ended ``Cancelled`` at once, 202 when it ends at its next boundary."""
    # A JSON body ({} will do) is required: a cross-site form cannot send one.
    body = load_body(CancelSchema())
    execution = workflow_service().cancel(execution_id, body.get("reason"))
    return jsonify(execution_to_dict(execution)), 200 if execution.terminal else 202


@workflows_api.post("/workflows/<execution_id>/terminate")
def terminate(execution_id: str) -> Response:
    """Terminate: the execution ends ``Terminated`` now."""
    body = load_body(TerminateSchema())
    return jsonify(execution_to_dict(workflow_service().terminate(execution_id, body.get("reason"))))


@workflows_api.post("/workflows/<execution_id>/fork")
def fork(execution_id: str) -> tuple[Response, int]:
    """Retry from step ``from_step``: 201 with the new run (a fork of this one), ``Location`` on it."""
    body = load_body(ForkSchema())
    handle = workflow_service().fork(execution_id, body["from_step"], body["mode"])
    response = jsonify(execution_to_dict(handle.execution()))
    response.headers["Location"] = url_for(".show", execution_id=handle.execution_id)
    return response, 201


# Not under /workflows/, where any segment is an execution id.
@workflows_api.get("/workflow-queues")
def queues() -> Response:
    """Each declared queue: its limits, and its running, waiting and due runs (bounded counts)."""
    return jsonify({"queues": [view.as_dict() for view in queue_views(workflow_service())]})


_ALL = ["GET", "POST", "PUT", "PATCH", "DELETE"]


# Only under /workflows: the callback and trigger blueprints share the prefix and answer their own.
@workflows_api.route("/workflows", methods=["POST", "PUT", "PATCH", "DELETE"])
@workflows_api.route("/workflows/", methods=_ALL)
@workflows_api.route("/workflows/<anypath:path>", methods=_ALL)
def unknown_route(path: str = "") -> tuple[Response, int]:
    """Anything else under ``/workflows``, after the access check like every route: a JSON 404, or
    405 with ``Allow`` for a method the path does not take."""
    return no_such_route()
