"""Payload filters and custom headers, by property: over 100 hypothesis-made payloads, dispatch
makes exactly the deliveries whose payload the completion triggers' evaluator says match, for
hypothesis-made conditions; and no spelling of a reserved header gets through."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flask_harvest import InMemoryOutboundWebhookHandler, WebhookSubscription, get_engine
from flask_harvest.errors import InvalidFieldError
from flask_harvest.triggers.conditions import evaluate, parse_condition
from flask_harvest.webhooks.models import RESERVED_HEADERS, validate_headers

from .pipeline import close_apps, make_app
from .test_actuator import SECRET
from .test_triggers_cores import _finite, json_values, valid_conditions

PAYLOADS = st.dictionaries(st.sampled_from(["a", "b", "0", "n"]), json_values.filter(_finite), max_size=4)


@settings(max_examples=15, deadline=None)
@given(
    conditions=st.lists(valid_conditions, min_size=1, max_size=3),
    sent=st.lists(PAYLOADS, min_size=100, max_size=100),
)
def test_a_filter_over_100_dispatches_makes_exactly_the_matching_deliveries(
    conditions: list[dict[str, Any]], sent: list[dict[str, Any]]
) -> None:
    parsed = []
    for data in conditions:
        with contextlib.suppress(InvalidFieldError):  # over a cap: refused when set, never evaluated
            parsed.append(parse_condition(data))
    store = InMemoryOutboundWebhookHandler()
    for number, condition in enumerate(parsed):
        store.add_subscription(
            WebhookSubscription(
                "http://127.0.0.1:9/h", ["t.*"], SECRET, id=f"sub_{number}", payload_filter=condition
            )
        )
    app = make_app(store, delegate=lambda delivery, subscription: None)
    try:
        with app.app_context():
            for n, payload in enumerate(sent):
                get_engine().manager.dispatch("t.x", {**payload, "seq": n})
        for number, condition in enumerate(parsed):
            got = sorted(
                json.loads(d.payload)["seq"]
                for d in store.list_deliveries(subscription_id=f"sub_{number}", limit=500)
            )
            # The evaluator on the JSON the receiver gets, as the triggers evaluate a run's output.
            want = [
                n for n, p in enumerate(sent) if evaluate(condition, json.loads(json.dumps({**p, "seq": n})))
            ]
            assert got == want
    finally:
        close_apps()


def _any_case(name: str) -> st.SearchStrategy[str]:
    return st.lists(st.booleans(), min_size=len(name), max_size=len(name)).map(
        lambda upper: "".join(c.upper() if u else c.lower() for c, u in zip(name, upper, strict=True))
    )


RESERVED = st.sampled_from(
    sorted(
        RESERVED_HEADERS | {"webhook-id", "webhook-timestamp", "webhook-signature", "proxy-x", "x-shop-sig"}
    )
).flatmap(_any_case)


@settings(max_examples=300)
@given(name=RESERVED, value=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=20))
def test_no_spelling_of_a_reserved_header_is_accepted(name: str, value: str) -> None:
    with pytest.raises(InvalidFieldError) as info:
        validate_headers({name: f"tok_{value}"}, signature_header="X-Shop-Sig")
    assert info.value.field == "headers"
    assert f"tok_{value}" not in info.value.message  # a message names the header, never its value
