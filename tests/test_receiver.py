"""The receiver kit: verify_webhook against our own deliveries and other libraries' signatures,
every refusal with its status, rotation, and the memory and Redis replay caches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
import standardwebhooks
import stripe
from flask import Flask, request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
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
from flask_harvest import receiver as receiver_module
from flask_harvest.errors import VerificationFailure
from flask_harvest.outbound.signing import DEFAULT_SIGNATURE_HEADER, sign_headers
from flask_harvest.receiver import (
    MemoryReplayCache,
    RedisReplayCache,
    ReplayCache,
    WebhookRejected,
    verify_webhook,
)

from .live_server import LiveServer, live_server
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
    with live_server(receiver.app) as server:
        store = InMemoryOutboundWebhookHandler()
        app = make_app(store)
        store.add_subscription(WebhookSubscription(server.url + "/webhooks", ["order.*"], secret, id="sub_1"))
        with app.app_context():
            ids = get_engine().manager.dispatch("order.created", {"order_id": "ord_1"})
            ids += get_engine().manager.dispatch("order.paid", {"order_id": "ord_1", "total": 42})
        assert wait_final(store, ids) == [DeliveryState.DELIVERED]
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
    pytest.param(
        lambda: (BODY, _stripe(timestamp=int(time.time()) + 3600)),
        401,
        "timestamp_out_of_tolerance",
        id="future",
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


# -- the Stripe scheme's replay key ---------------------------------------------------------------


def test_stripe_deliveries_with_the_same_body_in_the_same_second_are_both_handled(
    replay_cache: ReplayCache,
) -> None:
    # flask-harvest signs every attempt both ways; the Standard Webhooks signature covers the id,
    # so two deliveries of the same payload in the same second are two deliveries, not a replay.
    receiver = Receiver(scheme="stripe", replay_cache=replay_cache)
    now = int(time.time())
    first, second = signed(msg_id="msg_a", timestamp=now), signed(msg_id="msg_b", timestamp=now)
    assert first[DEFAULT_SIGNATURE_HEADER] == second[DEFAULT_SIGNATURE_HEADER]
    assert receiver.post(BODY, first).status_code == 200
    assert receiver.post(BODY, second).status_code == 200
    assert [c["delivery_id"] for c in receiver.calls] == ["msg_a", "msg_b"]
    # Each is still refused when it comes again, however its unsigned parts are changed.
    assert receiver.post(BODY, first).status_code == 409
    assert receiver.post(BODY, {**first, "webhook-id": "msg_c"}).status_code == 409
    assert receiver.post(BODY, _without(first, "webhook-signature")).status_code == 409
    assert receiver.post(BODY, {DEFAULT_SIGNATURE_HEADER: first[DEFAULT_SIGNATURE_HEADER]}).status_code == 409
    assert len(receiver.calls) == 2


def test_stripe_failed_view_forgets_only_what_its_request_recorded() -> None:
    receiver = Receiver(scheme="stripe", replay_cache=MemoryReplayCache())
    now = int(time.time())
    first, second = signed(msg_id="msg_a", timestamp=now), signed(msg_id="msg_b", timestamp=now)
    assert receiver.post(BODY, first).status_code == 200
    receiver.status = 503
    assert receiver.post(BODY, second).status_code == 503
    receiver.status = 200
    assert receiver.post(BODY, second).status_code == 200  # the retry is handled
    # The first delivery's signed message is still remembered: a copy with a new id is refused.
    assert receiver.post(BODY, {**first, "webhook-id": "msg_c"}).status_code == 409


def test_stripe_only_requests_without_a_signed_id_are_keyed_by_the_signed_message() -> None:
    # The Stripe-style signature covers only the timestamp and the body: without an id that a
    # signature covers, the same body in the same second cannot be told from a replay (409); the
    # sender's retry carries a new timestamp and is handled.
    receiver = Receiver(scheme="stripe", replay_cache=MemoryReplayCache())
    now = int(time.time())
    assert receiver.post(BODY, _stripe(timestamp=now)).status_code == 200
    assert receiver.post(BODY, _stripe(timestamp=now)).status_code == 409
    assert receiver.post(BODY, _stripe(timestamp=now - 1)).status_code == 200


# -- bad bodies --------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [1_000, 100_000])
@pytest.mark.parametrize("scheme", ["standard", "stripe"])
def test_a_deeply_nested_body_is_a_400_not_a_500(depth: int, scheme: str) -> None:
    body = b"[" * depth + b"]" * depth
    receiver = Receiver(scheme=scheme, replay_cache=MemoryReplayCache())
    response = receiver.post(body, signed(body))
    assert (response.status_code, error_code(response)) == (400, "invalid_json")
    assert "nested too deeply" in response.get_json()["error"]["message"]
    assert receiver.calls == []
    # Nothing was remembered: the same delivery id with a sound body is handled.
    assert receiver.post(BODY, signed()).status_code == 200


def test_the_body_limit_is_a_413_and_a_body_at_the_limit_is_handled() -> None:
    body = b'{"pad":"' + b"x" * (1024 - 10) + b'"}'
    assert len(body) == 1024
    receiver = Receiver(max_body_bytes=1024, replay_cache=MemoryReplayCache())
    assert receiver.post(body, signed(body)).status_code == 200
    over = body[:-2] + b'x"}'
    response = receiver.post(over, signed(over, msg_id="msg_over"))
    assert (response.status_code, error_code(response)) == (413, "body_too_large")
    assert len(receiver.calls) == 1


def test_the_default_body_limit_is_one_mebibyte() -> None:
    body = b'{"pad":"' + b"x" * (1024 * 1024) + b'"}'
    receiver = Receiver()
    response = receiver.post(body, signed(body))
    assert (response.status_code, error_code(response)) == (413, "body_too_large")


def test_a_bad_body_limit_fails_at_decoration() -> None:
    for limit in (0, -1):
        with pytest.raises(ConfigurationError, match="max_body_bytes"):
            verify_webhook(SECRET, max_body_bytes=limit)


@pytest.fixture
def limited_receiver() -> Receiver:
    return Receiver(max_body_bytes=64 * 1024, replay_cache=MemoryReplayCache())


@pytest.fixture
def limited(limited_receiver: Receiver) -> Iterator[LiveServer]:
    with live_server(limited_receiver.app) as server:
        yield server


def send(server: LiveServer, headers: dict[str, str], body_start: bytes) -> tuple[int, str]:
    """POST the start of a body to the receiver's route; see ``send_unfinished``."""
    return server.send_unfinished("/webhooks", headers, body_start)


def test_a_huge_body_without_webhook_headers_is_refused_before_it_is_read(limited: LiveServer) -> None:
    # 200 MB announced, 4 KB sent: an answer proves the receiver never waited for the rest.
    headers = {"Content-Type": "application/json", "Content-Length": str(200 * 1024 * 1024)}
    assert send(limited, headers, b"[" * 4096) == (400, "missing_header")


def test_a_huge_body_with_a_stale_timestamp_is_refused_before_it_is_read(limited: LiveServer) -> None:
    headers = {**signed(timestamp=int(time.time()) - 3600), "Content-Length": str(200 * 1024 * 1024)}
    assert send(limited, headers, b"[" * 4096) == (401, "timestamp_out_of_tolerance")


def test_an_announced_body_over_the_limit_is_a_413_before_it_is_read(
    limited: LiveServer, limited_receiver: Receiver
) -> None:
    headers = {**signed(), "Content-Length": str(64 * 1024 + 1)}
    assert send(limited, headers, b"[" * 4096) == (413, "body_too_large")
    assert limited_receiver.calls == []


def test_a_chunked_body_is_read_only_up_to_the_limit(limited: LiveServer, limited_receiver: Receiver) -> None:
    # No Content-Length: chunks keep coming, and the receiver stops one byte past its limit.
    chunk = b"[" * 16384
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(5))
    headers = {**signed(), "Transfer-Encoding": "chunked"}
    assert send(limited, headers, chunks) == (413, "body_too_large")
    assert limited_receiver.calls == []


def test_a_chunked_body_under_the_limit_is_verified_and_readable_in_the_view() -> None:
    receiver = Receiver(max_body_bytes=64 * 1024)
    seen: list[bytes] = []

    @receiver.app.post("/raw")
    @verify_webhook(SECRET, max_body_bytes=64 * 1024)
    def raw(payload: Any, delivery_id: str) -> tuple[str, int]:
        seen.append(request.get_data())
        return "", 204

    with live_server(receiver.app) as server:
        # A generator body makes requests send it chunked, without a Content-Length.
        response = requests.post(
            server.url + "/raw", data=iter([BODY[:10], BODY[10:]]), headers=signed(), timeout=10
        )
    assert response.request.headers.get("Transfer-Encoding") == "chunked"
    assert response.status_code == 204, response.text
    assert seen == [BODY]


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


def test_every_verification_failure_has_an_answer() -> None:
    # A new reason in the signing module must get a status here, not a KeyError (a 500).
    assert set(receiver_module._REFUSALS) == set(VerificationFailure)
    assert all(400 <= status < 500 for status, _ in receiver_module._REFUSALS.values())


# -- arbitrary requests ------------------------------------------------------------------------

_header_text = st.text(
    st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\x7f"), max_size=80
)
_timestamps = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.builds(lambda skew: str(int(time.time()) + skew), st.integers(-400, 400)),
    _header_text,
)
_json_bodies = st.one_of(
    st.binary(max_size=300),
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=20,
    ).map(lambda value: json.dumps(value).encode()),
    st.integers(1, 5000).map(lambda depth: b"[" * depth + b"]" * depth),
    st.integers(1, 5000).map(lambda depth: b'{"a":' * depth + b"1" + b"}" * depth),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scheme=st.sampled_from(["standard", "stripe"]),
    body=_json_bodies,
    sign=st.booleans(),
    msg_id=_header_text,
    timestamp=_timestamps,
    signature=_header_text,
    stripe_header=_header_text,
)
def test_any_request_is_answered_with_a_4xx_or_reaches_the_view_verified(
    scheme: str, body: bytes, sign: bool, msg_id: str, timestamp: str, signature: str, stripe_header: str
) -> None:
    receiver = Receiver(scheme=scheme, replay_cache=MemoryReplayCache(), max_body_bytes=64 * 1024)
    if sign:
        headers = signed(body, msg_id=msg_id or "msg_x")
    else:
        headers = {
            "webhook-id": msg_id,
            "webhook-timestamp": timestamp,
            "webhook-signature": signature,
            DEFAULT_SIGNATURE_HEADER: stripe_header,
        }
    response = receiver.post(body, headers)
    if response.status_code == 200:
        assert sign and [call["delivery_id"] for call in receiver.calls] == [headers["webhook-id"]]
        # json.dumps: NaN is not equal to itself, but it is spelled the same.
        assert json.dumps(receiver.calls[0]["payload"]) == json.dumps(json.loads(body))
    else:
        assert response.status_code in (400, 401, 413), response.get_data(as_text=True)
        assert error_code(response) in {code for _, code in receiver_module._REFUSALS.values()} | {
            "invalid_json",
            "body_too_large",
        }
        assert receiver.calls == []
