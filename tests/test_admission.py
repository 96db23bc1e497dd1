"""The adaptive per-endpoint limit (a pure core): examples and properties."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import InMemoryOutboundWebhookStore, get_engine
from flask_harvest.outbound.admission import (
    INITIAL_LIMIT,
    AdmissionPolicy,
    EndpointLimit,
    Signal,
    signal_of,
)
from flask_harvest.outbound.attempt import FailureKind, HttpResponse, TransportError
from flask_harvest.worker import DeliveryPool

from .pipeline import close_apps, make_app
from .properties import BUDGET

RTT = 0.1  # a receiver that answers in 100 ms


def answer(status: int, ms: int = 100) -> HttpResponse:
    return HttpResponse(status=status, retry_after=None, body="", elapsed_ms=ms)


@pytest.mark.parametrize(
    ("result", "signal"),
    [
        (answer(200), Signal.SUCCESS),
        (answer(204), Signal.SUCCESS),
        (answer(429), Signal.OVERLOAD),
        (answer(503), Signal.OVERLOAD),
        (answer(504), Signal.OVERLOAD),
        (answer(500), Signal.FAILURE),
        (answer(404), Signal.FAILURE),
        (answer(301), Signal.FAILURE),
        (TransportError(FailureKind.TIMEOUT, "read timed out", 10_000), Signal.TIMEOUT),
        (TransportError(FailureKind.DEADLINE, "deadline", 30_000), Signal.TIMEOUT),
        (TransportError(FailureKind.CONNECT, "refused", 1), Signal.OVERLOAD),
        (TransportError(FailureKind.TLS, "tls", 1), Signal.FAILURE),
        (TransportError(FailureKind.PROTOCOL, "bad", 1), Signal.FAILURE),
        (TransportError(FailureKind.SSRF, "refused by policy", 0), Signal.FAILURE),
    ],
)
def test_signal_of_classifies_what_the_transport_returned(
    result: HttpResponse | TransportError, signal: Signal
) -> None:
    assert signal_of(result) is signal


def successes(limit: EndpointLimit, count: int, now: float, latency: float = RTT) -> float:
    """Feed ``count`` successes ``latency`` long, one round trip's worth at a time; return the time."""
    for _ in range(count):
        now += latency / max(1, limit.limit)
        limit.record(Signal.SUCCESS, latency, now)
    return now


def test_the_default_cut_keeps_seven_tenths() -> None:
    limit = EndpointLimit(AdmissionPolicy(ceiling=32), now=0.0)
    now = successes(limit, 200, 0.0)
    limit.record(Signal.OVERLOAD, 0.001, now)
    assert limit.limit == 22  # floor(32 * 0.7)


def test_a_new_endpoint_starts_small_and_slow_start_doubles_it_each_round_trip() -> None:
    limit = EndpointLimit(AdmissionPolicy(ceiling=64), now=0.0)
    assert limit.limit == INITIAL_LIMIT
    now = successes(limit, INITIAL_LIMIT, 0.0)  # one round trip of 4 successes
    assert limit.limit == 2 * INITIAL_LIMIT
    successes(limit, 100, now)
    assert limit.limit == 64  # the ceiling, never more


def test_an_unsaturated_endpoint_does_not_grow() -> None:
    limit = EndpointLimit(AdmissionPolicy(), now=0.0)
    for n in range(50):
        limit.record(Signal.SUCCESS, RTT, n * RTT, saturated=False)
    assert limit.limit == INITIAL_LIMIT


def test_overload_cuts_at_once_and_only_once_per_episode() -> None:
    limit = EndpointLimit(AdmissionPolicy(ceiling=32, decrease=0.5), now=0.0)
    now = successes(limit, 200, 0.0)
    assert limit.limit == 32
    limit.record(Signal.OVERLOAD, 0.001, now)
    assert limit.limit == 16
    # Answers to attempts sent before the cut are the same episode: no second cut.
    limit.record(Signal.OVERLOAD, 0.05, now + 0.01)
    limit.record(Signal.OVERLOAD, 0.001, now + 0.0005)
    assert limit.limit == 16
    # An attempt sent after the cut that is refused again cuts again.
    limit.record(Signal.OVERLOAD, 0.001, now + 0.5)
    assert limit.limit == 8


def test_after_a_cut_growth_is_additive_one_per_round_trip() -> None:
    limit = EndpointLimit(AdmissionPolicy(ceiling=32, decrease=0.5), now=0.0)
    now = successes(limit, 200, 0.0)
    limit.record(Signal.OVERLOAD, 0.001, now)
    assert limit.limit == 16
    now = successes(limit, 16, now + 1)  # one round trip's worth
    assert limit.limit == 17
    now = successes(limit, 17, now)
    assert limit.limit == 18


def test_a_timeout_cuts_but_not_below_the_starting_limit() -> None:
    limit = EndpointLimit(AdmissionPolicy(ceiling=32), now=0.0)
    now = successes(limit, 200, 0.0)
    limit.record(Signal.TIMEOUT, 10.0, now + 10)
    assert limit.limit == 22  # floor(32 * 0.7)
    limit.record(Signal.TIMEOUT, 10.0, now + 10.5)  # sent before the cut: same episode
    assert limit.limit == 22
    for n in range(10):
        limit.record(Signal.TIMEOUT, 1.0, now + 12 + 2 * n)
    assert limit.limit == INITIAL_LIMIT
    limit.record(Signal.OVERLOAD, 0.001, now + 40)  # a "busy" answer goes below it
    assert limit.limit == 2
    limit.record(Signal.TIMEOUT, 1.0, now + 45)  # and a timeout never raises it
    assert limit.limit == 2


def test_refusals_within_a_round_trip_of_a_cut_are_the_same_episode() -> None:
    limit = EndpointLimit(AdmissionPolicy(ceiling=32, decrease=0.5), now=0.0)
    now = successes(limit, 200, 0.0)  # usual latency: 100 ms
    limit.record(Signal.OVERLOAD, 0.001, now)
    # Sent after the cut, but the receiver still held what was sent before it.
    limit.record(Signal.OVERLOAD, 0.001, now + 0.05)
    assert limit.limit == 16
    limit.record(Signal.OVERLOAD, 0.001, now + 0.2)
    assert limit.limit == 8


def test_other_failures_count_as_prompt_answers() -> None:
    limit = EndpointLimit(AdmissionPolicy(), now=0.0)
    for n in range(4):
        limit.record(Signal.FAILURE, RTT, n * RTT)
    assert limit.limit == 2 * INITIAL_LIMIT


def test_rising_latency_cuts_and_jitter_of_a_fast_endpoint_does_not() -> None:
    limit = EndpointLimit(AdmissionPolicy(ceiling=32), now=0.0)
    now = successes(limit, 200, 0.0, latency=0.001)
    # A 1 ms endpoint answering in 3 to 50 ms is jitter, not queueing (under the 0.1 s slack).
    now = successes(limit, 50, now, latency=0.05)
    assert limit.limit == 32
    # Latency going from 1 ms to half a second, sustained, is queueing: cut.
    now = successes(limit, 10, now + 1, latency=0.5)
    assert limit.limit < 32


@pytest.mark.parametrize(("silence", "usual", "cut"), [(1.5, 0.0, True), (2.5, 1.0, False)])
def test_the_usual_latency_is_of_the_last_two_windows_only(silence: float, usual: float, cut: bool) -> None:
    # Found by the recovery property below: a 0 s answer from before a long silence made every
    # 1 s answer after it look like queueing, and cut the limit, for a whole window more.
    limit = EndpointLimit(AdmissionPolicy(ceiling=2, latency_tolerance=1.0), now=0.0)
    limit.record(Signal.SUCCESS, 0.0, 0.0, saturated=False)
    limit.record(Signal.SUCCESS, 1.0, silence * limit.policy.window)
    assert limit.usual_latency == usual
    assert limit.limit == (1 if cut else 2)


def test_a_fixed_policy_never_moves() -> None:
    limit = EndpointLimit(AdmissionPolicy(floor=16, ceiling=16), now=0.0)
    assert limit.limit == 16
    limit.record(Signal.TIMEOUT, 10.0, 10.0)
    limit.record(Signal.OVERLOAD, 0.0, 11.0)
    successes(limit, 100, 12.0)
    assert limit.limit == 16


@pytest.mark.parametrize(
    "kwargs",
    [
        {"floor": 0},
        {"floor": 5, "ceiling": 4},
        {"latency_tolerance": 0.5},
        {"latency_tolerance": float("nan")},
        {"latency_slack": -1.0},
        {"decrease": 1.0},
        {"decrease": 0.0},
        {"window": 0.0},
    ],
)
def test_a_policy_refuses_bounds_that_make_no_sense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"must|need"):
        AdmissionPolicy(**kwargs)  # type: ignore[arg-type]


# -- properties ---------------------------------------------------------------------------------

POLICIES = st.builds(
    lambda floor, extra, tolerance: AdmissionPolicy(
        floor=floor, ceiling=floor + extra, latency_tolerance=tolerance
    ),
    st.integers(1, 8),
    st.integers(0, 64),
    st.floats(1.0, 5.0),
)
EVENTS = st.lists(
    st.tuples(
        st.sampled_from(list(Signal)),
        st.floats(0.0, 20.0),  # latency
        st.floats(0.0, 2.0),  # time since the last event
        st.booleans(),  # saturated
    ),
    max_size=200,
)
Events = list[tuple[Signal, float, float, bool]]


def play(limit: EndpointLimit, events: Events) -> Iterator[float]:
    """Record ``events`` on ``limit`` in turn, from time 0; yield the time after each."""
    now = 0.0
    for signal, latency, gap, saturated in events:
        now += gap
        limit.record(signal, latency, now, saturated=saturated)
        yield now


def play_all(limit: EndpointLimit, events: Events) -> float:
    """Record every one of ``events`` on ``limit``; return the time after the last (0 for none)."""
    return max(play(limit, events), default=0.0)  # time never goes back: the greatest is the last


@BUDGET
@given(POLICIES, EVENTS)
def test_the_limit_always_stays_within_floor_and_ceiling(policy: AdmissionPolicy, events: Events) -> None:
    limit = EndpointLimit(policy, now=0.0)
    for _ in play(limit, events):
        assert policy.floor <= limit.limit <= policy.ceiling


@BUDGET
@given(POLICIES, EVENTS, st.sampled_from([Signal.OVERLOAD, Signal.TIMEOUT]))
def test_an_overload_signal_after_the_last_cut_decreases_at_once(
    policy: AdmissionPolicy, events: Events, signal: Signal
) -> None:
    limit = EndpointLimit(policy, now=0.0)
    now = play_all(limit, events)
    before = limit.limit
    # Sent after any earlier cut, and more than a round trip (latencies here are <= 20 s) later.
    limit.record(signal, 0.001, now + 21.0)
    least = (
        policy.floor if signal is Signal.OVERLOAD else min(max(INITIAL_LIMIT, policy.floor), policy.ceiling)
    )
    if before > least:
        assert limit.limit < before
    elif signal is Signal.TIMEOUT:
        assert limit.limit == before  # at or under the starting limit: a timeout leaves it
    else:
        assert limit.limit == policy.floor


@BUDGET
@given(POLICIES, EVENTS, st.floats(0.001, 2.0))
def test_the_limit_recovers_to_the_ceiling_once_overload_ends(
    policy: AdmissionPolicy, events: Events, rtt: float
) -> None:
    limit = EndpointLimit(policy, now=0.0)
    now = play_all(limit, events)
    # Two windows later the endpoint's usual latency is what it answers in now; then it answers
    # every attempt well and at that latency.
    now += 2 * policy.window + 1
    rounds = 0
    while limit.limit < policy.ceiling and rounds < 10 * policy.ceiling:
        for _ in range(limit.limit):
            now += rtt / limit.limit
            limit.record(Signal.SUCCESS, rtt, now)
        rounds += 1
    assert limit.limit == policy.ceiling


@BUDGET
@given(st.integers(1, 64), st.integers(1, 128), st.integers(1, 128), EVENTS)
def test_a_pools_limits_never_exceed_its_slots(floor: int, ceiling: int, slots: int, events: Events) -> None:
    app = make_app(InMemoryOutboundWebhookStore())
    # Any floor and ceiling the settings allow, and any --concurrency.
    pool = DeliveryPool(
        get_engine(app).runner, size=slots, per_subscription=max(floor, ceiling), min_per_subscription=floor
    )
    try:
        assert 1 <= pool.policy.floor <= pool.policy.ceiling <= slots
        limit = EndpointLimit(pool.policy, now=0.0)
        for _ in play(limit, events):
            assert limit.limit <= slots
    finally:
        pool.shutdown()
        close_apps()
