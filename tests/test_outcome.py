"""The outcome rules, without I/O."""

from __future__ import annotations

import random
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest.config import Settings
from flask_harvest.outbound.attempt import FailureKind, HttpResponse, TransportError
from flask_harvest.outbound.ssrf import SsrfRejection, describe
from flask_harvest.webhooks import outcome
from flask_harvest.webhooks.models import (
    Claim,
    DeliveryLog,
    DeliveryState,
    SubscriptionEffect,
    WebhookSubscription,
    WebhookSubscriptionStatus,
)

NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=timezone.utc)
SETTINGS = Settings(webhooks_max_attempts=5, webhooks_initial_backoff_ms=1000, webhooks_max_backoff_ms=60_000)


def claim(attempt: int = 1, status: WebhookSubscriptionStatus = WebhookSubscriptionStatus.ACTIVE) -> Claim:
    subscription = WebhookSubscription("https://example.com/h", ["a.b"], "s3cr3t", id="sub_1", status=status)
    delivery = DeliveryLog(id="msg_1", subscription_id="sub_1", topic="a.b", payload="{}", attempt=attempt)
    return Claim(delivery, subscription, "token")


def response(status: int, retry_after: str | None = None) -> HttpResponse:
    return HttpResponse(status=status, retry_after=retry_after, body="b", elapsed_ms=3)


def decide(result: HttpResponse | TransportError, attempt: int = 1, rng: random.Random | None = None):  # type: ignore[no-untyped-def]
    return outcome.after_response(
        claim(attempt), result, settings=SETTINGS, started_at=NOW, now=NOW, request_headers={}, rng=rng
    )


@pytest.mark.parametrize("status", [200, 201, 204, 299])
def test_2xx_is_delivered_and_resets_failures(status: int) -> None:
    result = decide(response(status))
    assert result.state is DeliveryState.DELIVERED
    assert result.effect is SubscriptionEffect.RESET_FAILURES
    assert result.last_error is None
    assert result.attempt is not None and result.attempt.response_status == status


def test_410_disables_and_dead_letters_without_retry() -> None:
    result = decide(response(410))
    assert result.state is DeliveryState.DLQ
    assert result.effect is SubscriptionEffect.DISABLE
    assert result.next_attempt_at is None


@pytest.mark.parametrize("status", [301, 302, 307, 400, 404, 429, 500, 503])
def test_other_statuses_are_counted_retryable_failures(status: int) -> None:
    result = decide(response(status), attempt=2)
    assert result.state is DeliveryState.PENDING
    assert result.effect is SubscriptionEffect.COUNT_FAILURE
    assert result.attempt_number == 3
    assert result.last_error == f"server returned status: {status}"
    assert result.next_attempt_at is not None
    assert NOW <= result.next_attempt_at <= NOW + timedelta(milliseconds=2000)


def test_transport_error_is_retryable_and_recorded() -> None:
    error = TransportError(FailureKind.CONNECT, "connection failed: connection refused", 5)
    result = decide(error)
    assert result.state is DeliveryState.PENDING
    assert result.attempt is not None and result.attempt.error == "connection failed: connection refused"
    assert result.attempt.response_status is None


def test_last_attempt_failure_dead_letters() -> None:
    result = decide(response(500), attempt=5)
    assert result.state is DeliveryState.DLQ
    assert result.attempt_number == 5
    assert result.effect is SubscriptionEffect.COUNT_FAILURE


@given(st.integers(min_value=1, max_value=4), st.integers(min_value=0, max_value=2**32))
def test_retry_delay_is_within_full_jitter_bounds(attempt: int, seed: int) -> None:
    result = decide(response(500), attempt=attempt, rng=random.Random(seed))
    ceiling = min(60_000, 1000 * 2 ** (attempt - 1))
    assert result.next_attempt_at is not None
    delay_ms = (result.next_attempt_at - NOW) / timedelta(milliseconds=1)
    assert 0 <= delay_ms <= ceiling


def test_retry_after_seconds_sets_a_floor() -> None:
    result = decide(response(503, retry_after="30"), rng=random.Random(1))
    assert result.next_attempt_at == NOW + timedelta(seconds=30)


def test_retry_after_http_date_sets_a_floor_capped_by_max_backoff() -> None:
    result = decide(response(429, retry_after="Thu, 03 Dec 2026 12:00:00 GMT"))
    assert result.next_attempt_at == NOW + timedelta(milliseconds=SETTINGS.webhooks_max_backoff_ms)


def test_before_sending_dead_letters_for_an_inactive_subscription_and_skips_a_removed_one() -> None:
    # Accepted while active, due after the subscription stopped: kept visible and replayable.
    disabled = outcome.before_sending(claim(status=WebhookSubscriptionStatus.DISABLED), SETTINGS, NOW)
    assert disabled is not None and disabled.state is DeliveryState.DLQ
    assert disabled.last_error == "subscription is disabled; not sent"
    failed = outcome.before_sending(claim(status=WebhookSubscriptionStatus.FAILED), SETTINGS, NOW)
    assert failed is not None and failed.state is DeliveryState.DLQ
    assert failed.attempt is None  # no request was made
    removed = Claim(claim().delivery, None, "token")
    gone = outcome.before_sending(removed, SETTINGS, NOW)
    assert gone is not None and gone.state is DeliveryState.SKIPPED


def test_before_sending_dead_letters_past_a_lowered_limit() -> None:
    result = outcome.before_sending(claim(attempt=6), SETTINGS, NOW)
    assert result is not None and result.state is DeliveryState.DLQ
    assert result.attempt is None  # no request was made
    assert outcome.before_sending(claim(attempt=5), SETTINGS, NOW) is None


def ssrf_refusal() -> TransportError:
    message = describe(SsrfRejection.LOOPBACK_ADDRESS, "http://receiver.test:8080/h?token=x", "127.0.0.1")
    return TransportError(FailureKind.SSRF, message, 2)


@pytest.mark.parametrize("attempt", [1, 3])
def test_ssrf_refusal_dead_letters_at_once_naming_the_reason(attempt: int) -> None:
    result = decide(ssrf_refusal(), attempt=attempt)
    assert result.state is DeliveryState.DLQ
    assert result.effect is SubscriptionEffect.COUNT_FAILURE  # counted, but the subscription stays
    assert result.attempt_number == attempt
    assert result.next_attempt_at is None
    assert result.last_error is not None
    assert "loopback_address" in result.last_error
    assert "receiver.test" in result.last_error
    assert "token" not in result.last_error
    assert result.attempt is not None and result.attempt.response_status is None


def test_other_transport_errors_still_retry() -> None:
    for kind in (FailureKind.CONNECT, FailureKind.TIMEOUT, FailureKind.DEADLINE, FailureKind.TLS):
        assert decide(TransportError(kind, "x", 1)).state is DeliveryState.PENDING


# -- purity ------------------------------------------------------------------------------------

PURE_MODULES = [
    "flask_harvest.webhooks.outcome",
    "flask_harvest.outbound.attempt",
    "flask_harvest.outbound.signing",
    "flask_harvest.outbound.ssrf",
    "flask_harvest.outbound.backoff",
    "flask_harvest.outbound.rate",
    "flask_harvest.config",
    "flask_harvest.webhooks.catalog",
    "flask_harvest.webhooks.operational",
]
#: What a pure core must not pull in, even through flask_harvest/__init__.py.
EDGES = ["requests", "urllib3", "flask", "werkzeug", "sqlalchemy", "redis", "rq", "blinker", "marshmallow"]


def test_the_outcome_rules_import_no_http_client() -> None:
    # The exact check of the issue, in a fresh interpreter so nothing imported here counts.
    command = "import flask_harvest.webhooks.outcome, sys; print('requests' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_cores_import_no_edge_library(module: str) -> None:
    command = f"import {module}, sys; print(sorted(m for m in {EDGES!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
