"""The receiver kit: verify_webhook against our own deliveries and other libraries' signatures,
every refusal with its status, rotation, and the memory and Redis replay caches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
import standardwebhooks
import stripe
from flask import Flask
from werkzeug.serving import make_server
from werkzeug.test import TestResponse

from flask_harvest import (
    ConfigurationError,
    DeliveryState,
    InMemoryOutboundWebhookHandler,
    InvalidSecretError,
    WebhookSubscription,
    generate_secret,
    get_engine,
)
from flask_harvest.receiver import (
    MemoryReplayCache,
    RedisReplayCache,
    ReplayCache,
    WebhookRejected,
    verify_webhook,
)
from flask_harvest.signing import DEFAULT_SIGNATURE_HEADER, sign_headers

from .pipeline import make_app, wait_final

ROOT = Path(__file__).resolve().parent.parent
SECRET = generate_secret()
OTHER_SECRET = generate_secret()
PLAIN_SECRET = "a-plain-secret-string"  # not whsec_: keyed by its UTF-8 bytes
BODY = b'{"order_id":"ord_1","total":42}'
MSG_ID = "msg_2b7e1b3f0c9d4e6a8f1a2b3c4d5e6f70"


class Receiver:
    """A Flask app with one verified route, and what its view was called with."""

    def __init__(self, secret: Any = SECRET, **options: Any) -> None:
        self.app = Flask("receiver_test")
        self.calls: list[dict[str, Any]] = []
        self.status = 200
        self.fail = False

        @self.app.post("/webhooks")
        @verify_webhook(secret, **options)
        def webhooks(payload: Any, delivery_id: str | None) -> tuple[dict[str, Any], int]:
            self.calls.append({"payload": payload, "delivery_id": delivery_id})
            if self.fail:
                raise RuntimeError("the handler failed")
            return {"received": delivery_id}, self.status

    def post(self, body: bytes, headers: dict[str, str]) -> TestResponse:
        response = self.app.test_client().post("/webhooks", data=body, headers=headers)
        assert_no_secret(response)
        return response


def assert_no_secret(response: TestResponse) -> None:
    """Every response of every test here goes through this: no secret, in any form, is echoed."""
    text = response.get_data(as_text=True) + str(response.headers)
    for secret in (SECRET, OTHER_SECRET, PLAIN_SECRET):
        assert secret not in text
        assert secret.removeprefix("whsec_") not in text


def signed(
    body: bytes = BODY,
    secrets: tuple[str, ...] = (SECRET,),
    *,
    msg_id: str = MSG_ID,
    timestamp: int | None = None,
) -> dict[str, str]:
    ts = int(time.time()) if timestamp is None else timestamp
    return {"Content-Type": "application/json", **sign_headers(list(secrets), msg_id, ts, body)}


def error_code(response: TestResponse) -> str:
    assert response.mimetype == "application/json"
    error = response.get_json()["error"]
    assert set(error) == {"code", "message"}
    return str(error["code"])


# -- accepted ----------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["standard", "stripe"])
@pytest.mark.parametrize("secret", [SECRET, PLAIN_SECRET])
def test_deliveries_of_our_own_pipeline_are_accepted(scheme: str, secret: str) -> None:
    # The real pipeline POSTs to a receiver built with the kit, over HTTP on 127.0.0.1.
    receiver = Receiver(secret, scheme=scheme, replay_cache=MemoryReplayCache())
    server = make_server("127.0.0.1", 0, receiver.app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        store = InMemoryOutboundWebhookHandler()
        app = make_app(store)
        url = f"http://127.0.0.1:{server.server_port}/webhooks"
        store.add_subscription(WebhookSubscription(url, ["order.*"], secret, id="sub_1"))
        with app.app_context():
            ids = get_engine().manager.dispatch("order.created", {"order_id": "ord_1"})
            ids += get_engine().manager.dispatch("order.paid", {"order_id": "ord_1", "total": 42})
        assert wait_final(store, ids) == [DeliveryState.DELIVERED]
    finally:
        server.shutdown()
        server.server_close()
    assert sorted((c["delivery_id"], json.dumps(c["payload"])) for c in receiver.calls) == sorted(
        zip(ids, ['{"order_id": "ord_1"}', '{"order_id": "ord_1", "total": 42}'], strict=True)
    )


def test_the_standardwebhooks_library_signature_is_accepted() -> None:
    now = datetime.now(timezone.utc)
    signature = standardwebhooks.Webhook(SECRET).sign(MSG_ID, now, BODY.decode())
    headers = {
        "webhook-id": MSG_ID,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    }
    receiver = Receiver()
    response = receiver.post(BODY, headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.get_json() == {"received": MSG_ID}
    assert receiver.calls == [{"payload": {"order_id": "ord_1", "total": 42}, "delivery_id": MSG_ID}]


def test_the_stripe_library_signature_is_accepted_and_the_id_is_optional() -> None:
    header = stripe.WebhookSignature.generate_signature_header(BODY.decode(), PLAIN_SECRET)
    receiver = Receiver(PLAIN_SECRET, scheme="stripe")
    assert receiver.post(BODY, {DEFAULT_SIGNATURE_HEADER: header}).status_code == 200
    assert receiver.post(BODY, {DEFAULT_SIGNATURE_HEADER: header, "webhook-id": MSG_ID}).status_code == 200
    assert [c["delivery_id"] for c in receiver.calls] == [None, MSG_ID]


def test_a_custom_stripe_header_name() -> None:
    headers = sign_headers([SECRET], MSG_ID, int(time.time()), BODY, signature_header="Acme-Signature")
    receiver = Receiver(scheme="stripe", signature_header="Acme-Signature")
    assert receiver.post(BODY, {"Acme-Signature": headers["Acme-Signature"]}).status_code == 200
    assert error_code(receiver.post(BODY, signed())) == "missing_signature"


def test_view_arguments_from_the_url_are_passed_along() -> None:
    app = Flask("receiver_test")

    @app.post("/webhooks/<tenant>")
    @verify_webhook(SECRET)
    def webhooks(tenant: str, payload: Any, delivery_id: str) -> dict[str, Any]:
        return {"tenant": tenant, "order": payload["order_id"], "id": delivery_id}

    response = app.test_client().post("/webhooks/acme", data=BODY, headers=signed())
    assert response.get_json() == {"tenant": "acme", "order": "ord_1", "id": MSG_ID}
    assert webhooks.__name__ == "webhooks"


# -- refused -----------------------------------------------------------------------------------


def _without(headers: dict[str, str], name: str) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() != name.lower()}


STANDARD_REFUSALS = [
    pytest.param(lambda: (BODY + b" ", signed()), 401, "invalid_signature", id="tampered-body"),
    pytest.param(
        lambda: (BODY, {**signed(), "webhook-id": "msg_other"}), 401, "invalid_signature", id="tampered-id"
    ),
    pytest.param(
        lambda: (BODY, signed(secrets=(OTHER_SECRET,))), 401, "invalid_signature", id="wrong-secret"
    ),
    pytest.param(
        lambda: (BODY, signed(timestamp=int(time.time()) - 301)),
        401,
        "timestamp_out_of_tolerance",
        id="stale",
    ),
    pytest.param(
        lambda: (BODY, signed(timestamp=int(time.time()) + 301)),
        401,
        "timestamp_out_of_tolerance",
        id="future",
    ),
    pytest.param(
        lambda: (BODY, {**signed(), "webhook-timestamp": "yesterday"}), 400, "malformed_header", id="bad-ts"
    ),
    pytest.param(lambda: (BODY, _without(signed(), "webhook-id")), 400, "missing_header", id="no-id"),
    pytest.param(lambda: (BODY, _without(signed(), "webhook-timestamp")), 400, "missing_header", id="no-ts"),
    pytest.param(
        lambda: (BODY, _without(signed(), "webhook-signature")), 401, "missing_signature", id="no-signature"
    ),
    pytest.param(lambda: (BODY, {}), 400, "missing_header", id="no-headers"),
    pytest.param(lambda: (b"not json", signed(b"not json")), 400, "invalid_json", id="not-json"),
    pytest.param(lambda: (b"\xff\xfe{", signed(b"\xff\xfe{")), 400, "invalid_json", id="not-utf8"),
]


@pytest.mark.parametrize(("make", "status", "code"), STANDARD_REFUSALS)
def test_standard_refusals(make: Any, status: int, code: str) -> None:
    receiver = Receiver(replay_cache=MemoryReplayCache())
    body, headers = make()
    response = receiver.post(body, headers)
    assert (response.status_code, error_code(response)) == (status, code)
    assert receiver.calls == []


def _stripe(body: bytes = BODY, secret: str = SECRET, timestamp: int | None = None) -> dict[str, str]:
    ts = int(time.time()) if timestamp is None else timestamp
    return {DEFAULT_SIGNATURE_HEADER: sign_headers([secret], MSG_ID, ts, body)[DEFAULT_SIGNATURE_HEADER]}


STRIPE_REFUSALS = [
    pytest.param(lambda: (BODY + b" ", _stripe()), 401, "invalid_signature", id="tampered-body"),
    pytest.param(lambda: (BODY, _stripe(secret=OTHER_SECRET)), 401, "invalid_signature", id="wrong-secret"),
    pytest.param(
        lambda: (BODY, _stripe(timestamp=int(time.time()) - 3600)),
        401,
        "timestamp_out_of_tolerance",
        id="stale",
    ),
    pytest.param(lambda: (BODY, {}), 401, "missing_signature", id="no-header"),
    pytest.param(
        lambda: (BODY, {DEFAULT_SIGNATURE_HEADER: f"t={int(time.time())}"}),
        401,
        "missing_signature",
        id="no-v1",
    ),
    pytest.param(lambda: (BODY, {DEFAULT_SIGNATURE_HEADER: "v1=abc"}), 400, "malformed_header", id="no-t"),
    pytest.param(lambda: (b"[1,", _stripe(b"[1,")), 400, "invalid_json", id="not-json"),
]


@pytest.mark.parametrize(("make", "status", "code"), STRIPE_REFUSALS)
def test_stripe_refusals(make: Any, status: int, code: str) -> None:
    receiver = Receiver(scheme="stripe", replay_cache=MemoryReplayCache())
    body, headers = make()
    response = receiver.post(body, headers)
    assert (response.status_code, error_code(response)) == (status, code)
    assert receiver.calls == []


def test_tolerance_is_configurable() -> None:
    receiver = Receiver(tolerance=10)
    assert receiver.post(BODY, signed(timestamp=int(time.time()) - 8)).status_code == 200
    assert error_code(receiver.post(BODY, signed(timestamp=int(time.time()) - 20))) == (
        "timestamp_out_of_tolerance"
    )


def test_an_app_error_handler_can_answer_refusals_its_own_way() -> None:
    receiver = Receiver()

    @receiver.app.errorhandler(WebhookRejected)
    def rejected(exc: WebhookRejected) -> tuple[str, int]:
        return f"nope: {exc.reason}", exc.code or 500

    response = receiver.post(BODY + b"x", signed())
    assert (response.status_code, response.get_data(as_text=True)) == (401, "nope: invalid_signature")


# -- rotation and secret sources ---------------------------------------------------------------


def test_both_secrets_are_accepted_during_a_rotation() -> None:
    receiver = Receiver([OTHER_SECRET, SECRET])
    fresh = [
        receiver.post(BODY, signed(secrets=secrets, msg_id=f"msg_{n}"))
        for n, secrets in enumerate(
            [(SECRET,), (OTHER_SECRET,), (OTHER_SECRET, SECRET), (SECRET, PLAIN_SECRET)]
        )
    ]
    assert [r.status_code for r in fresh] == [200, 200, 200, 200]
    assert error_code(receiver.post(BODY, signed(secrets=(PLAIN_SECRET,)))) == "invalid_signature"


def test_both_secrets_are_accepted_during_a_rotation_stripe() -> None:
    receiver = Receiver((SECRET, OTHER_SECRET), scheme="stripe")
    assert receiver.post(BODY, _stripe(secret=OTHER_SECRET)).status_code == 200
    assert receiver.post(BODY, _stripe(secret=SECRET)).status_code == 200


def test_a_callable_secret_source_is_read_on_every_request() -> None:
    current = [SECRET]
    receiver = Receiver(lambda: list(current))
    assert receiver.post(BODY, signed(msg_id="msg_1")).status_code == 200
    current[:] = [OTHER_SECRET]
    assert error_code(receiver.post(BODY, signed(msg_id="msg_2"))) == "invalid_signature"
    assert receiver.post(BODY, signed(secrets=(OTHER_SECRET,), msg_id="msg_3")).status_code == 200


def test_bad_arguments_fail_at_decoration_without_echoing_the_secret() -> None:
    with pytest.raises(ConfigurationError, match="at least one"):
        verify_webhook([])
    with pytest.raises(ConfigurationError, match="scheme"):
        verify_webhook(SECRET, scheme="svix")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="tolerance"):
        verify_webhook(SECRET, tolerance=-1)
    broken = "whsec_not*base64*secret"
    with pytest.raises(InvalidSecretError) as caught:
        verify_webhook(broken)
    assert broken not in str(caught.value) and "not*base64" not in str(caught.value)


# -- replays -----------------------------------------------------------------------------------


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def replay_cache(request: pytest.FixtureRequest) -> ReplayCache:
    if request.param == "memory":
        return MemoryReplayCache()
    return RedisReplayCache(request.getfixturevalue("redis_conn"), prefix="test:replay:")


def test_a_replayed_delivery_is_refused(replay_cache: ReplayCache) -> None:
    receiver = Receiver(replay_cache=replay_cache)
    headers = signed()
    assert receiver.post(BODY, headers).status_code == 200
    replayed = receiver.post(BODY, headers)
    assert (replayed.status_code, error_code(replayed)) == (409, "replayed")
    # The sender's retry has a fresh timestamp but the same id: refused too, within the window.
    assert receiver.post(BODY, signed(timestamp=int(time.time()) - 5)).status_code == 409
    assert receiver.post(BODY, signed(msg_id="msg_other")).status_code == 200
    assert len(receiver.calls) == 2


def test_forged_requests_do_not_poison_the_cache(replay_cache: ReplayCache) -> None:
    receiver = Receiver(replay_cache=replay_cache)
    assert receiver.post(BODY, signed(secrets=(OTHER_SECRET,))).status_code == 401
    assert receiver.post(b"not json", signed(b"not json")).status_code == 400
    assert receiver.post(BODY, signed()).status_code == 200


def test_a_failed_view_forgets_the_id_so_the_retry_is_handled(replay_cache: ReplayCache) -> None:
    receiver = Receiver(replay_cache=replay_cache)
    receiver.status = 503
    assert receiver.post(BODY, signed()).status_code == 503
    receiver.status, receiver.fail = 200, True
    assert receiver.post(BODY, signed()).status_code == 500
    receiver.fail = False
    assert receiver.post(BODY, signed()).status_code == 200
    assert receiver.post(BODY, signed()).status_code == 409
    assert len(receiver.calls) == 3


def test_concurrent_copies_run_the_view_once(replay_cache: ReplayCache) -> None:
    receiver = Receiver(replay_cache=replay_cache)
    headers = signed()
    codes: list[int] = []
    threads = [
        threading.Thread(target=lambda: codes.append(receiver.post(BODY, headers).status_code))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(codes) == [200] + [409] * 7
    assert len(receiver.calls) == 1


def test_stripe_replays_are_keyed_by_the_signed_message_not_the_unsigned_id() -> None:
    receiver = Receiver(scheme="stripe", replay_cache=MemoryReplayCache())
    headers = _stripe()
    assert receiver.post(BODY, {**headers, "webhook-id": "msg_a"}).status_code == 200
    # webhook-id is not covered by the Stripe-style signature: changing it must not get through.
    assert receiver.post(BODY, {**headers, "webhook-id": "msg_b"}).status_code == 409
    assert receiver.post(BODY, headers).status_code == 409


@pytest.mark.redis
def test_redis_entries_expire_with_the_timestamp_window(redis_conn: redis.Redis) -> None:
    receiver = Receiver(replay_cache=RedisReplayCache(redis_conn, prefix="hooks:"), tolerance=60)
    now = int(time.time())
    assert receiver.post(BODY, signed(timestamp=now - 50)).status_code == 200
    ttl = redis_conn.ttl(f"hooks:{MSG_ID}")
    # Kept until the timestamp leaves the tolerance (about 10 s), not a full window from now.
    assert 5 <= ttl <= 12, ttl


def test_a_replay_cache_outage_is_a_503_and_the_view_is_not_called() -> None:
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    receiver = Receiver(replay_cache=RedisReplayCache(client))
    response = receiver.post(BODY, signed())
    assert (response.status_code, error_code(response)) == (503, "replay_cache_unavailable")
    assert receiver.calls == []
    client.close()


def test_memory_cache_entries_expire_and_the_cache_stays_bounded() -> None:
    now = [1000.0]
    cache = MemoryReplayCache(max_entries=3, clock=lambda: now[0])
    assert cache.add("a", 10) and cache.add("b", 5) and cache.add("c", 20)
    assert not cache.add("a", 10)
    assert cache.add("d", 30)  # full: "b", closest to expiry, made room
    assert len(cache) == 3
    assert cache.add("b", 5)  # ...so it is new again; "a" made room this time
    now[0] += 21
    assert len(cache) == 1  # only "d" is left
    assert cache.add("a", 10) and cache.add("c", 10)
    cache.discard("a")
    assert cache.add("a", 10)


def test_memory_cache_discards_do_not_grow_it_without_bound() -> None:
    cache = MemoryReplayCache(max_entries=10)
    for number in range(1000):
        assert cache.add(f"k{number}", 60)
        cache.discard(f"k{number}")
    assert len(cache) == 0
    assert len(cache._heap) <= 21


@pytest.mark.parametrize("kind", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_cache_add_is_atomic_across_threads(kind: str, request: pytest.FixtureRequest) -> None:
    cache: ReplayCache = (
        MemoryReplayCache() if kind == "memory" else RedisReplayCache(request.getfixturevalue("redis_conn"))
    )
    results: list[bool] = []
    barrier = threading.Barrier(16)

    def add() -> None:
        barrier.wait()
        results.append(cache.add("same", 60))

    threads = [threading.Thread(target=add) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results.count(True) == 1


# -- the example and the secret ----------------------------------------------------------------


def test_the_receiver_example_runs_as_documented() -> None:
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "receiver_app.py")],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "valid delivery     -> 200" in lines
    assert "tampered body      -> 401 invalid_signature" in lines
    assert "replayed delivery  -> 409 replayed" in lines
    assert lines[-1] == "receiver example OK"
