"""Scenario 7: secrets never leak.

Every test of this group creates its subscriptions with *canary* secrets (``whsec_`` and the base64
of ``HARVEST-SECRET-CANARY-...``), and the ``faults`` fixture searches every flask-harvest log record
of the test process and the whole output of every worker process for the canary after each test.
This test adds the rest: it drives deliveries, retries, dead letters, a rotation and operator
actions with a worker logging at ``DEBUG``, then searches every actuator and CLI response (other
than the ones that create a subscription or rotate its secret, which show the new secret once),
the DLQ listing, exception messages and tracebacks (database errors included), reprs and every
log record of this process.
"""

from __future__ import annotations

import base64
import logging
import traceback
from typing import Any

import pytest

from flask_harvest import (
    DuplicateSubscriptionError,
    HarvestError,
    InvalidSecretError,
    StoreError,
    WebhookSubscription,
    get_engine,
)
from flask_harvest.webhooks.models import utcnow

from .conftest import CANARY, CANARY_PATTERNS, FaultEnv, canary_secret, find_canary, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]
TIME_LIMIT_SECONDS = 120

TOKEN = "actuator-token-for-the-fault-tests"
PREFIX = "/actuator/webhooks"


def formatted(exc: BaseException) -> str:
    """The exception as a log handler would print it: message, chained causes, traceback."""
    return "".join(traceback.format_exception(exc))


def test_secrets_appear_nowhere_but_where_they_are_created(
    faults: FaultEnv, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger of this process, not only flask_harvest's
    faults.config.update(HARVEST_ACTUATOR_TOKEN=TOKEN, HARVEST_WEBHOOKS_MAX_ATTEMPTS=2)
    app = faults.app()
    client = app.test_client()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    cli = app.test_cli_runner()
    scanned: list[tuple[str, str]] = []

    def look(where: str, text: str) -> str:
        scanned.append((where, text))
        return text

    def api(method: str, path: str, status: int, **kwargs: Any) -> Any:
        response = client.open(PREFIX + path, method=method, headers=auth, **kwargs)
        assert response.status_code == status, (method, path, response.get_data(as_text=True))
        look(f"{method} {path}", response.get_data(as_text=True))
        return response.get_json(silent=True)

    def run(*args: str) -> str:
        result = cli.invoke(args=["harvest", *args])
        return result.output

    # Creation shows the secret, once: through the actuator, the CLI, and the store.
    first = canary_secret()
    faults.secrets.append(first)
    assert find_canary(first) == list(CANARY_PATTERNS[1:]), "the canary must be recognisable in a secret"
    response = client.post(
        PREFIX + "/subscriptions",
        headers=auth,
        json={
            "id": "sub_api",
            "target_url": faults.receiver.url("api"),
            "event_topics": ["fault.*"],
            "secret": first,
        },
    )
    assert response.status_code == 201 and response.get_json()["secret"] == first
    second = canary_secret()
    faults.secrets.append(second)
    created = run(
        "subscriptions",
        "add",
        faults.receiver.url("cli"),
        "--topic",
        "fault.*",
        "--secret",
        second,
        "--id",
        "sub_cli",
    )
    assert second in created
    faults.subscribe("sub_dead", faults.receiver.url("dead"), ["fault.*"])
    faults.receiver.mode("dead", "status", status=500, body="nope")

    # Traffic: deliveries, retries and dead letters, with the worker logging everything.
    worker = faults.start_worker(concurrency=8, log_level="DEBUG")
    ids = [i for n in range(10) for i in faults.dispatch("fault.created", {"serial": n})]
    faults.wait_final(ids, timeout=60)

    # Rotation shows the new secret, never the old one.
    rotated_to = canary_secret()
    faults.secrets.append(rotated_to)
    response = client.post(
        PREFIX + "/subscriptions/sub_api/rotate-secret",
        headers=auth,
        json={"secret": rotated_to, "grace_seconds": 60},
    )
    assert response.status_code == 200 and response.get_json()["secret"] == rotated_to
    assert first not in response.get_data(as_text=True)
    cli_rotated_to = canary_secret()
    faults.secrets.append(cli_rotated_to)
    rotated = run("subscriptions", "rotate-secret", "sub_cli", "--secret", cli_rotated_to, "--json")
    assert cli_rotated_to in rotated and second not in rotated
    # Signed with both secrets during the grace period.
    more = [i for n in range(10, 15) for i in faults.dispatch("fault.created", {"serial": n})]
    faults.wait_final(more, timeout=60)
    dead = [i for i in ids + more if faults.rows([i])[i].state == "dlq"]
    assert dead, "nothing was dead-lettered"

    # Every other actuator response.
    api("GET", "/subscriptions", 200)
    for sub_id in ("sub_api", "sub_cli", "sub_dead"):
        api("GET", f"/subscriptions/{sub_id}", 200)
    api("PATCH", "/subscriptions/sub_api", 200, json={"description": "patched"})
    api("GET", "/dlq", 200)
    api("GET", "/dlq?subscription_id=sub_dead&limit=2", 200)
    for delivery_id in ids[:6] + dead[:3]:
        api("GET", f"/deliveries/{delivery_id}", 200)
    api("GET", "/stats", 200)
    api("POST", "/replay", 200, json={"subscription_id": "sub_dead", "dry_run": True})
    api("POST", "/replay", 200, json={"log_id": dead[0]})
    # Errors: a duplicate id, a malformed secret, a secret where none is accepted, unknown ids.
    taken = {"id": "sub_api", "target_url": faults.receiver.url("x"), "event_topics": ["fault.*"]}
    api("POST", "/subscriptions", 409, json={**taken, "secret": canary_secret()})
    malformed = "whsec_" + base64.b64encode(CANARY + b"-x").decode() + "!"
    api("POST", "/subscriptions", 422, json={
        "target_url": faults.receiver.url("x"), "event_topics": ["fault.*"], "secret": malformed
    })  # fmt: skip
    api("PATCH", "/subscriptions/sub_api", 422, json={"secret": canary_secret()})
    api("POST", "/subscriptions/sub_api/rotate-secret", 422, json={"secret": malformed})
    api("GET", "/subscriptions/sub_nope", 404)
    api("GET", "/deliveries/msg_nope", 404)

    # Every other CLI output.
    for args in (
        ("subscriptions", "list"),
        ("subscriptions", "list", "--json"),
        ("subscriptions", "show", "sub_cli"),
        ("subscriptions", "show", "sub_api", "--json"),
        ("subscriptions", "disable", "sub_dead"),
        ("subscriptions", "enable", "sub_dead", "--json"),
        ("dlq", "list"),
        ("dlq", "list", "--json"),
        ("deliveries", "show", dead[-1]),
        ("deliveries", "show", ids[0], "--json"),
        ("stats",),
        ("subscriptions", "add", faults.receiver.url("y"), "--topic", "fault.*", "--secret", malformed),
        ("subscriptions", "rotate-secret", "sub_cli", "--secret", malformed),
    ):
        look("flask harvest " + " ".join(args), run(*args))

    # The DLQ listing, as the store returns it.
    with app.app_context():
        look("store.list_dlq", repr([d.to_dict() for d in get_engine().store.list_dlq(limit=100)]))

    # Exception messages and tracebacks, database errors included.
    errors: list[BaseException] = []
    with pytest.raises(InvalidSecretError) as invalid:
        WebhookSubscription(faults.receiver.url("z"), ["fault.*"], malformed)
    errors.append(invalid.value)
    with pytest.raises(DuplicateSubscriptionError) as duplicate:
        faults.store.add_subscription(
            WebhookSubscription(faults.receiver.url("z"), ["fault.*"], canary_secret(), id="sub_dead")
        )
    errors.append(duplicate.value)
    subscription = faults.store.get_subscription("sub_dead")
    assert subscription is not None
    faults.terminate_backends()  # the store's pooled connections die under it
    with pytest.raises(StoreError) as lost:
        faults.store.add_subscription(
            WebhookSubscription(faults.receiver.url("z"), ["fault.*"], canary_secret(), id="sub_lost")
        )
    errors.append(lost.value)
    faults.store.get_subscription("sub_dead")  # a fresh pooled connection, for the next one to kill
    faults.terminate_backends()
    with pytest.raises(HarvestError) as lost_update:
        faults.store.rotate_secret(subscription.id, canary_secret(), previous_expires_at=utcnow())
    errors.append(lost_update.value)
    for error in errors:
        look(f"{type(error).__name__} message", str(error))
        look(f"{type(error).__name__} traceback", formatted(error))
    look(
        "reprs", " ".join(map(repr, [subscription, str(subscription), faults.store, subscription.to_dict()]))
    )

    # A worker's output (the fixture searches it too, after the test) and this process's logs.
    wait_until(lambda: "attempt 2: dlq" in worker.log(), 10, "the worker to log the dead letters")
    look("worker output", worker.log())
    look("log records", caplog.text)
    for secret in faults.secrets:
        scanned_with_secret = [where for where, text in scanned if secret in text]
        assert not scanned_with_secret, f"a secret appears in: {scanned_with_secret}"
    leaks = [(where, find_canary(text)) for where, text in scanned if find_canary(text)]
    assert not leaks, f"the canary appears in: {leaks}"
    characters = sum(len(text) for _, text in scanned)
    print(f"\nscenario 7: searched {len(scanned)} outputs ({characters} characters): no secret")
