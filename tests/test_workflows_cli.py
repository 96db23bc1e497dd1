"""``flask harvest workflows ...`` through ``app.test_cli_runner()``, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import Result
from flask import Flask

from flask_harvest import workflow_service
from flask_harvest.webhooks.stores import InMemoryOutboundWebhookHandler
from flask_harvest.workflows import ExecutionState
from flask_harvest.workflows._schema import WORKFLOW_TABLES

from .pipeline import make_app
from .test_cli import fails, ok
from .workflow_app import (  # noqa: F401 (app_fixture, database_url_fixture: fixtures)
    app_fixture,
    database_url_fixture,
    executions,
    gate,
    make_workflow_app,
    snapshot,
    state_of,
    wait_asleep,
    wait_in_step,
)

Cli = Callable[..., Result]
S = ExecutionState


@pytest.fixture
def cli(app: Flask) -> Cli:
    runner = app.test_cli_runner()

    def invoke(*args: str, input: str | None = None) -> Result:
        return runner.invoke(args=["harvest", "workflows", *args], input=input)

    return invoke


def as_json(result: Result) -> Any:
    return json.loads(ok(result).stdout)


def start(cli: Cli, name: str, *args: str) -> dict[str, Any]:
    data: dict[str, Any] = as_json(cli("start", name, *args, "--json"))
    return data


def wait_done(cli: Cli, execution_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(cli("result", execution_id, "--wait", "20", "--json").stdout)
    return data


def test_start_result_show_steps_and_list(app: Flask, cli: Cli) -> None:
    started = start(cli, "three_steps", "--input", '{"order": "o-1"}', "--workflow-id", "order-o-1")
    assert started["created"] is True and started["workflow_id"] == "order-o-1"
    eid = started["execution_id"]
    assert as_json(cli("result", eid, "--wait", "20", "--json")) == {
        "execution_id": eid,
        "workflow_id": "order-o-1",
        "state": "Completed",
        "result": [10, 20, 30],
    }
    assert json.loads(ok(cli("result", eid)).stdout) == [10, 20, 30]  # text: the result as JSON
    shown = as_json(cli("show", eid, "--json"))
    assert shown["state"] == "Completed" and shown["input"] == {"order": "o-1"}
    text = ok(cli("show", eid)).stdout
    assert "Completed" in text and '{"order":"o-1"}' in text and "order-o-1" in text
    steps = as_json(cli("steps", eid, "--json"))["steps"]
    assert [(s["seq"], s["name"], s["output"]) for s in steps] == [
        (0, "step_1", 10),
        (1, "step_2", 20),
        (2, "step_3", 30),
    ]
    assert "step_2" in ok(cli("steps", eid)).stdout
    listed = as_json(cli("list", "--json"))
    assert [e["execution_id"] for e in listed["executions"]] == [eid] and listed["next_cursor"] is None
    assert eid in ok(cli("list", "--name", "three_steps", "--state", "Completed")).stdout
    assert "no matching workflow executions" in ok(cli("list", "--state", "Failed")).stdout


def test_start_text_output_and_start_or_load(app: Flask, cli: Cli) -> None:
    text = ok(cli("start", "sleeper", "--workflow-id", "refund-r-1")).stdout
    assert text.startswith("started sleeper execution ") and "refund-r-1" in text
    again = start(cli, "sleeper", "--workflow-id", "refund-r-1")
    assert again["created"] is False
    assert "already open" in ok(cli("start", "sleeper", "--workflow-id", "refund-r-1")).stdout
    assert len(executions(app)) == 1


def test_input_from_a_file_or_standard_input(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "input.json"
    path.write_text('{"from": "file"}', encoding="utf-8")
    from_file = start(cli, "echo", "--input-file", str(path))["execution_id"]
    assert wait_done(cli, from_file)["result"] == {"from": "file"}
    from_stdin = as_json(cli("start", "echo", "--input-file", "-", "--json", input='["stdin"]'))
    assert wait_done(cli, from_stdin["execution_id"])["result"] == ["stdin"]


def test_paging_with_the_cursor_line(cli: Cli) -> None:
    ids = [start(cli, "echo", "--input", str(n))["execution_id"] for n in range(3)]
    first = ok(cli("list", "--limit", "2")).stdout
    more = first.strip().splitlines()[-1]
    assert more.startswith("more: --cursor ")
    rest = as_json(cli("list", "--limit", "2", "--cursor", more.split()[-1], "--json"))
    assert rest["next_cursor"] is None and len(rest["executions"]) == 1
    seen = [line.split()[0] for line in first.splitlines()[1:-1]] + [rest["executions"][0]["execution_id"]]
    assert sorted(seen) == sorted(ids)


def test_a_failed_run_s_result_exits_1_with_its_error(cli: Cli) -> None:
    eid = start(cli, "boom", "--input", '"x"')["execution_id"]
    line = fails(cli("result", eid, "--wait", "20"))
    assert f"execution {eid} ended Failed" in line and "boom: x" in line
    # --json prints the document, then the error line on standard error
    result = cli("result", eid, "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["state"] == "Failed"
    assert result.stderr.startswith("Error: ")


def test_a_run_still_open_exits_1_and_says_to_wait(app: Flask, cli: Cli) -> None:
    eid = start(cli, "sleeper")["execution_id"]
    assert "is still" in fails(cli("result", eid))


def test_cancel_and_terminate(app: Flask, cli: Cli) -> None:
    pending = start(cli, "sleeper")["execution_id"]
    wait_asleep(app, pending)
    assert "Aborted" in cli("cancel", pending, input="n\n").output  # asks first
    assert state_of(app, pending) is not S.CANCELLED
    out = ok(cli("cancel", pending, "--reason", "customer asked", "--yes")).stdout
    assert out.strip() == f"execution {pending} is Cancelled"
    shown = as_json(cli("show", pending, "--json"))
    assert (shown["state"], shown["error"]) == ("Cancelled", "customer asked")
    assert "--reason must be valid Unicode" in fails(cli("cancel", pending, "--reason", "a\udcffb"))
    assert "already ended Cancelled" in fails(cli("cancel", pending))  # an ended run: nothing to ask
    assert "already ended Cancelled" in fails(cli("terminate", pending, "--yes"))

    released = gate("cli-terminate")
    running = start(cli, "gated", "--input", '{"gate": "cli-terminate"}')["execution_id"]
    try:
        wait_in_step("cli-terminate")
        assert "Aborted" in cli("terminate", running, input="n\n").output  # asks first
        assert state_of(app, running) is S.RUNNING
        ended = as_json(cli("terminate", running, "--yes", "--reason", "operator", "--json"))
        assert (ended["state"], ended["error"]) == ("Terminated", "operator")
    finally:
        released.set()


def test_cancel_of_a_running_run_says_it_ends_at_the_next_boundary(app: Flask, cli: Cli) -> None:
    released = gate("cli-cancel")
    eid = start(cli, "gated", "--input", '{"gate": "cli-cancel"}')["execution_id"]
    try:
        wait_in_step("cli-cancel")
        assert "cancel requested" in ok(cli("cancel", eid, "--yes")).stdout
    finally:
        released.set()
    assert wait_done(cli, eid)["state"] == "Cancelled"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("show", "nope"), "no workflow execution with id 'nope'"),
        (("steps", "nope"), "no workflow execution"),
        (("result", "nope"), "no workflow execution"),
        (("cancel", "nope"), "no workflow execution"),
        (("terminate", "nope", "--yes"), "no workflow execution"),
        (("start", "nope"), "no workflow named 'nope'"),
        (("start", "echo", "--input", "{nope"), "input: is not JSON"),
        (("start", "echo", "--input", "NaN"), "input: is not a JSON value"),
        (("start", "echo", "--input", '"' + "x" * 2000 + '"'), "HARVEST_WORKFLOW_MAX_INPUT_BYTES"),
        (("start", "echo", "--completion-callbacks", "[1"), "completion_callbacks: is not JSON"),
        (("start", "echo", "--workflow-id", "x" * 300), "workflow_id"),
        (("list", "--cursor", "bogus"), "cursor"),
        # Bytes on the command line that are not UTF-8 arrive as lone surrogates.
        (("start", "echo", "--workflow-id", "a\udcffb"), "--workflow-id must be valid Unicode"),
        (("list", "--name", "a\udcffb"), "--name must be valid Unicode"),
        (("show", "a\udcffb"), "EXECUTION_ID must be valid Unicode"),
        (("start", "a\udcffb"), "NAME must be valid Unicode"),
    ],
)
def test_errors_are_one_line_and_change_nothing(
    app: Flask, cli: Cli, args: tuple[str, ...], message: str
) -> None:
    before = snapshot(app)
    assert message in fails(cli(*args))
    assert snapshot(app) == before


def test_the_reuse_policy_refusal_is_one_line(app: Flask, cli: Cli) -> None:
    eid = start(cli, "echo", "--workflow-id", "k")["execution_id"]
    assert wait_done(cli, eid)["state"] == "Completed"
    line = fails(cli("start", "echo", "--workflow-id", "k", "--id-reuse-policy", "RejectDuplicate"))
    assert "RejectDuplicate refuses another run" in line
    assert len(executions(app)) == 1


@pytest.mark.parametrize(
    "args",
    [
        ("start", "echo", "--input", "1", "--input-file", "-"),
        ("start", "echo", "--id-reuse-policy", "Sometimes"),
        ("list", "--state", "Done"),
        ("list", "--limit", "0"),
        ("result", "x", "--wait", "nan"),
    ],
)
def test_misused_options_exit_2(cli: Cli, args: tuple[str, ...]) -> None:
    fails(cli(*args), code=2)


def test_an_app_without_workflows_says_so(database_url: str) -> None:
    make_workflow_app(database_url)  # the workflows group exists once any app registered them
    plain = make_app(InMemoryOutboundWebhookHandler())
    result = plain.test_cli_runner().invoke(args=["harvest", "workflows", "list"])
    assert "workflows are off on this app" in fails(result)


def test_init_db_creates_the_workflow_tables_too(app: Flask, cli: Cli) -> None:
    with app.app_context():
        engine = workflow_service().store.engine
    for table in reversed(WORKFLOW_TABLES):
        table.drop(engine)
    assert "could not" in fails(cli("list")).lower()  # the tables are gone
    text = ok(app.test_cli_runner().invoke(args=["harvest", "init-db"])).output
    assert "the webhook tables are in place" in text and "the workflow tables are in place" in text
    assert ok(cli("list")).stdout.strip() == "no matching workflow executions"
    ok(app.test_cli_runner().invoke(args=["harvest", "init-db"]))  # safe to run again


def test_sweep_ends_overdue_executions_and_says_so(
    database_url: str, redis_url: str, redis_conn: redis.Redis
) -> None:
    # On rq with no worker, nothing runs: only the sweep can end the overdue run.
    app = make_workflow_app(database_url, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)
    runner = app.test_cli_runner()
    eid = json.loads(ok(runner.invoke(args=["harvest", "workflows", "start", "hasty", "--json"])).stdout)[
        "execution_id"
    ]
    text = ok(runner.invoke(args=["harvest", "sweep"])).output
    assert "ended 1 workflow execution(s) TimedOut and 0 as poison pills" in text
    assert state_of(app, eid) is S.TIMED_OUT
