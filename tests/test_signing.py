"""Signing and verification: independent vectors, a published vector, and third-party cross-checks.

Every expected signature here is computed in the test with hmac/hashlib/base64 (or taken from the
Standard Webhooks library's published test), never with the code under test.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest
import stripe
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from werkzeug.datastructures import Headers

from flask_harvest import generate_secret
from flask_harvest.errors import InvalidSecretError, SignatureVerificationError, VerificationFailure
from flask_harvest.outbound.signing import (
    DEFAULT_SIGNATURE_HEADER,
    StandardHeaders,
    StripeHeader,
    secret_key,
    sign_headers,
    standard_signature,
    stripe_signature,
    verify_standard,
    verify_stripe,
)

BODY = b'{"order_id":"ord_999"}'
MSG_ID = "log_456"
TS = 1778930400  # the seed's example timestamp
RAW_KEY = b"0123456789abcdef0123456789abcdef"
WHSEC = "whsec_" + base64.b64encode(RAW_KEY).decode("ascii")
OTHER_WHSEC = "whsec_" + base64.b64encode(b"another key of thirty-two bytes!").decode("ascii")
PLAIN = "plain-secret-\u00e9t\u00e9"  # non-ASCII on purpose: keyed with its UTF-8 bytes


def expected_standard(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode("ascii")


def expected_stripe(secret: str, timestamp: int, body: bytes) -> str:
    signed = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode("utf-8"), signed, hashlib.sha256).hexdigest()


# -- known vectors ----------------------------------------------------------------------------------


def test_standard_signature_of_whsec_secret_is_keyed_with_the_decoded_bytes() -> None:
    got = standard_signature(WHSEC, MSG_ID, TS, BODY)
    assert got == expected_standard(RAW_KEY, MSG_ID, TS, BODY)
    # Keying with the string itself would be a different (wrong) signature.
    assert got != expected_standard(WHSEC.encode(), MSG_ID, TS, BODY)


def test_standard_signature_of_plain_secret_is_keyed_with_its_utf8_bytes() -> None:
    got = standard_signature(PLAIN, MSG_ID, TS, BODY)
    assert got == expected_standard(PLAIN.encode("utf-8"), MSG_ID, TS, BODY)
    assert got.startswith("v1,")


@pytest.mark.parametrize("secret", [WHSEC, PLAIN])
def test_stripe_signature_is_hex_hmac_of_timestamp_dot_body_keyed_with_the_string(secret: str) -> None:
    got = stripe_signature(secret, TS, BODY)
    assert got == expected_stripe(secret, TS, BODY)
    assert got == got.lower()
    assert len(got) == 64


def test_published_standard_webhooks_vector() -> None:
    # From the Standard Webhooks Python library's test suite (test_sign_function).
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    msg_id = "msg_p5jXN8AQM9LWM0D4loKWxJek"
    timestamp = 1614265330
    body = b'{"test": 2432232314}'
    expected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

    assert standard_signature(secret, msg_id, timestamp, body) == expected
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(timestamp), "webhook-signature": expected}
    verify_standard(secret, headers, body, now=timestamp)


def test_sign_headers_shape() -> None:
    headers = sign_headers([WHSEC], MSG_ID, TS, BODY)
    assert headers == {
        "webhook-id": MSG_ID,
        "webhook-timestamp": str(TS),
        "webhook-signature": expected_standard(RAW_KEY, MSG_ID, TS, BODY),
        DEFAULT_SIGNATURE_HEADER: f"t={TS},v1={expected_stripe(WHSEC, TS, BODY)}",
    }
    assert DEFAULT_SIGNATURE_HEADER == "Autumn-Signature"


def test_sign_headers_custom_header_name() -> None:
    headers = sign_headers([PLAIN], MSG_ID, TS, BODY, signature_header="X-Sig")
    assert headers["X-Sig"] == f"t={TS},v1={expected_stripe(PLAIN, TS, BODY)}"
    assert DEFAULT_SIGNATURE_HEADER not in headers


def test_sign_headers_with_two_secrets_carries_both_signatures_in_order() -> None:
    headers = sign_headers([WHSEC, PLAIN], MSG_ID, TS, BODY)
    assert headers["webhook-signature"].split(" ") == [
        expected_standard(RAW_KEY, MSG_ID, TS, BODY),
        expected_standard(PLAIN.encode(), MSG_ID, TS, BODY),
    ]
    assert headers[DEFAULT_SIGNATURE_HEADER] == (
        f"t={TS},v1={expected_stripe(WHSEC, TS, BODY)},v1={expected_stripe(PLAIN, TS, BODY)}"
    )


def test_sign_headers_needs_a_secret() -> None:
    with pytest.raises(InvalidSecretError) as info:
        sign_headers([], MSG_ID, TS, BODY)
    assert info.value.field == "secrets"


# -- cross-checks against the third-party libraries -------------------------------------------------


def test_standardwebhooks_library_accepts_our_headers() -> None:
    now = int(time.time())
    headers = sign_headers([WHSEC], MSG_ID, now, BODY)
    assert Webhook(WHSEC).verify(BODY, headers) == {"order_id": "ord_999"}
    with pytest.raises(WebhookVerificationError):
        Webhook(OTHER_WHSEC).verify(BODY, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(WHSEC).verify(BODY + b" ", headers)


def test_standardwebhooks_library_accepts_either_secret_during_rotation() -> None:
    now = int(time.time())
    headers = sign_headers([WHSEC, OTHER_WHSEC], MSG_ID, now, BODY)
    assert Webhook(WHSEC).verify(BODY, headers) == {"order_id": "ord_999"}
    assert Webhook(OTHER_WHSEC).verify(BODY, headers) == {"order_id": "ord_999"}
    with pytest.raises(WebhookVerificationError):
        Webhook(generate_secret()).verify(BODY, headers)


def test_our_verify_standard_accepts_either_secret_during_rotation() -> None:
    headers = sign_headers([WHSEC, OTHER_WHSEC], MSG_ID, TS, BODY)
    verify_standard(WHSEC, headers, BODY, now=TS)
    verify_standard(OTHER_WHSEC, headers, BODY, now=TS)
    with pytest.raises(SignatureVerificationError):
        verify_standard(generate_secret(), headers, BODY, now=TS)


@pytest.mark.parametrize("secret", [WHSEC, PLAIN])
def test_stripe_library_accepts_our_header(secret: str) -> None:
    now = int(time.time())
    header = sign_headers([secret], MSG_ID, now, BODY)[DEFAULT_SIGNATURE_HEADER]
    assert stripe.WebhookSignature.verify_header(BODY, header, secret, tolerance=300) is True
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.WebhookSignature.verify_header(BODY, header, secret + "x", tolerance=300)
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.WebhookSignature.verify_header(BODY + b" ", header, secret, tolerance=300)


def test_stripe_library_accepts_either_secret_during_rotation() -> None:
    now = int(time.time())
    header = sign_headers([WHSEC, PLAIN], MSG_ID, now, BODY)[DEFAULT_SIGNATURE_HEADER]
    for secret in (WHSEC, PLAIN):
        assert stripe.WebhookSignature.verify_header(BODY, header, secret, tolerance=300) is True


@pytest.mark.parametrize("secret", [WHSEC, PLAIN])
def test_our_verify_stripe_accepts_the_stripe_library_header(secret: str) -> None:
    header = stripe.WebhookSignature.generate_signature_header(BODY.decode(), secret, timestamp=TS)
    verify_stripe(secret, header, BODY, now=TS)
    with pytest.raises(SignatureVerificationError):
        verify_stripe(secret, header, BODY + b"!", now=TS)


def test_our_verify_standard_accepts_the_standardwebhooks_library_signature() -> None:
    # The library floors the datetime's timestamp and, for a naive datetime, assumes UTC: give it
    # an aware UTC datetime with a fractional second to check both sides agree on the integer.
    when = datetime.fromtimestamp(TS, tz=timezone.utc) + timedelta(milliseconds=700)
    signature = Webhook(WHSEC).sign(MSG_ID, when, BODY.decode())
    headers = {"webhook-id": MSG_ID, "webhook-timestamp": str(TS), "webhook-signature": signature}
    verify_standard(WHSEC, headers, BODY, now=TS)
    assert signature == expected_standard(RAW_KEY, MSG_ID, TS, BODY)


# -- verification -----------------------------------------------------------------------------------


@pytest.mark.parametrize("skew", [-300, -1, 0, 1, 300])
def test_verify_inside_tolerance_passes(skew: int) -> None:
    headers = sign_headers([WHSEC], MSG_ID, TS, BODY)
    verify_standard(WHSEC, headers, BODY, now=TS + skew)
    verify_stripe(WHSEC, headers[DEFAULT_SIGNATURE_HEADER], BODY, now=TS + skew)


@pytest.mark.parametrize("skew", [-301, 301, 86_400])
def test_verify_outside_tolerance_fails(skew: int) -> None:
    headers = sign_headers([WHSEC], MSG_ID, TS, BODY)
    with pytest.raises(SignatureVerificationError, match="tolerance"):
        verify_standard(WHSEC, headers, BODY, now=TS + skew)
    with pytest.raises(SignatureVerificationError, match="tolerance"):
        verify_stripe(WHSEC, headers[DEFAULT_SIGNATURE_HEADER], BODY, now=TS + skew)


def test_verify_custom_tolerance() -> None:
    headers = sign_headers([WHSEC], MSG_ID, TS, BODY)
    verify_standard(WHSEC, headers, BODY, tolerance=10, now=TS + 10)
    with pytest.raises(SignatureVerificationError):
        verify_standard(WHSEC, headers, BODY, tolerance=10, now=TS + 11)
    verify_stripe(WHSEC, headers[DEFAULT_SIGNATURE_HEADER], BODY, tolerance=3600, now=TS + 3600)
    with pytest.raises(SignatureVerificationError):
        verify_stripe(WHSEC, headers[DEFAULT_SIGNATURE_HEADER], BODY, tolerance=3600, now=TS + 3601)


def test_verify_uses_the_clock_when_now_is_not_given() -> None:
    headers = sign_headers([WHSEC], MSG_ID, TS, BODY)  # TS is far from the test run's clock
    fresh = sign_headers([WHSEC], MSG_ID, int(time.time()), BODY)
    verify_standard(WHSEC, fresh, BODY)
    verify_stripe(WHSEC, fresh[DEFAULT_SIGNATURE_HEADER], BODY)
    with pytest.raises(SignatureVerificationError):
        verify_standard(WHSEC, headers, BODY, tolerance=60)


@pytest.mark.parametrize("body", [BODY + b" ", b"", BODY.replace(b"999", b"998"), BODY.upper()])
def test_altered_body_fails(body: bytes) -> None:
    headers = sign_headers([WHSEC], MSG_ID, TS, BODY)
    with pytest.raises(SignatureVerificationError, match="match"):
        verify_standard(WHSEC, headers, body, now=TS)
    with pytest.raises(SignatureVerificationError, match="match"):
        verify_stripe(WHSEC, headers[DEFAULT_SIGNATURE_HEADER], body, now=TS)


def test_altered_id_or_timestamp_fails() -> None:
    headers = sign_headers([WHSEC], MSG_ID, TS, BODY)
    with pytest.raises(SignatureVerificationError):
        verify_standard(WHSEC, {**headers, "webhook-id": "log_457"}, BODY, now=TS)
    with pytest.raises(SignatureVerificationError):
        verify_standard(WHSEC, {**headers, "webhook-timestamp": str(TS + 1)}, BODY, now=TS)
    stripe_header = headers[DEFAULT_SIGNATURE_HEADER].replace(f"t={TS}", f"t={TS + 1}")
    with pytest.raises(SignatureVerificationError):
        verify_stripe(WHSEC, stripe_header, BODY, now=TS)


@pytest.mark.parametrize("wrong", [OTHER_WHSEC, PLAIN, WHSEC[:-4] + "AAA="])
def test_wrong_secret_fails(wrong: str) -> None:
    headers = sign_headers([WHSEC], MSG_ID, TS, BODY)
    with pytest.raises(SignatureVerificationError):
        verify_standard(wrong, headers, BODY, now=TS)
    with pytest.raises(SignatureVerificationError):
        verify_stripe(wrong, headers[DEFAULT_SIGNATURE_HEADER], BODY, now=TS)


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_missing_standard_header_fails_naming_it(missing: str) -> None:
    headers = sign_headers([WHSEC], MSG_ID, TS, BODY)
    del headers[missing]
    with pytest.raises(SignatureVerificationError, match=missing):
        verify_standard(WHSEC, headers, BODY, now=TS)


def test_non_integer_standard_timestamp_fails() -> None:
    headers = sign_headers([WHSEC], MSG_ID, TS, BODY)
    with pytest.raises(SignatureVerificationError, match="integer"):
        verify_standard(WHSEC, {**headers, "webhook-timestamp": "soon"}, BODY, now=TS)


def test_verify_standard_with_flask_style_case_insensitive_headers() -> None:
    signed = sign_headers([WHSEC], MSG_ID, TS, BODY)
    headers = Headers()
    headers["Webhook-Id"] = signed["webhook-id"]
    headers["Webhook-Timestamp"] = signed["webhook-timestamp"]
    headers["Webhook-Signature"] = signed["webhook-signature"]
    verify_standard(WHSEC, headers, BODY, now=TS)


@pytest.mark.parametrize(
    "header",
    [
        "",
        "garbage",
        "t=,v1=abc",
        f"t=soon,v1={'0' * 64}",
        f"v1={'0' * 64}",  # no t
        f"t={TS}",  # no v1
        f"t={TS},v0={'0' * 64}",  # only an unknown scheme
        f"t={TS};v1={'0' * 64}",  # wrong separator
    ],
)
def test_malformed_stripe_header_fails(header: str) -> None:
    with pytest.raises(SignatureVerificationError):
        verify_stripe(WHSEC, header, BODY, now=TS)


def test_several_v1_entries_any_match_passes() -> None:
    good = expected_stripe(WHSEC, TS, BODY)
    bad = expected_stripe(OTHER_WHSEC, TS, BODY)
    verify_stripe(WHSEC, f"t={TS},v1={bad},v1={good}", BODY, now=TS)
    verify_stripe(WHSEC, f"t={TS}, v1={good}, v0=ignored, v1={bad}", BODY, now=TS)
    with pytest.raises(SignatureVerificationError):
        verify_stripe(WHSEC, f"t={TS},v1={bad},v1={bad[::-1]}", BODY, now=TS)


def test_several_standard_entries_any_match_passes() -> None:
    good = expected_standard(RAW_KEY, MSG_ID, TS, BODY)
    bad = expected_standard(b"nope", MSG_ID, TS, BODY)
    headers = {"webhook-id": MSG_ID, "webhook-timestamp": str(TS)}
    verify_standard(WHSEC, {**headers, "webhook-signature": f"{bad} v2,{good[3:]} {good}"}, BODY, now=TS)
    with pytest.raises(SignatureVerificationError):
        # The right MAC under another version tag is not a v1 signature.
        verify_standard(WHSEC, {**headers, "webhook-signature": f"{bad} v2,{good[3:]}"}, BODY, now=TS)


@given(
    body=st.binary(max_size=512),
    msg_id=st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=1, max_size=40),
    timestamp=st.integers(min_value=0, max_value=2**40),
    key=st.binary(min_size=1, max_size=64),
)
def test_round_trip_and_tamper_property(body: bytes, msg_id: str, timestamp: int, key: bytes) -> None:
    secret = "whsec_" + base64.b64encode(key).decode("ascii")
    headers = sign_headers([secret], msg_id, timestamp, body)
    verify_standard(secret, headers, body, now=timestamp)
    verify_stripe(secret, headers[DEFAULT_SIGNATURE_HEADER], body, now=timestamp)
    tampered = body + b"\x00"
    with pytest.raises(SignatureVerificationError):
        verify_standard(secret, headers, tampered, now=timestamp)
    with pytest.raises(SignatureVerificationError):
        verify_stripe(secret, headers[DEFAULT_SIGNATURE_HEADER], tampered, now=timestamp)


# -- secrets ----------------------------------------------------------------------------------------


def test_secret_key_of_whsec_and_plain_secrets() -> None:
    assert secret_key(WHSEC) == RAW_KEY
    assert secret_key(PLAIN) == PLAIN.encode("utf-8")
    assert secret_key("whsec-looks-similar") == b"whsec-looks-similar"


def test_empty_secret_is_rejected_with_advice() -> None:
    with pytest.raises(InvalidSecretError) as info:
        secret_key("")
    assert info.value.field == "secret"
    assert "generate_secret()" in str(info.value)
    with pytest.raises(InvalidSecretError):
        stripe_signature("", TS, BODY)
    with pytest.raises(InvalidSecretError):
        sign_headers([""], MSG_ID, TS, BODY)


@pytest.mark.parametrize(
    "secret",
    [
        "whsec_",
        "whsec_not base64 at all",
        "whsec_abc",  # bad padding
        "whsec_c2VjcmV0!",  # a character outside the alphabet
        "whsec_stripe_style_signing_secret_key_32_bytes!!",  # the seed's example: not base64
    ],
)
def test_invalid_whsec_secret_is_rejected_without_echoing_it(secret: str) -> None:
    with pytest.raises(InvalidSecretError) as info:
        secret_key(secret)
    error = info.value
    assert error.field == "secret"
    assert "generate_secret()" in str(error)
    assert "base64" in str(error)
    tail = secret[len("whsec_") :]
    for text in (str(error), repr(error), error.message):
        # The bare prefix is named in the advice; anything after it must not be echoed.
        if tail:
            assert secret not in text
            assert tail not in text


def test_generate_secret() -> None:
    first, second = generate_secret(), generate_secret()
    assert first != second
    for secret in (first, second):
        assert secret.startswith("whsec_")
        raw = base64.b64decode(secret[len("whsec_") :], validate=True)
        assert len(raw) == 32
        assert secret_key(secret) == raw
    assert len({generate_secret() for _ in range(50)}) == 50


def test_generated_secret_works_with_standardwebhooks() -> None:
    secret = generate_secret()
    now = int(time.time())
    headers = sign_headers([secret], MSG_ID, now, BODY)
    assert Webhook(secret).verify(BODY, headers) == {"order_id": "ord_999"}


@pytest.mark.parametrize("secret", [WHSEC, PLAIN])
def test_signature_errors_never_include_the_secret(secret: str) -> None:
    headers = sign_headers([secret], MSG_ID, TS, BODY)
    stripe_header = headers[DEFAULT_SIGNATURE_HEADER]
    failures: list[Callable[[], object]] = [
        lambda: verify_standard(secret, headers, BODY + b"x", now=TS),
        lambda: verify_standard(secret, headers, BODY, now=TS + 10_000),
        lambda: verify_standard(secret, {"webhook-id": MSG_ID}, BODY, now=TS),
        lambda: verify_standard(secret, {**headers, "webhook-timestamp": "x"}, BODY, now=TS),
        lambda: verify_stripe(secret, stripe_header, BODY + b"x", now=TS),
        lambda: verify_stripe(secret, stripe_header, BODY, now=TS + 10_000),
        lambda: verify_stripe(secret, "t=1", BODY, now=TS),
    ]
    for fail in failures:
        with pytest.raises(SignatureVerificationError) as info:
            fail()
        assert secret not in str(info.value)
        assert secret not in repr(info.value)
        if secret.startswith("whsec_"):
            assert secret[len("whsec_") :] not in str(info.value)


# -- why a verification failed ----------------------------------------------------------------------

F = VerificationFailure
_GOOD = sign_headers([WHSEC], MSG_ID, TS, BODY)
_GOOD_STRIPE = _GOOD[DEFAULT_SIGNATURE_HEADER]
_V1 = expected_stripe(WHSEC, TS, BODY)


@pytest.mark.parametrize(
    ("headers", "body", "now", "reason"),
    [
        pytest.param(
            {k: v for k, v in _GOOD.items() if k != "webhook-id"}, BODY, TS, F.MISSING_HEADER, id="no-id"
        ),
        pytest.param({**_GOOD, "webhook-id": ""}, BODY, TS, F.MISSING_HEADER, id="empty-id"),
        pytest.param(
            {"webhook-id": MSG_ID, "webhook-signature": "v1,x"}, BODY, TS, F.MISSING_HEADER, id="no-ts"
        ),
        pytest.param({}, BODY, TS, F.MISSING_HEADER, id="nothing"),
        pytest.param(
            {"webhook-id": MSG_ID, "webhook-timestamp": str(TS)}, BODY, TS, F.MISSING_SIGNATURE, id="no-sig"
        ),
        pytest.param({**_GOOD, "webhook-signature": ""}, BODY, TS, F.MISSING_SIGNATURE, id="empty-sig"),
        pytest.param({**_GOOD, "webhook-timestamp": "soon"}, BODY, TS, F.MALFORMED_HEADER, id="ts-not-int"),
        pytest.param({**_GOOD, "webhook-timestamp": "9" * 5000}, BODY, TS, F.MALFORMED_HEADER, id="ts-huge"),
        pytest.param(_GOOD, BODY, TS + 301, F.TIMESTAMP_TOO_OLD, id="old"),
        pytest.param(_GOOD, BODY, TS - 301, F.TIMESTAMP_IN_FUTURE, id="future"),
        pytest.param(_GOOD, BODY + b" ", TS, F.NO_MATCHING_SIGNATURE, id="body"),
        pytest.param({**_GOOD, "webhook-signature": "v2,abc"}, BODY, TS, F.NO_MATCHING_SIGNATURE, id="v2"),
    ],
)
def test_standard_failures_carry_their_reason(
    headers: dict[str, str], body: bytes, now: int, reason: VerificationFailure
) -> None:
    with pytest.raises(SignatureVerificationError) as info:
        verify_standard(WHSEC, headers, body, now=now)
    assert info.value.reason is reason


@pytest.mark.parametrize(
    ("header", "body", "now", "reason"),
    [
        pytest.param(None, BODY, TS, F.MISSING_SIGNATURE, id="absent"),
        pytest.param("", BODY, TS, F.MISSING_SIGNATURE, id="empty"),
        pytest.param(f"t={TS}", BODY, TS, F.MISSING_SIGNATURE, id="no-v1"),
        pytest.param(f"t={TS},v0={_V1}", BODY, TS, F.MISSING_SIGNATURE, id="only-v0"),
        pytest.param(f"v1={_V1}", BODY, TS, F.MALFORMED_HEADER, id="no-t"),
        pytest.param("garbage", BODY, TS, F.MALFORMED_HEADER, id="garbage"),
        pytest.param(f"t=soon,v1={_V1}", BODY, TS, F.MALFORMED_HEADER, id="t-not-int"),
        pytest.param(f"t=,v1={_V1}", BODY, TS, F.MALFORMED_HEADER, id="t-empty"),
        pytest.param(_GOOD_STRIPE, BODY, TS + 301, F.TIMESTAMP_TOO_OLD, id="old"),
        pytest.param(_GOOD_STRIPE, BODY, TS - 301, F.TIMESTAMP_IN_FUTURE, id="future"),
        pytest.param(_GOOD_STRIPE, BODY + b" ", TS, F.NO_MATCHING_SIGNATURE, id="body"),
        pytest.param(f"t={TS},v1=zz", BODY, TS, F.NO_MATCHING_SIGNATURE, id="not-hex"),
    ],
)
def test_stripe_failures_carry_their_reason(
    header: str | None, body: bytes, now: int, reason: VerificationFailure
) -> None:
    with pytest.raises(SignatureVerificationError) as info:
        verify_stripe(WHSEC, header, body, now=now)
    assert info.value.reason is reason


def test_the_reason_is_checked_in_a_fixed_order_whatever_the_secrets() -> None:
    # Headers and timestamp are read before any HMAC: the reason does not depend on the secret.
    for secrets in ([WHSEC], [OTHER_WHSEC], [OTHER_WHSEC, PLAIN]):
        with pytest.raises(SignatureVerificationError) as info:
            verify_standard(secrets, {**_GOOD, "webhook-timestamp": str(TS - 999)}, BODY + b"x", now=TS)
        assert info.value.reason is F.TIMESTAMP_TOO_OLD


def test_verify_takes_a_list_of_secrets_any_one_verifies() -> None:
    headers = sign_headers([PLAIN], MSG_ID, TS, BODY)
    for secrets in ([PLAIN], [OTHER_WHSEC, PLAIN], (PLAIN, WHSEC)):
        assert verify_standard(secrets, headers, BODY, now=TS).msg_id == MSG_ID
        assert verify_stripe(secrets, headers[DEFAULT_SIGNATURE_HEADER], BODY, now=TS).timestamp == TS
    for wrong in ([OTHER_WHSEC], [OTHER_WHSEC, WHSEC]):
        with pytest.raises(SignatureVerificationError) as info:
            verify_standard(wrong, headers, BODY, now=TS)
        assert info.value.reason is F.NO_MATCHING_SIGNATURE
        with pytest.raises(SignatureVerificationError):
            verify_stripe(wrong, headers[DEFAULT_SIGNATURE_HEADER], BODY, now=TS)
    with pytest.raises(InvalidSecretError) as empty:
        verify_standard([], headers, BODY, now=TS)
    assert empty.value.field == "secrets"
    with pytest.raises(InvalidSecretError):
        verify_stripe([], headers[DEFAULT_SIGNATURE_HEADER], BODY, now=TS)


def test_verify_returns_what_it_verified() -> None:
    headers = sign_headers([WHSEC, PLAIN], MSG_ID, TS, BODY)
    standard = verify_standard(WHSEC, headers, BODY, now=TS)
    assert (standard.msg_id, standard.timestamp) == (MSG_ID, TS)
    stripe_header = verify_stripe(PLAIN, headers[DEFAULT_SIGNATURE_HEADER], BODY, now=TS)
    assert stripe_header.timestamp == TS
    assert stripe_header.signatures == (expected_stripe(WHSEC, TS, BODY), expected_stripe(PLAIN, TS, BODY))


def test_headers_are_read_before_the_body_exists() -> None:
    # A receiver checks the headers and the timestamp first, and reads the body only if they pass.
    parsed = StandardHeaders.read(_GOOD, now=TS)
    parsed.verify([WHSEC], BODY)
    with pytest.raises(SignatureVerificationError) as info:
        parsed.verify([WHSEC], BODY + b"x")
    assert info.value.reason is F.NO_MATCHING_SIGNATURE
    stripe_header = StripeHeader.read(_GOOD_STRIPE, now=TS, header="X-Sig")
    stripe_header.verify(WHSEC, BODY)
    with pytest.raises(SignatureVerificationError, match="X-Sig") as missing:
        StripeHeader.read(None, now=TS, header="X-Sig")
    assert missing.value.reason is F.MISSING_SIGNATURE


def test_the_reasons_are_strings_that_name_themselves() -> None:
    assert {reason.value for reason in VerificationFailure} == {
        "missing_header",
        "malformed_header",
        "missing_signature",
        "timestamp_too_old",
        "timestamp_in_future",
        "no_matching_signature",
    }
    error = SignatureVerificationError(F.NO_MATCHING_SIGNATURE, "no webhook-signature matches the body")
    assert str(error) == "no webhook-signature matches the body"
    assert error.reason == "no_matching_signature"


def test_a_signature_that_is_not_utf8_does_not_match_and_does_not_crash() -> None:
    headers = {**_GOOD, "webhook-signature": "v1,\ud800 " + _GOOD["webhook-signature"]}
    verify_standard(WHSEC, headers, BODY, now=TS)
    with pytest.raises(SignatureVerificationError) as info:
        verify_stripe(WHSEC, f"t={TS},v1=\ud800", BODY, now=TS)
    assert info.value.reason is F.NO_MATCHING_SIGNATURE
