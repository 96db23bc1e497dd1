"""Completion triggers in a Flask app: static registration, the admin API and the CLI, on SQLite
and PostgreSQL, through Flask-SQLAlchemy and the Harvest extension."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from flask import Flask
from flask.testing import FlaskClient
from flask_sqlalchemy import SQLAlchemy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import URL

from flask_harvest import (
    CompletionTrigger,
    ConfigurationError,
    Harvest,
    InvalidFieldError,
    signals,
    trigger_service,
)
from flask_harvest.triggers.conditions import Eq, Not

from .pipeline import close_later

TOKEN = "trigger-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ROOT = "/api/harvest/admin/completion-triggers"
SEED_ID = "78099354-94b3-4f24-9b16-621be94576ff"


def build_app(uri: str, *, static: list[CompletionTrigger] | None = None, **config: Any) -> Flask:
    app = Flask("trigger_test")
    app.config.update(SQLALCHEMY_DATABASE_URI=uri, HARVEST_ACTUATOR_TOKEN=TOKEN, **config)
    db = SQLAlchemy(app)
    workflows = Harvest(db=db)
    workflows.completion_triggers(static or [])

    @workflows.registry.workflow("order_flow")
    def order_flow(ctx: Any, data: Any) -> Any:
        return data

    @workflows.registry.workflow("fulfil")
    def fulfil(ctx: Any, data: Any) -> Any:
        return data

    workflows.init_app(app)
    return close_later(app)


@pytest.fixture(params=["sqlite", "postgres"])
def uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'triggers.db'}"
    request.getfixturevalue("postgres_engine")  # empties the harvest tables
    url: URL = request.getfixturevalue("postgres_url")
    return url.render_as_string(hide_password=False)


@pytest.fixture
def app(uri: str) -> Flask:
    return build_app(uri)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def seed_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": SEED_ID,
        "source_workflow_name": "order_flow",
        "terminal_states": ["Completed", "Failed"],
        "target_workflow_name": "fulfil",
        "input_mapping": {"type": "Projection", "data": "results.summary"},
        "condition": {"type": "GreaterThan", "data": {"path": "results.amount", "value": 1000}},
    }
    body.update(changes)
    return body


def test_the_api_is_closed_without_credentials(client: FlaskClient) -> None:
    assert client.get(ROOT).status_code == 401
    assert client.post(ROOT, json=seed_body()).status_code == 401


def test_register_list_get_and_the_seeds_shapes(client: FlaskClient) -> None:
    created = client.post(ROOT, json=seed_body(), headers=AUTH)
    assert created.status_code == 201
    data = created.get_json()
    assert {k: data[k] for k in seed_body()} == seed_body()
    assert data["created_at"].endswith("Z") and data["updated_at"].endswith("Z")
    listed = client.get(ROOT, headers=AUTH).get_json()
    assert [t["id"] for t in listed] == [SEED_ID]
    assert client.get(f"{ROOT}/{SEED_ID}", headers=AUTH).get_json()["condition"] == seed_body()["condition"]
    plain = client.post(
        ROOT, json={"source_workflow_name": "order_flow", "target_workflow_name": "fulfil"}, headers=AUTH
    ).get_json()
    assert plain["condition"] is None
    assert plain["input_mapping"] == {"type": "Passthrough"}
    assert uuid.UUID(plain["id"])


def test_the_list_pages_with_limit_and_cursor(client: FlaskClient) -> None:
    bodies = [seed_body(id=str(uuid.uuid4())) for _ in range(5)]
    ids = [client.post(ROOT, json=body, headers=AUTH).get_json()["id"] for body in bodies]
    everything = client.get(ROOT, headers=AUTH)
    assert "X-Next-Cursor" not in everything.headers
    assert sorted(t["id"] for t in everything.get_json()) == sorted(ids)
    pages, cursor = [], ""
    while True:
        answer = client.get(f"{ROOT}?limit=2" + (f"&cursor={cursor}" if cursor else ""), headers=AUTH)
        assert answer.status_code == 200
        pages.append([t["id"] for t in answer.get_json()])
        cursor = answer.headers.get("X-Next-Cursor", "")
        if not cursor:
            break
    assert [len(page) for page in pages] == [2, 2, 1]
    assert [i for page in pages for i in page] == [t["id"] for t in everything.get_json()]
    for bad in ("limit=0", "limit=501", "limit=x", "cursor=bogus", "cursor=%00"):
        answer = client.get(f"{ROOT}?{bad}", headers=AUTH)
        assert answer.status_code == 422, bad
        assert answer.get_json()["error"]["code"] == "invalid_query"


def test_reposting_replaces_every_field_and_omitting_condition_clears_it(client: FlaskClient) -> None:
    first = client.post(ROOT, json=seed_body(), headers=AUTH).get_json()
    body = seed_body(terminal_states=["Cancelled"], input_mapping={"type": "Passthrough"})
    del body["condition"]
    second = client.post(ROOT, json=body, headers=AUTH)
    assert second.status_code == 201
    data = second.get_json()
    assert data["condition"] is None
    assert data["terminal_states"] == ["Cancelled"]
    assert data["input_mapping"] == {"type": "Passthrough"}
    assert data["created_at"] == first["created_at"]
    assert len(client.get(ROOT, headers=AUTH).get_json()) == 1


def nest(depth: int) -> dict[str, Any]:
    condition: dict[str, Any] = {"type": "Exists", "data": {"path": "a"}}
    for _ in range(depth - 1):
        condition = {"type": "Not", "data": condition}
    return condition


BAD_BODIES: list[tuple[Any, str]] = [
    (seed_body(condition=nest(9)), "condition"),
    (
        seed_body(condition={"type": "All", "data": [{"type": "Exists", "data": {"path": "a"}}] * 64}),
        "condition",
    ),
    (seed_body(condition={"type": "In", "data": {"path": "a", "values": list(range(65))}}), "condition"),
    (seed_body(condition={"type": "Eq", "data": {"path": "a..b", "value": 1}}), "condition"),
    (seed_body(condition={"type": "Exists", "data": {"path": ".a"}}), "condition"),
    (seed_body(condition={"type": "IsNull", "data": {"path": "a."}}), "condition"),
    (seed_body(condition={"type": "Regex", "data": {"path": "a", "value": "x"}}), "condition"),
    (seed_body(condition={"type": "Eq", "data": {"path": "a"}}), "condition"),
    (seed_body(condition=[1, 2]), "condition"),
    (seed_body(condition="Eq"), "condition"),
    (seed_body(input_mapping={"type": "Projection", "data": "a..b"}), "input_mapping"),
    (seed_body(input_mapping={"type": "Copy"}), "input_mapping"),
    (seed_body(input_mapping="Passthrough"), "input_mapping"),
    (seed_body(terminal_states=["COMPLETED"]), "terminal_states"),
    (seed_body(terminal_states=[]), "terminal_states"),
    (seed_body(terminal_states="Completed"), "terminal_states"),
    (seed_body(id="not-a-uuid"), "id"),
    (seed_body(id=5), "id"),
    (seed_body(source_workflow_name=""), "source_workflow_name"),
    (seed_body(target_workflow_name=None), "target_workflow_name"),
    (seed_body(unknown_field=1), "body"),
    ({"source_workflow_name": "order_flow"}, "target_workflow_name"),
    ([seed_body()], "body"),
    ("text", "body"),
]


@pytest.mark.parametrize(("body", "field"), BAD_BODIES)
def test_every_invalid_body_is_a_400_json_error_naming_the_field(
    client: FlaskClient, body: Any, field: str
) -> None:
    response = client.post(ROOT, json=body, headers=AUTH)
    assert response.status_code == 400, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["code"] == "invalid_trigger"
    assert field in error["fields"]
    assert client.get(ROOT, headers=AUTH).get_json() == []


@pytest.mark.parametrize("field", ["source_workflow_name", "target_workflow_name"])
def test_a_workflow_name_this_app_does_not_register_is_a_400_naming_the_field(
    client: FlaskClient, field: str
) -> None:
    response = client.post(ROOT, json=seed_body(**{field: "nope"}), headers=AUTH)
    assert response.status_code == 400, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["code"] == "invalid_trigger"
    assert list(error["fields"]) == [field]
    assert "'nope'" in error["fields"][field][0]
    assert client.get(ROOT, headers=AUTH).get_json() == []
    # Allowed explicitly: a workflow that only other processes register.
    allowed = client.post(
        f"{ROOT}?allow_unknown_workflows=true", json=seed_body(**{field: "nope"}), headers=AUTH
    )
    assert allowed.status_code == 201, allowed.get_data(as_text=True)
    assert allowed.get_json()[field] == "nope"
    odd = client.post(f"{ROOT}?allow_unknown_workflows=yes", json=seed_body(), headers=AUTH)
    assert odd.status_code == 422
    assert odd.get_json()["error"]["fields"] == {"allow_unknown_workflows": ["must be true or false"]}


def test_the_cli_refuses_an_unknown_target_unless_allowed(app: Flask) -> None:
    runner = app.test_cli_runner()
    register = ["harvest", "triggers", "register", "--source", "order_flow", "--target", "nope", "--json"]
    refused = runner.invoke(args=register)
    assert refused.exit_code == 1, refused.output
    assert refused.output.startswith("Error: target_workflow_name: no workflow named 'nope'")
    assert "--allow-unknown" in refused.output
    assert json.loads(runner.invoke(args=["harvest", "triggers", "list", "--json"]).output) == []
    allowed = runner.invoke(args=[*register, "--allow-unknown"])
    assert allowed.exit_code == 0, allowed.output
    trigger_id = json.loads(allowed.output)["id"]
    # The target cannot start: the fires ledger says so, in the CLI and the API.
    with app.app_context():
        handle, _ = trigger_service().workflows.start("order_flow", {"summary": 1})
        handle.result(timeout=20)
    fires = runner.invoke(args=["harvest", "triggers", "fires", trigger_id, "--json"])
    [fire] = json.loads(fires.output)
    assert (fire["source_exec_id"], fire["outcome"]) == (handle.execution_id, "validation_failed")
    assert fire["target_execution_id"] is None
    text = runner.invoke(args=["harvest", "triggers", "fires", trigger_id]).output
    assert "validation_failed" in text
    api = app.test_client().get(f"{ROOT}/{trigger_id}/fires", headers=AUTH).get_json()
    assert [f["outcome"] for f in api] == ["validation_failed"]


def test_a_body_that_is_not_json_is_a_400(client: FlaskClient) -> None:
    response = client.post(ROOT, data="{not json", headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "bad_json"


def test_a_body_not_sent_as_json_is_a_415_and_registers_nothing(client: FlaskClient) -> None:
    # A cross-site page can post text/plain or a form without a preflight: never a registration.
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {**AUTH, "Content-Type": content_type} if content_type else AUTH
        response = client.post(ROOT, data=json.dumps(seed_body()), headers=headers)
        assert response.status_code == 415, response.get_data(as_text=True)
        assert response.get_json()["error"]["code"] == "unsupported_media_type"
    assert client.get(ROOT, headers=AUTH).get_json() == []


def test_a_body_nested_too_deeply_is_a_400(client: FlaskClient) -> None:
    for body in (
        "[" * 20000 + "]" * 20000,
        json.dumps(seed_body(condition=None)).replace("null", "[" * 5000 + "]" * 5000),
    ):
        response = client.post(ROOT, data=body, headers={**AUTH, "Content-Type": "application/json"})
        assert response.status_code == 400, response.status_code
        assert response.get_json()["error"]["code"] in ("bad_json", "invalid_trigger")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=15,
)
body_fields = st.sampled_from(
    [
        "id",
        "source_workflow_name",
        "target_workflow_name",
        "terminal_states",
        "input_mapping",
        "condition",
        "x",
    ]
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.dictionaries(body_fields, json_values, max_size=3))
def test_arbitrary_bodies_are_201_or_a_400_json_error(
    sqlite_client: FlaskClient, changes: dict[str, Any]
) -> None:
    response = sqlite_client.post(ROOT, json=seed_body(**changes), headers=AUTH)
    assert response.status_code in (201, 400), response.get_data(as_text=True)
    if response.status_code == 400:
        assert response.get_json()["error"]["code"] in ("invalid_trigger", "bad_json")


# Query values as a client may send them: any text (NUL and lone surrogates included, percent-
# encoded as a URL carries them), huge and negative numbers.
query_values = st.one_of(
    st.text(max_size=40).map(lambda t: quote(t.encode("utf-8", "surrogatepass"), safe="")),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.dictionaries(st.sampled_from(["limit", "cursor"]), query_values, max_size=2))
def test_arbitrary_list_queries_are_200_or_a_422_json_error(
    sqlite_client: FlaskClient, query: dict[str, str]
) -> None:
    listed = sqlite_client.get(ROOT, headers=AUTH).get_json()
    url = ROOT + "?" + "&".join(f"{name}={value}" for name, value in query.items())
    response = sqlite_client.get(url, headers=AUTH)
    assert response.status_code in (200, 422), response.get_data(as_text=True)
    if response.status_code == 422:
        assert response.get_json()["error"]["code"] == "invalid_query"
    else:
        assert isinstance(response.get_json(), list)
    assert sqlite_client.get(ROOT, headers=AUTH).get_json() == listed  # a read changes nothing


@pytest.fixture
def sqlite_client(tmp_path: Path) -> FlaskClient:
    return build_app(f"sqlite:///{tmp_path / 'property.db'}").test_client()


def test_delete_removes_the_trigger_and_its_fires(app: Flask, client: FlaskClient) -> None:
    client.post(ROOT, json=seed_body(condition=None, input_mapping={"type": "Passthrough"}), headers=AUTH)
    with app.app_context():
        handle, _ = trigger_service().workflows.start("order_flow", {})
        handle.result(timeout=20)
        fires = client.get(f"{ROOT}/{SEED_ID}/fires", headers=AUTH).get_json()
        assert [f["source_exec_id"] for f in fires] == [handle.execution_id]
        assert client.delete(f"{ROOT}/{SEED_ID}", headers=AUTH).status_code == 204
        assert trigger_service().fires() == []
    assert client.delete(f"{ROOT}/{SEED_ID}", headers=AUTH).status_code == 404
    assert client.get(f"{ROOT}/{SEED_ID}", headers=AUTH).status_code == 404
    assert client.get(f"{ROOT}/{SEED_ID}/fires", headers=AUTH).status_code == 404
    assert client.get(f"{ROOT}/x/fires?limit=0", headers=AUTH).status_code == 404


def test_fires_limit_is_validated(client: FlaskClient) -> None:
    client.post(ROOT, json=seed_body(), headers=AUTH)
    for bad in ("0", "501", "x"):
        response = client.get(f"{ROOT}/{SEED_ID}/fires?limit={bad}", headers=AUTH)
        assert response.status_code == 422
        assert response.get_json()["error"]["code"] == "invalid_query"


def test_static_triggers_are_synced_with_full_replacement(uri: str) -> None:
    guarded = CompletionTrigger("order_flow", "fulfil", condition=Eq("region", "EU"), id=SEED_ID)
    app = build_app(uri, static=[guarded])
    with app.app_context():
        [stored] = trigger_service().list_triggers()
        assert stored.parse() == guarded
        first_update = stored.updated_at
    # The same definition at the next start-up leaves the row alone.
    again = build_app(uri, static=[guarded])
    with again.app_context():
        assert trigger_service().get(SEED_ID).updated_at == first_update
    # A changed definition replaces every field: the condition is cleared.
    changed = build_app(uri, static=[CompletionTrigger("order_flow", "fulfil", id=SEED_ID)])
    with changed.app_context():
        assert trigger_service().get(SEED_ID).parse().condition is None


def test_an_invalid_static_trigger_fails_naming_it() -> None:
    with pytest.raises(InvalidFieldError, match=r"completion trigger .*order_flow.*fulfil") as info:
        CompletionTrigger("order_flow", "fulfil", condition=Not(Eq("a..b", 1)))
    assert "segment is empty" in str(info.value)
    with pytest.raises(ConfigurationError, match="must be a CompletionTrigger"):
        Harvest().completion_trigger({"source_workflow_name": "a"})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="two static completion triggers have the id"):
        Harvest().completion_triggers(
            [
                CompletionTrigger("a", "b", id=SEED_ID),
                CompletionTrigger("a", "c", id=SEED_ID),
            ]
        )


def test_triggers_need_workflows(tmp_path: Path) -> None:
    app = Flask("no_workflows")
    app.config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{tmp_path / 'x.db'}"
    Harvest(app, SQLAlchemy(app), workflows=False)
    close_later(app)
    with pytest.raises(ConfigurationError, match="triggers are off"):
        trigger_service(app)
    with pytest.raises(ConfigurationError, match="triggers need workflows"):
        Harvest(workflows=False, triggers=True)


def test_signals_count_fires_and_skips(uri: str) -> None:
    app = build_app(
        uri, static=[CompletionTrigger("order_flow", "fulfil", condition=Eq("region", "EU"), id=SEED_ID)]
    )
    fired: list[str] = []
    skipped: list[tuple[str, str]] = []

    def on_fired(sender: Flask, **extra: Any) -> None:
        fired.append(extra["outcome"])

    def on_skipped(sender: Flask, **extra: Any) -> None:
        skipped.append((extra["trigger_id"], extra["reason"]))

    with (
        signals.completion_trigger_fired.connected_to(on_fired, sender=app),
        signals.completion_trigger_skipped.connected_to(on_skipped, sender=app),
        app.app_context(),
    ):
        service = trigger_service()
        workflows = service.workflows
        eu, _ = workflows.start("order_flow", {"region": "EU"})
        us, _ = workflows.start("order_flow", {"region": "US"})
        eu.result(timeout=20)
        us.result(timeout=20)
        service.evaluate(us.execution_id)
    assert sorted(fired) == ["deduped", "skipped", "started"]
    assert skipped == [(SEED_ID, "condition_unmet")]


def test_the_cli(app: Flask) -> None:
    runner = app.test_cli_runner()
    result = runner.invoke(
        args=[
            "harvest", "triggers", "register", "--source", "order_flow", "--target", "fulfil",
            "--state", "Completed", "--state", "Failed",
            "--mapping", '{"type": "Projection", "data": "summary"}',
            "--condition", '{"type": "Exists", "data": {"path": "summary"}}', "--id", SEED_ID, "--json",
        ]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["terminal_states"] == ["Completed", "Failed"]
    listed = runner.invoke(args=["harvest", "triggers", "list"])
    assert SEED_ID in listed.output and "order_flow" in listed.output
    shown = runner.invoke(args=["harvest", "triggers", "show", SEED_ID])
    assert '"Projection"' in shown.output
    bad = runner.invoke(
        args=[
            "harvest",
            "triggers",
            "register",
            "--source",
            "a",
            "--target",
            "b",
            "--condition",
            '{"type": "Nope"}',
        ]
    )
    assert bad.exit_code == 1
    assert bad.output.startswith("Error: condition:") and "Traceback" not in bad.output
    not_json = runner.invoke(
        args=["harvest", "triggers", "register", "--source", "a", "--target", "b", "--mapping", "{"]
    )
    assert not_json.exit_code == 1 and "Error: --mapping: is not valid JSON" in not_json.output
    with app.app_context():
        handle, _ = trigger_service().workflows.start("order_flow", {"summary": 1})
        handle.result(timeout=20)
    evaluated = runner.invoke(args=["harvest", "triggers", "evaluate", handle.execution_id, "--json"])
    assert json.loads(evaluated.output)[0]["outcome"] == "deduped"
    fires = runner.invoke(args=["harvest", "triggers", "fires", SEED_ID, "--json"])
    assert json.loads(fires.output)[0]["source_exec_id"] == handle.execution_id
    declined = runner.invoke(args=["harvest", "triggers", "delete", SEED_ID], input="n\n")
    assert declined.exit_code == 1 and "Aborted" in declined.output  # it asks first
    assert runner.invoke(args=["harvest", "triggers", "show", SEED_ID]).exit_code == 0
    assert runner.invoke(args=["harvest", "triggers", "delete", SEED_ID], input="y\n").exit_code == 0
    missing = runner.invoke(args=["harvest", "triggers", "delete", SEED_ID, "--yes"])
    assert missing.exit_code == 1 and "no completion trigger" in missing.output


_AF = '{"source_workflow_name": "a", "target_workflow_name": "fulfil", '
HOSTILE_RAW_BODIES = [
    '{"source_workflow_name": "a\\ud800", "target_workflow_name": "fulfil"}',
    _AF + '"input_mapping": {"type": "Static", "data": "\\udfff"}}',
    _AF + '"input_mapping": {"type": "Static", "data": {"\\udfff": 1}}}',
    _AF + '"condition": {"type": "Exists", "data": {"path": "\\ud800"}}}',
    _AF + '"condition": {"type": "In", "data": {"path": "a", "values": ["\\ud800"]}}}',
    '{"source_workflow_name": "a\\u0000", "target_workflow_name": "fulfil"}',
    '{"source_workflow_name": "a", "target_workflow_name": "\\u0000"}',
    _AF + '"condition": {"type": "Eq", "data": {"path": "a", "value": 1e999}}}',
    _AF + '"condition": {"type": "Eq", "data": {"path": "a", "value": NaN}}}',
    _AF + '"input_mapping": {"type": "Static", "data": ' + "9" * 5000 + "}}",
    _AF + '"id": ' + "9" * 30 + "}",
    '{"source_workflow_name": ["a"], "target_workflow_name": {"b": 1}}',
    _AF + '"terminal_states": [["Completed"]]}',
    _AF + '"terminal_states": [true]}',
    _AF + '"input_mapping": {"type": "Passthrough", "data": 1}}',
    _AF + '"input_mapping": {"type": "Outcome", "data": null}}',
    _AF + '"condition": {"type": "Eq", "data": {"path": "a", "value": 1, "x": 2}}}',
    _AF + '"condition": {"type": "Not", "data": [{"type": "Exists", "data": {"path": "a"}}]}}',
    _AF + '"condition": {"type": "All", "data": {"type": "Exists"}}}',
    _AF + '"condition": {"type": "eq", "data": {"path": "a", "value": 1}}}',
    _AF + '"condition": {"type": "Exists", "data": {"path": 1}}}',
]


@pytest.mark.parametrize("body", HOSTILE_RAW_BODIES)
def test_hostile_bodies_are_a_400_json_error_never_a_5xx(client: FlaskClient, body: str) -> None:
    for content_type in ("application/json", "text/plain", "application/x-www-form-urlencoded"):
        response = client.post(ROOT, data=body, headers={**AUTH, "Content-Type": content_type})
        expected = 400 if content_type == "application/json" else 415
        assert response.status_code == expected, response.get_data(as_text=True)
        assert response.get_json()["error"]["code"] in (
            "invalid_trigger",
            "bad_json",
            "unsupported_media_type",
        )
    assert client.get(ROOT, headers=AUTH).get_json() == []


def test_the_cli_answers_bad_input_with_one_line(app: Flask) -> None:
    runner = app.test_cli_runner()
    register = ["harvest", "triggers", "register", "--source", "a", "--target", "fulfil"]
    for args in (
        [*register, "--condition", "[" * 5000 + "]" * 5000],
        [*register, "--mapping", '{"type": "Static", "data": ' + "[" * 5000 + "]" * 5000 + "}"],
        ["harvest", "triggers", "register", "--source", "a\udcff", "--target", "fulfil"],
        ["harvest", "triggers", "register", "--source", "a\x00", "--target", "fulfil"],
        [*register, "--condition", '{"type": "Eq", "data": {"path": "\udcff", "value": 1}}'],
        ["harvest", "triggers", "show", "\udcff"],
        ["harvest", "triggers", "delete", "\udcff"],
        ["harvest", "triggers", "fires", "\udcff"],
        ["harvest", "triggers", "evaluate", "\udcff"],
        ["harvest", "triggers", "evaluate", "\x00"],
    ):
        result = runner.invoke(args=args)
        assert result.exit_code == 1, (args[:4], result.output, result.exception)
        assert result.output.startswith("Error: ") and result.output.count("\n") == 1, result.output
    assert runner.invoke(args=["harvest", "triggers", "list", "--json"]).output.strip() == "[]"


def test_an_id_is_found_in_any_form_registration_accepts(client: FlaskClient) -> None:
    upper = SEED_ID.upper()
    created = client.post(ROOT, json=seed_body(id=upper), headers=AUTH)
    assert created.status_code == 201 and created.get_json()["id"] == SEED_ID
    assert client.get(f"{ROOT}/{upper}", headers=AUTH).get_json()["id"] == SEED_ID
    assert client.get(f"{ROOT}/{upper}/fires", headers=AUTH).status_code == 200
    assert client.delete(f"{ROOT}/{upper}", headers=AUTH).status_code == 204
    assert client.get(ROOT, headers=AUTH).get_json() == []
