"""A tenant's endpoints are held to the tenant SSRF policy: the operator's allow settings never
open the app's own network to a customer, when an endpoint is set and at every connection; and a
refusal recorded on a delivery reads, for its customer, without the resolved address or the
settings."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import OutboundWebhookHandler, WebhookSubscription, get_engine
from flask_harvest.config import load_settings
from flask_harvest.errors import ConfigurationError
from flask_harvest.outbound.attempt import FailureKind, TransportError
from flask_harvest.outbound.ssrf import SsrfError, SsrfRejection, describe, public_error
from flask_harvest.outbound.transport import Transport
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.models import DeliveryState

from .pipeline import make_app, wait_final
from .properties import BUDGET, TEXT

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#: The operator opens its own network wide; a tenant must still not reach it.
OPERATOR_OPEN = {
    "HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS": True,
    "HARVEST_WEBHOOKS_ALLOW_CIDRS": "10.0.0.0/8",
    "HARVEST_WEBHOOKS_TENANT_ALLOW_CIDRS": "",
    "HARVEST_WEBHOOKS_MAX_ATTEMPTS": 1,
}


def test_the_tenant_policy_takes_nothing_from_the_operators_allow_keys() -> None:
    settings = load_settings(
        {
            **OPERATOR_OPEN,
            "HARVEST_WEBHOOKS_DENY_CIDRS": "203.0.113.0/24",
            "HARVEST_WEBHOOKS_HTTPS_ONLY": True,
        },
        {},
    )
    policy = settings.ssrf_policy_for("acme")
    assert not policy.allow_private and policy.allow_cidrs == ()
    assert policy.https_only and policy.deny_cidrs == settings.ssrf_policy.deny_cidrs
    assert settings.ssrf_policy_for(None) == settings.ssrf_policy


@pytest.mark.parametrize("value", ["10.0.0.0/33", "not a network", "10.0.0.1/8"])
def test_a_bad_tenant_network_is_refused_at_start(value: str) -> None:
    with pytest.raises(ConfigurationError, match="HARVEST_WEBHOOKS_TENANT_ALLOW_CIDRS"):
        load_settings({"HARVEST_WEBHOOKS_TENANT_ALLOW_CIDRS": value}, {})


@pytest.mark.parametrize(
    "url",
    ["http://10.1.2.3/hook", "http://127.0.0.1:9/hook", "http://169.254.169.254/latest", "http://[::1]/h"],
)
def test_a_tenants_endpoint_is_refused_where_the_operators_would_be_allowed(
    store: OutboundWebhookHandler, url: str
) -> None:
    app = make_app(store, **OPERATOR_OPEN)
    with app.app_context():
        operations = get_engine().operations
        with pytest.raises(SsrfError):
            operations.create_subscription(target_url=url, event_topics=["a.b"], tenant="acme")
        own = operations.create_subscription(target_url=url, event_topics=["a.b"])
        tenants = operations.create_subscription(
            target_url="https://example.com/h", event_topics=["a.b"], tenant="acme"
        )
        with pytest.raises(SsrfError):
            # Unscoped (every tenant): the subscription's own tenant decides.
            operations.update_subscription(tenants.subscription.id, target_url=url)
        assert operations.get_subscription(tenants.subscription.id).target_url == "https://example.com/h"
        assert [s.tenant for s in operations.list_subscriptions()] == [None, "acme"]
        assert own.subscription.target_url == url


def test_the_tenant_networks_open_to_tenants_only_what_they_list(store: OutboundWebhookHandler) -> None:
    app = make_app(store, **{**OPERATOR_OPEN, "HARVEST_WEBHOOKS_TENANT_ALLOW_CIDRS": "10.1.0.0/16"})
    with app.app_context():
        operations = get_engine().operations
        operations.create_subscription(target_url="http://10.1.2.3/h", event_topics=["a"], tenant="acme")
        with pytest.raises(SsrfError):
            operations.create_subscription(target_url="http://10.2.0.1/h", event_topics=["a"], tenant="acme")


def test_a_tenants_endpoint_is_refused_at_the_connection_too(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    """An endpoint stored without the check (or whose host name later resolves inside) gets no
    request: the attempt is refused, the untenanted subscription beside it is delivered."""
    app = make_app(store, **OPERATOR_OPEN)
    with app.app_context():
        engine = get_engine()
        for tenant in ("acme", None):
            store.add_subscription(
                WebhookSubscription(
                    target_url=receiver.url("/hook"), event_topics=["a.b"], secret=SECRET, tenant=tenant
                )
            )
        refused = engine.manager.dispatch("a.b", {"n": 1}, tenant="acme")
        delivered = engine.manager.dispatch("a.b", {"n": 2})
        assert wait_final(store, refused) == [DeliveryState.DLQ]
        assert wait_final(store, delivered) == [DeliveryState.DELIVERED]
        (dead,) = store.get_deliveries(refused)
        assert dead.last_error is not None and "SSRF policy (loopback_address)" in dead.last_error
        # The operator is told the key that opens tenants' endpoints, not the one that does not.
        assert "HARVEST_WEBHOOKS_TENANT_ALLOW_CIDRS" in dead.last_error
        assert "ALLOW_PRIVATE_TARGETS" not in dead.last_error
    assert [json.loads(r.body) for r in receiver.requests] == [{"n": 2}]


@BUDGET
@given(
    reason=st.sampled_from(list(SsrfRejection)),
    address=st.one_of(st.none(), st.sampled_from(["10.0.0.7", "127.0.0.1", "fd00::1"])),
)
def test_a_refusal_reads_for_the_customer_without_address_or_setting(
    reason: SsrfRejection, address: str | None
) -> None:
    recorded = "connection refused: " + describe(reason, "http://svc.internal:6379/x", address)
    shown = public_error(recorded)
    assert shown.startswith("the address is refused: ")
    assert "HARVEST_" not in shown and "svc.internal" not in shown
    assert address is None or address not in shown


@BUDGET
@given(st.text(max_size=200).filter(lambda t: "refused by the SSRF policy" not in t))
def test_any_other_error_is_shown_as_recorded(error: str) -> None:
    assert public_error(error) == error


class _KeepAlive(http.server.BaseHTTPRequestHandler):
    """Answers 200 and keeps the connection open (HTTP/1.1), so a client pools it."""

    protocol_version = "HTTP/1.1"
    served: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        _KeepAlive.served.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def keep_alive() -> Iterator[str]:
    """A receiver on 127.0.0.1 that keeps connections alive; its base URL."""
    _KeepAlive.served.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://hooks.internal.example:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_tenants_request_never_rides_on_a_connection_the_operators_policy_opened(
    keep_alive: str,
) -> None:
    """A host name checked when its connection opens: a keep-alive connection the operator's
    policy allowed is not reused for a tenant's request to the same host and port."""
    settings = load_settings(OPERATOR_OPEN, {})
    opened: list[str] = []

    def resolver(host: str, port: int) -> list[str]:  # hooks.internal.example is on this machine
        opened.append(host)
        return ["127.0.0.1"]

    transport = Transport(
        connect_timeout=2, read_timeout=5, deadline=10, policy=settings.ssrf_policy, resolver=resolver
    )
    url = keep_alive + "/hook"
    tenant_policy = settings.ssrf_policy_for("acme")
    own = transport.post_or_error(url, b"{}", {})  # the operator's: allowed, the connection kept
    assert not isinstance(own, TransportError) and own.status == 200
    assert transport.post_or_error(url, b"{}", {}).status == 200  # type: ignore[union-attr]
    assert len(opened) == 1  # the second request rode on the first one's connection
    refused = transport.post_or_error(url, b"{}", {}, policy=tenant_policy)
    assert isinstance(refused, TransportError) and refused.kind is FailureKind.SSRF
    assert "resolved to 127.0.0.1" in str(refused)
    assert _KeepAlive.served == ["/hook", "/hook"]


@BUDGET
@given(
    key=st.sampled_from(
        ["HARVEST_WEBHOOKS_TENANT_ALLOW_CIDRS", "HARVEST_WEBHOOKS_ALLOW_CIDRS", "HARVEST_WEBHOOKS_DENY_CIDRS"]
    ),
    value=st.one_of(
        TEXT,
        st.lists(TEXT, max_size=3),
        st.integers(min_value=-(10**30), max_value=10**30),
        st.builds(lambda n: "10.0.0.0/8," * n, st.integers(0, 5000)),
    ),
)
def test_any_network_list_is_taken_whole_or_refused_naming_its_key(key: str, value: object) -> None:
    try:
        settings = load_settings({key: value}, {})
    except ConfigurationError as exc:
        refusal: str | None = str(exc)
    else:
        refusal = None
    if refusal is not None:
        assert key in refusal
        return
    policy = settings.ssrf_policy_for("acme" if "TENANT" in key else None)
    assert isinstance(policy.allow_cidrs, tuple) and isinstance(policy.deny_cidrs, tuple)
