"""``dispatch_in_tx`` with an ordering key, on real PostgreSQL and SQLite transactions: the order
is the order of the commits, a rolled-back event holds nothing, and the relay waits for the earlier
messages of a key."""

from __future__ import annotations

import functools
import json
import threading
import time

import pytest
import sqlalchemy as sa

from flask_harvest import DeliveryState, WebhookSubscription, get_engine
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.manager import outbox_delivery_id
from flask_harvest.webhooks.models import utcnow
from flask_harvest.webhooks.stores._schema import outbox_table

from .pipeline import wait_final
from .test_outbox import SECRET, Order, OutboxApp, database_url, make_outbox_app, subscribe

__all__ = ["database_url"]  # the fixture, used by name


def save_keyed(outbox: OutboxApp, reference: str, key: str, *, commit: bool = True) -> str:
    """Save an order and dispatch its keyed event in one Flask-SQLAlchemy transaction."""
    outbox.db.session.add(Order(reference=reference))
    message_id = outbox.state.manager.dispatch_in_tx(
        outbox.db.session, "order.created", {"ref": reference}, ordering_key=key
    )
    if commit:
        outbox.db.session.commit()
    else:
        outbox.db.session.rollback()
    return message_id


def write_on_connection(outbox: OutboxApp, reference: str, key: str) -> str:
    """Commit a keyed event on a bare connection: nothing relays it until asked (or the sweeper)."""
    with outbox.engine.begin() as conn:
        return outbox.state.manager.dispatch_in_tx(
            conn, "order.created", {"ref": reference}, ordering_key=key
        )


#: For the tests that relay by hand: no timed sweep, which relays committed messages too, so a
#: relay the test asserts on is never taken by the sweeper first.
BY_HAND = {"HARVEST_SWEEP_INTERVAL_SECONDS": 3600}


def settle(outbox: OutboxApp, delivery_ids: list[str], timeout: float = 20.0) -> list[DeliveryState]:
    """:func:`wait_final` with a sweep by hand every half second, as the timed sweeper would run:
    it queues a keyed delivery whose turn came while its relay was under way."""
    end = time.monotonic() + timeout
    while True:
        with outbox.app.app_context():
            get_engine().sweep()
        try:
            return wait_final(outbox.state.store, delivery_ids, timeout=0.5)
        except TimeoutError:
            if time.monotonic() > end:
                raise


def arrival(receiver: CapturingReceiver) -> list[str]:
    return [json.loads(r.body)["ref"] for r in receiver.requests]


def test_keyed_commits_arrive_in_commit_order(database_url: str, receiver: CapturingReceiver) -> None:
    outbox = make_outbox_app(database_url)
    subscribe(outbox, receiver, "sub_a")
    with outbox.app.app_context():
        messages = [save_keyed(outbox, f"ord_{n}", "customer-7") for n in range(5)]
    ids = [outbox_delivery_id(m, "sub_a") for m in messages]
    assert wait_final(outbox.state.store, ids) == [DeliveryState.DELIVERED]
    outbox.state.manager.close()
    assert arrival(receiver) == [f"ord_{n}" for n in range(5)]
    deliveries = {d.id: d for d in outbox.state.store.get_deliveries(ids)}
    seqs = [deliveries[i].ordering_seq or 0 for i in ids]
    assert all(d.ordering_key == "customer-7" for d in deliveries.values())
    assert seqs == sorted(seqs) and len(set(seqs)) == 5


def test_a_rolled_back_keyed_event_is_never_sent_and_holds_nothing(
    database_url: str, receiver: CapturingReceiver
) -> None:
    outbox = make_outbox_app(database_url)
    subscribe(outbox, receiver, "sub_a")
    with outbox.app.app_context():
        first = save_keyed(outbox, "ord_1", "k")
        save_keyed(outbox, "ord_gone", "k", commit=False)
        last = save_keyed(outbox, "ord_3", "k")
        assert outbox.outbox_rows() == 2  # the rolled-back message left no row
    ids = [outbox_delivery_id(m, "sub_a") for m in (first, last)]
    assert wait_final(outbox.state.store, ids) == [DeliveryState.DELIVERED]
    outbox.state.manager.close()
    assert arrival(receiver) == ["ord_1", "ord_3"]


def test_the_relay_waits_for_the_earlier_messages_of_a_key(
    database_url: str, receiver: CapturingReceiver
) -> None:
    outbox = make_outbox_app(database_url, **BY_HAND)
    subscribe(outbox, receiver, "sub_a")
    manager = outbox.state.manager
    with outbox.app.app_context():
        earlier = write_on_connection(outbox, "ord_1", "k")
        later = write_on_connection(outbox, "ord_2", "k")
        other = write_on_connection(outbox, "ord_other", "another-key")
        # The later message of the key is not relayed while the earlier one is not.
        assert manager.relay_outbox([later]).relayed == 0
        assert manager.relay_outbox([other]).relayed == 1  # other keys do not wait
        assert manager.relay_outbox([earlier]).relayed == 1
        assert manager.relay_outbox([later]).relayed == 1
        with outbox.engine.connect() as conn:
            waiting = conn.execute(
                sa.select(sa.func.count())
                .select_from(outbox_table)
                .where(outbox_table.c.relayed_at.is_(None))
            ).scalar_one()
        assert waiting == 0
    ids = [outbox_delivery_id(m, "sub_a") for m in (earlier, later, other)]
    assert settle(outbox, ids) == [DeliveryState.DELIVERED]
    manager.close()
    refs = arrival(receiver)
    assert sorted(refs) == ["ord_1", "ord_2", "ord_other"]
    assert refs.index("ord_1") < refs.index("ord_2")


def test_a_dispatch_after_an_unrelayed_keyed_message_waits_for_it(
    database_url: str, receiver: CapturingReceiver
) -> None:
    outbox = make_outbox_app(database_url, **BY_HAND)
    subscribe(outbox, receiver, "sub_a")
    manager, store = outbox.state.manager, outbox.state.store
    with outbox.app.app_context():
        earlier = write_on_connection(outbox, "ord_1", "k")  # committed, not relayed
        [later] = manager.dispatch("order.created", {"ref": "ord_2"}, ordering_key="k")
        # The earlier event's delivery does not exist yet, but it holds the line all the same.
        assert store.waiting_in_line([later]) == {later}
        assert store.claim_delivery(later, now=utcnow(), lease_seconds=30, max_attempts=5) is None
        stored = store.get_delivery(later)
        assert stored is not None and stored.state is DeliveryState.PENDING
        assert manager.relay_outbox([earlier]).relayed == 1
    ids = [outbox_delivery_id(earlier, "sub_a"), later]
    # No job was queued for it at dispatch: the earlier delivery queues it as it finishes (or a
    # sweep, should the two cross); either way only after the earlier one.
    assert settle(outbox, ids) == [DeliveryState.DELIVERED]
    manager.close()
    assert arrival(receiver) == ["ord_1", "ord_2"]


def _subscribe_tenants(outbox: OutboxApp, receiver: CapturingReceiver, *tenants: str) -> None:
    for tenant in tenants:
        outbox.state.store.add_subscription(
            WebhookSubscription(
                receiver.url(f"/{tenant}"), ["order.*"], SECRET, id=f"sub_{tenant}", tenant=tenant
            )
        )


def test_a_key_of_one_tenant_does_not_hold_the_same_key_of_another(
    database_url: str, receiver: CapturingReceiver
) -> None:
    outbox = make_outbox_app(database_url, **BY_HAND)
    _subscribe_tenants(outbox, receiver, "acme", "globex")
    manager = outbox.state.manager
    with outbox.app.app_context():
        write = functools.partial(manager.dispatch_in_tx, topic="order.created", ordering_key="order-1")
        with outbox.engine.begin() as conn:
            held = write(conn, payload={"ref": "acme_1"}, tenant="acme")  # committed, not relayed
        with outbox.engine.begin() as conn:
            first = write(conn, payload={"ref": "globex_1"}, tenant="globex")
        with outbox.engine.begin() as conn:
            second = write(conn, payload={"ref": "globex_2"}, tenant="globex")
        assert manager.relay_outbox([first]).relayed == 1
        # acme's unrelayed message of the key does not hold globex's messages of it.
        assert manager.relay_outbox([second]).relayed == 1
        assert manager.relay_outbox([held]).relayed == 1
    ids = [
        outbox_delivery_id(m, f"sub_{t}") for m, t in ((held, "acme"), (first, "globex"), (second, "globex"))
    ]
    assert settle(outbox, ids) == [DeliveryState.DELIVERED]
    manager.close()
    refs = arrival(receiver)
    assert refs.index("globex_1") < refs.index("globex_2")


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_an_open_transaction_of_one_tenant_does_not_block_another_on_the_same_key(
    database_url: str, receiver: CapturingReceiver
) -> None:
    outbox = make_outbox_app(database_url)
    _subscribe_tenants(outbox, receiver, "acme", "globex")
    manager = outbox.state.manager
    dispatched: list[str] = []

    def dispatch_for_globex() -> None:
        with outbox.app.app_context():
            dispatched.extend(
                manager.dispatch(
                    "order.created", {"ref": "globex_1"}, ordering_key="order-1", tenant="globex"
                )
            )

    with outbox.app.app_context(), outbox.engine.connect() as conn:
        with conn.begin():
            # acme's transaction takes acme's number of the key and stays open meanwhile.
            manager.dispatch_in_tx(
                conn, "order.created", {"ref": "acme_1"}, ordering_key="order-1", tenant="acme"
            )
            other = threading.Thread(target=dispatch_for_globex)
            other.start()
            other.join(timeout=30)  # a hang detector: without per-tenant keys it waits for the commit
            blocked = other.is_alive()
        other.join()
    assert not blocked, "globex's dispatch waited for acme's transaction"
    assert wait_final(outbox.state.store, dispatched) == [DeliveryState.DELIVERED]
    manager.close()
