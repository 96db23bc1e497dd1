"""Completion callbacks' pure cores: the SSRF allowlist policy, filters, targets, envelope, outcome."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from datetime import datetime, timedelta, timezone

import pytest
import standardwebhooks
from hypothesis import given, settings
from hypothesis import strategies as st

from flask_harvest.callbacks import (
    CallbackPolicy,
    CallbackSecret,
    CallbackTarget,
    CallbackTargetRejected,
    DeliveryState,
    EventFilter,
    RejectionType,
    build_envelope,
    callback_retry_policy,
    normalise_targets,
    parse_allowlist,
    parse_targets,
)
from flask_harvest.callbacks.envelope import headers_for, rfc3339_ms
from flask_harvest.errors import ConfigurationError, InvalidFieldError
from flask_harvest.outbound.attempt import FailureKind, HttpResponse, TransportError, judge
from flask_harvest.outbound.signing import generate_secret
from flask_harvest.receiver import verify_completion_callback
from flask_harvest.workflows.models import TERMINAL_STATES, Execution, ExecutionState, utcnow

NOW = datetime(2026, 7, 5, 12, 34, 56, 789000, tzinfo=timezone.utc)
POLICY = CallbackPolicy(allowlist=parse_allowlist("*.example.com, api.partner.io, pinned.example.org:8443"))


def rejection(url: object, policy: CallbackPolicy = POLICY) -> RejectionType | None:
    found = policy.check(url)
    return found.type if found is not None else None


# -- the policy ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/h",
        "https://a.b.example.com/h",
        "https://HOOKS.Example.COM./h",
        "https://api.partner.io/x?y=1",
        "https://pinned.example.org:8443/h",
        "https://xn--bcher-kva.example.com/h",
        "https://bücher.example.com/h",
    ],
)
def test_allowed_targets(url: str) -> None:
    assert POLICY.check(url) is None


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://hooks.example.com/h", RejectionType.SCHEME_NOT_ALLOWED),
        ("ftp://hooks.example.com/h", RejectionType.SCHEME_NOT_ALLOWED),
        ("https://example.com/h", RejectionType.HOST_NOT_ALLOWED),
        ("https://evilexample.com/h", RejectionType.HOST_NOT_ALLOWED),
        ("https://example.com.evil.net/h", RejectionType.HOST_NOT_ALLOWED),
        ("https://hooks.example.com.evil.net/h", RejectionType.HOST_NOT_ALLOWED),
        ("https://partner.io/h", RejectionType.HOST_NOT_ALLOWED),
        ("https://x.api.partner.io/h", RejectionType.HOST_NOT_ALLOWED),
        ("https://user:pass@hooks.example.com/h", RejectionType.USERINFO),
        ("https://user@hooks.example.com/h", RejectionType.USERINFO),
        ("https://hooks.example.com@evil.net/h", RejectionType.USERINFO),
        ("https://pinned.example.org/h", RejectionType.PORT_NOT_ALLOWED),
        ("https://pinned.example.org:443/h", RejectionType.PORT_NOT_ALLOWED),
        ("https://pinned.example.org:8444/h", RejectionType.PORT_NOT_ALLOWED),
        ("https://10.0.0.5/hook", RejectionType.IP_LITERAL),
        ("https://93.184.216.34/hook", RejectionType.IP_LITERAL),
        ("https://2130706433/hook", RejectionType.IP_LITERAL),
        ("https://0x7f.1/hook", RejectionType.IP_LITERAL),
        ("https://0177.0.0.1/hook", RejectionType.IP_LITERAL),
        ("https://[::1]/hook", RejectionType.IP_LITERAL),
        ("https://[::ffff:127.0.0.1]/hook", RejectionType.IP_LITERAL),
        ("https://localhost/hook", RejectionType.LOCALHOST_NAME),
        ("https://ⓛocalhost/hook", RejectionType.LOCALHOST_NAME),
        ("https://foo.localhost/hook", RejectionType.LOCALHOST_NAME),
        ("https://[fe80::1%25eth0]/hook", RejectionType.INVALID_URL),
        ("https://hooks.example.com:0/h", RejectionType.INVALID_URL),
        ("https://hooks.example.com:99999/h", RejectionType.INVALID_URL),
        ("https:///h", RejectionType.INVALID_URL),
        ("hooks.example.com/h", RejectionType.SCHEME_NOT_ALLOWED),
        ("https://hooks.example.com\\@evil.net/", RejectionType.INVALID_URL),
        ("https://hooks .example.com/", RejectionType.INVALID_URL),
        ("https://*.example.com/", RejectionType.INVALID_URL),
        (None, RejectionType.INVALID_URL),
        (42, RejectionType.INVALID_URL),
    ],
)
def test_refused_targets(url: object, expected: RejectionType) -> None:
    assert rejection(url) is expected


def test_no_allowlist_refuses_everything() -> None:
    assert rejection("https://hooks.example.com/", CallbackPolicy()) is RejectionType.NO_ALLOWLIST


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1",
        "0.0.0.0", "[::1]", "[fd00::1]", "[fe80::1]", "[::ffff:10.0.0.1]", "[64:ff9b::a9fe:a9fe]",
        "[2002:7f00:1::]", "[::ffff:169.254.169.254]", "2852039166", "0xa9.0xfe.0xa9.0xfe",
    ],
)  # fmt: skip
def test_blocked_addresses_stay_refused_with_ip_literals_allowed(address: str) -> None:
    host = address.strip("[]")
    policy = CallbackPolicy(allowlist=(*POLICY.allowlist, *parse_allowlist(address)), allow_ip_literals=True)
    assert rejection(f"https://{address}/h", policy) is RejectionType.BLOCKED_ADDRESS, host


def test_an_allowlisted_public_ip_literal_passes_only_when_literals_are_allowed() -> None:
    listed = parse_allowlist("93.184.216.34, [2606:2800:220:1::1]")
    assert rejection("https://93.184.216.34/h", CallbackPolicy(listed)) is RejectionType.IP_LITERAL
    policy = CallbackPolicy(listed, allow_ip_literals=True)
    assert policy.check("https://93.184.216.34/h") is None
    assert policy.check("https://1572395042/h") is None  # the same address, in decimal
    assert policy.check("https://[2606:2800:220:1:0::1]/h") is None
    assert rejection("https://93.184.216.35/h", policy) is RejectionType.HOST_NOT_ALLOWED


def test_development_setting_reaches_loopback_over_http_but_keeps_the_allowlist() -> None:
    policy = CallbackPolicy(parse_allowlist("127.0.0.1"), allow_private=True)
    assert policy.check("http://127.0.0.1:8080/h") is None
    assert rejection("http://10.0.0.1/h", policy) is RejectionType.HOST_NOT_ALLOWED
    assert rejection("http://localhost/h", policy) is RejectionType.LOCALHOST_NAME


def test_development_setting_opens_plain_http_only_to_the_addresses_it_opens() -> None:
    listed = parse_allowlist("api.example.com, 127.0.0.1, 10.0.0.5, 93.184.216.34")
    policy = CallbackPolicy(listed, allow_private=True)
    assert policy.check("http://127.0.0.1:8080/h") is None
    assert policy.check("http://10.0.0.5/h") is None
    assert policy.check("https://api.example.com/h") is None
    assert policy.check("https://93.184.216.34/h") is None
    # A name could resolve to a public host, and a public address is one: no clear text to them.
    assert rejection("http://api.example.com/h", policy) is RejectionType.SCHEME_NOT_ALLOWED
    assert rejection("http://93.184.216.34/h", policy) is RejectionType.SCHEME_NOT_ALLOWED
    found = policy.check("http://api.example.com/h")
    assert found is not None and "HARVEST_COMPLETION_CALLBACK_ALLOW_HTTP" in found.message
    both = CallbackPolicy(listed, allow_http=True, allow_private=True)
    assert both.check("http://api.example.com/h") is None
    assert both.check("http://93.184.216.34/h") is None


def test_rejection_json_is_typed() -> None:
    found = POLICY.check("https://evilexample.com/x")
    assert found is not None
    data = found.to_json()
    assert data["type"] == "HostNotAllowed" and data["host"] == "evilexample.com"
    assert json.loads(json.dumps(data)) == data
    port = POLICY.check("https://pinned.example.org:9/")
    assert port is not None and port.to_json()["port"] == 9


@pytest.mark.parametrize(
    "entry", ["*.", "*", "*.*.example.com", "a/b", "u@host", "*.10.0.0.1", "localhost", "ex ample.com"]
)
def test_bad_allowlist_entries_fail_configuration(entry: str) -> None:
    with pytest.raises(ConfigurationError, match="HARVEST_COMPLETION_CALLBACK_ALLOWLIST"):
        parse_allowlist(entry)


LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)


@settings(max_examples=300)
@given(st.lists(LABEL, min_size=1, max_size=4), st.lists(LABEL, min_size=1, max_size=3))
def test_wildcard_matches_only_proper_subdomains(prefix: list[str], suffix: list[str]) -> None:
    domain = ".".join(suffix) + ".com"
    policy = CallbackPolicy(parse_allowlist(f"*.{domain}"))
    sub = ".".join(prefix) + "." + domain
    glued = "".join(prefix) + domain  # "evilexample.com" for "*.example.com"
    if any(label.isdigit() for label in [*prefix, *suffix]) and sub.split(".")[-1].isdigit():
        return
    assert policy.check(f"https://{sub}/") is None
    assert rejection(f"https://{domain}/", policy) is RejectionType.HOST_NOT_ALLOWED
    assert rejection(f"https://{glued}/", policy) is RejectionType.HOST_NOT_ALLOWED
    assert rejection(f"https://{sub}.evil.net/", policy) is RejectionType.HOST_NOT_ALLOWED


@settings(max_examples=500)
@given(st.text(max_size=120))
def test_any_text_gets_an_answer_never_an_exception(text: str) -> None:
    result = POLICY.check(text)
    if result is not None:
        json.dumps(result.to_json())


@settings(max_examples=500)
@given(st.ip_addresses())
def test_no_ip_literal_passes_without_the_setting_in_any_spelling(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    spellings = [f"[{address}]" if address.version == 6 else str(address)]
    if address.version == 4:
        spellings += [
            str(int(address)),
            hex(int(address)),
            ".".join(oct(int(b)).replace("o", "") for b in address.packed),
        ]
    else:
        spellings.append(f"[{address.exploded}]")
    policy = CallbackPolicy(parse_allowlist("*.example.com"))
    for host in spellings:
        assert policy.check(f"https://{host}/h") is not None, host


@settings(max_examples=500)
@given(st.ip_addresses())
def test_non_global_addresses_are_refused_even_when_listed(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    host = f"[{address}]" if address.version == 6 else str(address)
    policy = CallbackPolicy(parse_allowlist(host), allow_ip_literals=True)
    result = policy.check(f"https://{host}/h")
    if not address.is_global or address.is_private or address.is_loopback or address.is_link_local:
        assert result is not None and result.type is RejectionType.BLOCKED_ADDRESS, host


@settings(max_examples=300)
@given(
    st.sampled_from(["user", "u:p", "a%40b", ""]), st.sampled_from(["hooks.example.com", "x.example.com:443"])
)
def test_userinfo_is_always_refused(userinfo: str, host: str) -> None:
    assert rejection(f"https://{userinfo}@{host}/h") is RejectionType.USERINFO


# -- filters ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", TERMINAL_STATES)
def test_filters_against_every_terminal_state(state: ExecutionState) -> None:
    assert EventFilter.any_terminal().matches(state)
    assert EventFilter.completed_only().matches(state) is (state is ExecutionState.COMPLETED)
    failed_or_timed_out = EventFilter.from_json({"type": "States", "data": ["Failed", "TimedOut"]})
    assert failed_or_timed_out.matches(state) is (state in (ExecutionState.FAILED, ExecutionState.TIMED_OUT))
    for open_state in (ExecutionState.PENDING, ExecutionState.RUNNING):
        assert not EventFilter.any_terminal().matches(open_state)


def test_any_terminal_never_matches_continued_as_new() -> None:
    """The rule: AnyTerminal fires on the five terminal states, never on ContinuedAsNew, which is
    not a terminal outcome for the logical run."""
    assert ExecutionState.CONTINUED_AS_NEW not in TERMINAL_STATES
    assert not EventFilter.any_terminal().matches(ExecutionState.CONTINUED_AS_NEW)


def test_filter_json_shapes_round_trip() -> None:
    for shape in (
        {"type": "CompletedOnly"},
        {"type": "AnyTerminal"},
        {"type": "States", "data": ["Failed", "TimedOut"]},
    ):
        assert EventFilter.from_json(shape).to_json() == shape
    assert EventFilter.from_json({"type": "States", "data": ["TimedOut", "Failed", "Failed"]}).to_json() == {
        "type": "States",
        "data": ["Failed", "TimedOut"],
    }


@pytest.mark.parametrize(
    "shape",
    [
        {"type": "States", "data": []},
        {"type": "States", "data": ["Running"]},
        {"type": "States", "data": ["ContinuedAsNew"]},
        {"type": "States", "data": "Failed"},
        {"type": "States"},
        {"type": "Whatever"},
        {"type": "AnyTerminal", "data": []},
        {"kind": "AnyTerminal"},
        "AnyTerminal",
        [],
    ],
)
def test_bad_filters_are_refused(shape: object) -> None:
    with pytest.raises(InvalidFieldError):
        EventFilter.from_json(shape)


@settings(max_examples=300)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=10),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
        max_leaves=8,
    )
)
def test_any_json_filter_parses_or_is_refused_cleanly(data: object) -> None:
    try:
        parsed = EventFilter.from_json(data)
    except InvalidFieldError:
        return
    assert EventFilter.from_json(parsed.to_json()) == parsed


# -- targets ---------------------------------------------------------------------------------------


def test_own_targets_first_then_defaults_deduplicated_by_url_and_filter() -> None:
    own = parse_targets(
        [
            {"url": "https://a.example.com/h", "filter": {"type": "AnyTerminal"}},
            {"url": "https://a.example.com/h", "filter": {"type": "CompletedOnly"}},
            {"url": "https://a.example.com/h", "filter": {"type": "AnyTerminal"}},
        ],
        POLICY,
    )
    defaults = [
        CallbackTarget("https://b.example.com/h", EventFilter.completed_only()),
        CallbackTarget("https://a.example.com/h", EventFilter.any_terminal()),
    ]
    stored = normalise_targets(own, defaults)
    assert stored == [
        {"callback_index": 0, "url": "https://a.example.com/h", "filter": {"type": "AnyTerminal"}},
        {"callback_index": 1, "url": "https://a.example.com/h", "filter": {"type": "CompletedOnly"}},
        {"callback_index": 2, "url": "https://b.example.com/h", "filter": {"type": "CompletedOnly"}},
    ]
    assert normalise_targets([], []) == []


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["AnyTerminal", "CompletedOnly"])),
        max_size=8,
    )
)
def test_normalise_is_stable_and_unique(pairs: list[tuple[str, str]]) -> None:
    targets = [
        CallbackTarget(f"https://{h}.example.com/", EventFilter.from_json({"type": t})) for h, t in pairs
    ]
    stored = normalise_targets(targets, [])
    keys = [(s["url"], s["filter"]["type"]) for s in stored]
    assert len(keys) == len(set(keys))
    assert [s["callback_index"] for s in stored] == list(range(len(stored)))
    assert normalise_targets(targets + targets, targets) == stored


@pytest.mark.parametrize(
    "data",
    [
        "https://a.example.com/",
        [{"url": 5}],
        [{"filter": {"type": "AnyTerminal"}}],
        [{"url": "https://a.example.com/", "extra": 1}],
        [{"url": "https://a.example.com/", "filter": {"type": "Nope"}}],
        [{"url": "https://10.0.0.1/"}],
        [{"url": f"https://h{i}.example.com/"} for i in range(17)],
    ],
)
def test_bad_targets_are_rejected_with_a_422_error(data: object) -> None:
    with pytest.raises(CallbackTargetRejected) as caught:
        parse_targets(data, POLICY)
    assert caught.value.http_status == 422
    json.dumps(caught.value.error_details())


def test_a_refused_target_carries_the_typed_rejection() -> None:
    with pytest.raises(CallbackTargetRejected) as caught:
        parse_targets([{"url": "https://ok.example.com/"}, {"url": "https://169.254.169.254/"}], POLICY)
    assert caught.value.index == 1
    assert caught.value.error_details()["rejection"]["type"] == "IpLiteralNotAllowed"


# -- envelope and signature ------------------------------------------------------------------------


def _execution(state: ExecutionState, **extra: object) -> Execution:
    return Execution(
        execution_id="9c1e0000-0000-0000-0000-000000000001",
        workflow_name="process_refund",
        workflow_id="refund-r-123",
        input={"refund_id": "r-123"},
        state=state,
        created_at=NOW,
        completed_at=NOW,
        **extra,  # type: ignore[arg-type]
    )


def test_envelope_bytes_and_field_order_for_completed() -> None:
    body = build_envelope(
        "b6b6", _execution(ExecutionState.COMPLETED, output={"refunded": True, "amount_cents": 4200})
    )
    assert body == (
        b'{"delivery_id":"b6b6","execution_id":"9c1e0000-0000-0000-0000-000000000001",'
        b'"workflow_name":"process_refund","workflow_id":"refund-r-123","state":"Completed",'
        b'"result":{"refunded":true,"amount_cents":4200},"completed_at":"2026-07-05T12:34:56.789Z"}'
    )


@pytest.mark.parametrize("state", [s for s in TERMINAL_STATES if s is not ExecutionState.COMPLETED])
def test_envelope_has_error_not_result_for_the_other_states(state: ExecutionState) -> None:
    data = json.loads(build_envelope("d", _execution(state, error="boom", output={"x": 1})))
    assert list(data) == [
        "delivery_id",
        "execution_id",
        "workflow_name",
        "workflow_id",
        "state",
        "error",
        "completed_at",
    ]
    assert data["error"] == "boom" and data["state"] == state.value
    assert "error" not in json.loads(build_envelope("d", _execution(state)))


def test_signature_recomputed_independently_and_verified() -> None:
    body = build_envelope("d", _execution(ExecutionState.COMPLETED, output=[1, "é"]))
    secret = CallbackSecret(b"a-shared-hmac-secret")
    expected = "sha256=" + hmac.new(b"a-shared-hmac-secret", body, hashlib.sha256).hexdigest()
    assert secret.sign(body) == expected
    assert verify_completion_callback(b"a-shared-hmac-secret", body, expected)
    assert not verify_completion_callback(b"other", body, expected)
    assert not verify_completion_callback(b"a-shared-hmac-secret", body + b" ", expected)
    assert not verify_completion_callback(b"a-shared-hmac-secret", body, None)


def test_each_attempt_carries_standard_webhooks_headers_a_standard_library_verifies() -> None:
    body = build_envelope("d-1", _execution(ExecutionState.COMPLETED, output={"ok": True}))
    now = utcnow()
    headers = headers_for(CallbackSecret(b"a-shared-hmac-secret"), "d-1", body, now)
    # The seed's two headers, exactly as before: the body's HMAC and the attempt's time.
    assert headers["X-Harvest-Signature"] == (
        "sha256=" + hmac.new(b"a-shared-hmac-secret", body, hashlib.sha256).hexdigest()
    )
    assert headers["X-Harvest-Timestamp"] == rfc3339_ms(now)
    assert headers["webhook-id"] == "d-1"
    assert headers["webhook-timestamp"] == str(int(now.timestamp()))
    # The standardwebhooks library takes bytes as the key itself, as the secret's UTF-8 is here.
    assert standardwebhooks.Webhook(b"a-shared-hmac-secret").verify(body, headers) == json.loads(body)
    # A whsec_ secret keys the Standard Webhooks signature with its decoded bytes, as that
    # library (and the project's webhook signing) does; X-Harvest-Signature keys with its text.
    whsec = generate_secret()
    signed = headers_for(CallbackSecret(whsec), "d-1", body, now)
    standardwebhooks.Webhook(whsec).verify(body, signed)
    assert (
        signed["X-Harvest-Signature"]
        == "sha256=" + hmac.new(whsec.encode(), body, hashlib.sha256).hexdigest()
    )
    lowercase = {k.lower(): v for k, v in signed.items()}  # as Flask's request.headers finds them
    assert verify_completion_callback(whsec, body, headers=lowercase, tolerance_seconds=300)


def test_a_captured_callback_replayed_with_a_fresh_timestamp_is_not_fresh() -> None:
    secret = "a-shared-hmac-secret"
    body = build_envelope("d-1", _execution(ExecutionState.COMPLETED, output=1))
    captured = headers_for(CallbackSecret(secret), "d-1", body, NOW)
    at = NOW.timestamp()
    fresh = {k.lower(): v for k, v in captured.items()}
    assert verify_completion_callback(secret, body, headers=fresh, tolerance_seconds=300, now=at + 10)
    assert not verify_completion_callback(secret, body, headers=fresh, tolerance_seconds=300, now=at + 1000)
    later = NOW + timedelta(seconds=1000)
    # The unsigned X-Harvest-Timestamp made fresh: the signed webhook-timestamp still says when.
    replay = {**fresh, "x-harvest-timestamp": rfc3339_ms(later)}
    assert not verify_completion_callback(secret, body, headers=replay, tolerance_seconds=300, now=at + 1000)
    # The signed one made fresh: its signature no longer matches.
    replay = {**replay, "webhook-timestamp": str(int(later.timestamp()))}
    assert not verify_completion_callback(secret, body, headers=replay, tolerance_seconds=300, now=at + 1000)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(secret.encode()).verify(body, replay)
    # Freshness is never claimed from the unsigned header alone.
    with pytest.raises(InvalidFieldError, match="headers"):
        verify_completion_callback(
            secret, body, captured["X-Harvest-Signature"], timestamp=rfc3339_ms(later),
            tolerance_seconds=300, now=at + 1000,
        )  # fmt: skip
    # Without a tolerance the body's signature alone is checked, from the argument or the headers.
    assert verify_completion_callback(secret, body, captured["X-Harvest-Signature"])
    assert verify_completion_callback(secret, body, headers=replay)
    assert not verify_completion_callback(secret, body + b" ", headers=fresh, tolerance_seconds=300, now=at)


def test_secret_never_shows() -> None:
    secret = CallbackSecret("s3cr3t-value")
    assert "s3cr3t" not in repr(secret) and "s3cr3t" not in str(secret) and "s3cr3t" not in f"{secret}"
    import pickle

    with pytest.raises(TypeError):
        pickle.dumps(secret)


# -- outcome ---------------------------------------------------------------------------------------

POLICY_10 = callback_retry_policy()


def _response(status: int, retry_after: str | None = None) -> HttpResponse:
    return HttpResponse(status, retry_after, "", 3)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 409, 410, 413, 422, 451])
def test_permanent_4xx_fails_at_once(status: int) -> None:
    outcome = judge(_response(status), attempt=1, policy=POLICY_10, now=NOW)
    assert outcome.state is DeliveryState.DLQ and outcome.status == status


@pytest.mark.parametrize(
    ("status", "retry_after"),
    [(408, None), (421, None), (425, None), (429, None), (413, "5"), (500, None), (503, None), (302, None)],
)
def test_transient_statuses_retry(status: int, retry_after: str | None) -> None:
    outcome = judge(_response(status, retry_after), attempt=1, policy=POLICY_10, now=NOW)
    assert outcome.state is DeliveryState.PENDING


def test_backoff_schedule_doubles_and_caps() -> None:
    delays = [POLICY_10.delay_ms(n) for n in range(1, 10)]
    assert delays == [30_000, 60_000, 120_000, 240_000, 480_000, 600_000, 600_000, 600_000, 600_000]
    outcome = judge(_response(500), attempt=3, policy=POLICY_10, now=NOW)
    assert outcome.next_attempt_at == NOW + timedelta(seconds=120)


def test_retry_after_floors_the_delay_in_both_forms_and_is_capped() -> None:
    assert judge(
        _response(429, "90"), attempt=1, policy=POLICY_10, now=NOW
    ).next_attempt_at == NOW + timedelta(seconds=90)
    assert judge(
        _response(429, "5"), attempt=1, policy=POLICY_10, now=NOW
    ).next_attempt_at == NOW + timedelta(seconds=30)
    date = (NOW + timedelta(seconds=200)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    at = judge(_response(503, date), attempt=1, policy=POLICY_10, now=NOW).next_attempt_at
    assert at is not None and timedelta(seconds=199) <= at - NOW <= timedelta(seconds=200)
    capped = judge(_response(503, "86400"), attempt=1, policy=POLICY_10, now=NOW).next_attempt_at
    assert capped == NOW + timedelta(minutes=15)


def test_exhaustion_and_ssrf_refusal_fail() -> None:
    assert judge(_response(503, "10"), attempt=10, policy=POLICY_10, now=NOW).state is DeliveryState.DLQ
    refused = TransportError(FailureKind.SSRF, "refused", 0)
    assert judge(refused, attempt=1, policy=POLICY_10, now=NOW).state is DeliveryState.DLQ
    timeout = TransportError(FailureKind.TIMEOUT, "read timed out", 10)
    assert judge(timeout, attempt=1, policy=POLICY_10, now=NOW).state is DeliveryState.PENDING


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30),
    lambda c: (
        st.lists(c, max_size=4)
        | st.dictionaries(st.sampled_from(["url", "filter", "type", "data", "x"]), c, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=400)
@given(JSON)
def test_any_json_as_completion_callbacks_is_accepted_or_rejected_cleanly(data: object) -> None:
    rejected: CallbackTargetRejected | None = None
    try:
        targets = parse_targets(data, POLICY)
    except CallbackTargetRejected as exc:
        rejected, targets = exc, []
    if rejected is not None:
        assert rejected.http_status == 422
        json.dumps(rejected.error_details())
    assert all(POLICY.check(t.url) is None for t in targets)


# -- the host judged is the host the transport connects to -----------------------------------------


def _wire_host(url: str) -> str | None:
    """The host the transport (requests over urllib3) connects to, or ``None`` if it cannot send."""
    from urllib3.util import parse_url

    try:
        host = parse_url(url).host
    except ValueError:
        return None
    return host[:-1] if host is not None and host.endswith(".") else host


@pytest.mark.parametrize(
    "url",
    [
        # IDNA 2003 (Python's codec) maps "ß" to "ss"; the transport's IDNA 2008 keeps it: the
        # policy would judge fass.example.com while the POST goes to xn--fa-hia.example.com.
        "https://faß.example.com/h",
        "https://straße.partner.io/h",
        "https://ⓗooks.example.com/h",  # the policy maps it to "hooks", the transport cannot send it
        "https://hooks。example。com/h",  # ideographic full stops: the same
        "https://hooks\uff0eexample.com/h",  # a fullwidth full stop
        "https://hooks.example.com../h",  # two trailing dots: the transport keeps one
    ],
)
def test_a_host_the_transport_would_spell_differently_is_refused(url: str) -> None:
    policy = CallbackPolicy(parse_allowlist("*.example.com, strasse.partner.io"))
    assert rejection(url, policy) is RejectionType.INVALID_URL


def test_an_allowlist_entry_the_transport_would_spell_differently_fails_configuration() -> None:
    with pytest.raises(ConfigurationError, match="HARVEST_COMPLETION_CALLBACK_ALLOWLIST"):
        parse_allowlist("straße.partner.io")


@settings(max_examples=400)
@given(
    st.lists(
        st.text(st.sampled_from("abzß-ς0ü\u3002\uff0eⓗÅ\u017f\u200d"), min_size=1, max_size=6),
        min_size=1,
        max_size=3,
    ),
    st.sampled_from(["", ".", ".."]),
)
def test_an_allowed_url_is_sent_to_the_host_that_was_judged(labels: list[str], dot: str) -> None:
    url = f"https://{'.'.join(labels)}.example.com{dot}/h"
    policy = CallbackPolicy(parse_allowlist("*.example.com"))
    if policy.check(url) is None:
        host = _wire_host(url)
        assert host is not None and policy.allowlist[0].matches_host(host), (url, host)
