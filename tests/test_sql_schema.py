"""The SQL store's schema (ensure_schema, the DDL scripts) and how it reports database errors."""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

from flask_harvest import schema as full_schema
from flask_harvest._sql import drop_indexes_sql
from flask_harvest.errors import DuplicateSubscriptionError, StoreError
from flask_harvest.webhooks.models import (
    AttemptResult,
    DeliveryAttempt,
    DeliveryLog,
    DeliveryState,
    SubscriptionChanges,
    SubscriptionEffect,
    WebhookSubscription,
    utcnow,
)
from flask_harvest.webhooks.stores._schema import RETIRED_INDEXES, WEBHOOK_TABLES
from flask_harvest.webhooks.stores.sql import (
    WEBHOOK_SCHEMA_SQL,
    SqlOutboundWebhookStore,
    attempts_table,
    deliveries_table,
    metadata,
    schema_sql,
    subscriptions_table,
)
from flask_harvest.webhooks.stores.sql._statements import CLAIM_MANY_SQL

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
PASSWORD = "pw-do-not-print-9f2c"


def make_subscription() -> WebhookSubscription:
    return WebhookSubscription("https://receiver.example/hooks", ["order.*"], SECRET)


def exercise(store: SqlOutboundWebhookStore) -> None:
    """Drive one delivery through the store: the tables it found must be the ones it needs."""
    now = utcnow()
    subscription = store.add_subscription(make_subscription())
    delivery = DeliveryLog(
        "dlv_1", subscription.id, "order.created", "{}", timestamp=now, next_attempt_at=now
    )
    assert store.log_deliveries([delivery]) == ["dlv_1"]
    claim = store.claim_delivery("dlv_1", now=now, lease_seconds=30, max_attempts=5)
    assert claim is not None
    assert claim.subscription == subscription
    result = AttemptResult(
        state=DeliveryState.DLQ,
        attempt_number=1,
        next_attempt_at=None,
        last_error="HTTP 500",
        timestamp=now,
        effect=SubscriptionEffect.COUNT_FAILURE,
        failure_threshold=1,
    )
    assert store.finish_attempt("dlv_1", claim.lease_token, result) is not None
    assert [d.id for d in store.list_dlq()] == ["dlv_1"]
    assert store.replay_delivery("dlv_1", now=now + timedelta(seconds=1)).attempt == 1


def assert_schema_present(engine: sa.Engine, tables: Sequence[sa.Table] = WEBHOOK_TABLES) -> None:
    inspector = sa.inspect(engine)
    for table in tables:
        assert {c["name"] for c in inspector.get_columns(table.name)} == set(table.columns.keys())
        assert {i["name"] for i in inspector.get_indexes(table.name)} == {i.name for i in table.indexes}


def test_ensure_schema_is_idempotent(sql_store: SqlOutboundWebhookStore) -> None:
    subscription = sql_store.add_subscription(make_subscription())
    sql_store.ensure_schema()
    sql_store.ensure_schema()
    assert sql_store.list_subscriptions() == [subscription]


def test_ensure_schema_creates_missing_tables(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'fresh.db'}")
    try:
        store = SqlOutboundWebhookStore(engine)
        store.ensure_schema()
        assert_schema_present(engine)
        exercise(store)
    finally:
        engine.dispose()


def test_ensure_schema_adds_the_indexes_a_newer_version_declares(sql_store: SqlOutboundWebhookStore) -> None:
    """An upgrade: the tables exist from an older version without some of today's indexes."""
    subscription = sql_store.add_subscription(make_subscription())
    dropped = [index for table in WEBHOOK_TABLES for index in table.indexes]
    assert dropped, "the webhook tables declare indexes"
    with sql_store.engine.begin() as conn:
        for index in dropped:
            conn.execute(sa.text(f"DROP INDEX {index.name}"))
    assert not any(sa.inspect(sql_store.engine).get_indexes(t.name) for t in WEBHOOK_TABLES)

    sql_store.ensure_schema()

    assert_schema_present(sql_store.engine)
    assert sql_store.list_subscriptions() == [subscription]


def test_ensure_schema_adds_the_columns_a_newer_version_declares(tmp_path: Path) -> None:
    """An upgrade: the executions table exists from a version before chains, children, forks and
    queues; its rows stay and read back with the new columns empty."""
    from flask_harvest.workflows import SqlWorkflowStore
    from flask_harvest.workflows._schema import executions_table

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    try:
        old = [c.name for c in executions_table.columns][
            : list(executions_table.c.keys()).index("continued_from")
        ]
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE TABLE harvest_workflow_executions (execution_id VARCHAR(36) PRIMARY KEY, "
                "workflow_name VARCHAR(255) NOT NULL, workflow_id VARCHAR(255) NOT NULL, "
                "input TEXT NOT NULL, "
                "output TEXT, error TEXT, state VARCHAR(16) NOT NULL, created_at DATETIME NOT NULL, "
                "started_at DATETIME, completed_at DATETIME, deadline DATETIME, attempt INTEGER NOT NULL, "
                "recovery_count INTEGER NOT NULL, lease_token VARCHAR(32), lease_expires_at DATETIME, "
                "next_run_at DATETIME, cancel_requested BOOLEAN NOT NULL, cancel_reason TEXT, "
                "trigger_depth INTEGER NOT NULL, completion_callbacks JSON)"
            )
            conn.exec_driver_sql(
                "INSERT INTO harvest_workflow_executions VALUES "
                "('e1', 'n', 'w', '1', NULL, NULL, 'Completed', "
                "'2026-01-01 00:00:00', NULL, NULL, NULL, 1, 0, NULL, NULL, NULL, 0, NULL, 0, NULL)"
            )
        assert [c["name"] for c in sa.inspect(engine).get_columns("harvest_workflow_executions")] == old

        store = SqlWorkflowStore(engine)
        store.ensure_schema()

        columns = [c["name"] for c in sa.inspect(engine).get_columns("harvest_workflow_executions")]
        assert columns == list(executions_table.c.keys())
        execution = store.get("e1")
        assert execution is not None and execution.priority == 0 and execution.continued_to is None
    finally:
        engine.dispose()


def test_schema_sql_names_every_table_and_index() -> None:
    assert schema_sql("postgresql") == WEBHOOK_SCHEMA_SQL
    for sql in (WEBHOOK_SCHEMA_SQL, schema_sql("sqlite"), full_schema.schema_sql("sqlite")):
        for table in WEBHOOK_TABLES:
            assert f"CREATE TABLE IF NOT EXISTS {table.name} (" in sql
            for index in table.indexes:
                unique = "UNIQUE " if index.unique else ""
                assert f"CREATE {unique}INDEX IF NOT EXISTS {index.name} ON {table.name}" in sql
        # An upgraded database loses the indexes the new ones replace.
        for name in RETIRED_INDEXES:
            assert f"DROP INDEX IF EXISTS {name};" in sql
    for sql in (WEBHOOK_SCHEMA_SQL, schema_sql("sqlite")):
        assert "harvest_workflow" not in sql  # each store's DDL is its own tables'
    # The hot states' indexes hold their rows only.
    assert "(next_attempt_at) WHERE state = 'pending'" in WEBHOOK_SCHEMA_SQL
    assert "(lease_expires_at) WHERE state = 'inflight'" in WEBHOOK_SCHEMA_SQL


def test_retired_indexes_stay_until_the_ddl_drops_them(sql_store: SqlOutboundWebhookStore) -> None:
    """An upgrade from the full (state, ...) indexes: ensure_schema leaves them for the processes
    of the previous version (a rolling upgrade); the DDL's DROP statements remove them."""
    engine = sql_store.engine
    with engine.begin() as conn:
        # What the previous version created.
        conn.exec_driver_sql(
            "CREATE INDEX ix_harvest_webhook_deliveries_due"
            " ON harvest_webhook_deliveries (state, next_attempt_at)"
        )
        conn.exec_driver_sql(
            "CREATE INDEX ix_harvest_webhook_deliveries_subscription"
            " ON harvest_webhook_deliveries (subscription_id, state)"
        )
    sql_store.ensure_schema()
    names = {found["name"] for found in sa.inspect(engine).get_indexes(deliveries_table.name)}
    assert {"ix_harvest_webhook_deliveries_due", "ix_harvest_webhook_deliveries_subscription"} <= names

    with engine.begin() as conn:
        for statement in drop_indexes_sql(RETIRED_INDEXES).split(";"):
            if statement.strip():
                conn.exec_driver_sql(statement)
    assert_schema_present(engine)
    exercise(sql_store)


@contextmanager
def sent_statements(engine: sa.Engine) -> Iterator[list[tuple[str, Any]]]:
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        sent.append((statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


def generic_plan(engine: sa.Engine, statement: str, parameters: dict[str, Any]) -> str:
    """The plan PostgreSQL runs for ``statement`` once prepared (a generic plan: the parameters'
    values unknown to the planner)."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
    numbered = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", statement)
    with engine.connect() as conn:
        conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.exec_driver_sql(f"PREPARE harvest_plan AS {numbered}")
        values = ", ".join(f"%({name})s" for name in names)
        raw = conn.connection.driver_connection
        assert isinstance(raw, psycopg.Connection)
        rows = conn.exec_driver_sql(
            "EXPLAIN EXECUTE harvest_plan(" + psycopg.ClientCursor(raw).mogrify(values, parameters) + ")"
        ).all()
        conn.exec_driver_sql("DEALLOCATE harvest_plan")
        conn.rollback()
    return "\n".join(row[0] for row in rows)


@pytest.mark.postgres
def test_the_hot_paths_use_the_partial_indexes_in_prepared_plans(fresh_postgres_url: URL) -> None:
    """The due scan and the lease release name their state as a literal, so even the generic plan
    of a prepared statement can use the partial index (a bound state could not match it)."""
    engine = sa.create_engine(fresh_postgres_url)
    try:
        store = SqlOutboundWebhookStore(engine)
        store.ensure_schema()
        now = utcnow()
        history = [
            DeliveryLog(
                f"dlv_h{n}", "sub_1", "order.created", "{}", state=DeliveryState.DELIVERED, timestamp=now
            )
            for n in range(2000)
        ]
        store.log_deliveries(
            [
                *history,
                DeliveryLog("dlv_p", "sub_1", "order.created", "{}", timestamp=now, next_attempt_at=now),
            ]
        )
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE harvest_webhook_deliveries")
        with sent_statements(engine) as sent:
            assert store.due_deliveries(now=now, limit=10) == ["dlv_p"]
            assert store.release_expired_leases(now=now) == []
        due, release = (s for s in sent if "harvest_webhook_deliveries" in s[0])
        assert "ix_harvest_webhook_deliveries_pending_due" in generic_plan(engine, *due)
        assert "ix_harvest_webhook_deliveries_inflight_lease" in generic_plan(engine, *release)
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_tenants_listing_of_one_subscription_walks_its_own_index(postgres_engine: sa.Engine) -> None:
    """A subscription implies its tenant, which the planner cannot know: with the tenant's and the
    subscription's indexes only, it read both bitmaps and sorted every row of the subscription."""
    store = SqlOutboundWebhookStore(postgres_engine)
    now = utcnow()
    # Two of three deliveries are the big tenant's (two subscriptions), the rest 300 small tenants'.
    tenants = ["big" if n % 3 else f"t{n % 300:03d}" for n in range(3000)]
    store.log_deliveries(
        [
            DeliveryLog(
                f"dlv_{n:05d}",
                f"sub_{tenant}_{n % 3}",
                "order.created",
                "{}",
                state=DeliveryState.DELIVERED,
                timestamp=now - timedelta(seconds=n),
                tenant=tenant,
            )
            for n, tenant in enumerate(tenants)
        ]
    )
    with postgres_engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE harvest_webhook_deliveries")
    with sent_statements(postgres_engine) as sent:
        listed = store.list_delivery_summaries(limit=50, subscription_id="sub_big_1", tenant="big")
        counted = store.count_deliveries(cap=1000, subscription_id="sub_big_1", tenant="big")
    assert len(listed) == 50 and counted == 1000
    reads = [
        (statement, parameters) for statement, parameters in sent if "harvest_webhook_deliveries" in statement
    ]
    assert len(reads) == 2
    with postgres_engine.connect() as conn:
        # A table this small is read whole; the question is which index the planner walks.
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        raw = conn.connection.driver_connection
        assert isinstance(raw, psycopg.Connection)
        for statement, parameters in reads:
            literal = psycopg.ClientCursor(raw).mogrify(statement, parameters)
            plan = "\n".join(conn.exec_driver_sql("EXPLAIN " + literal).scalars())
            assert "ix_harvest_webhook_deliveries_tenant_subscription_recent" in plan, plan


def test_schema_sql_applies_on_a_fresh_sqlite_database(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ddl.db'}")
    try:
        raw = engine.raw_connection()
        try:
            for _ in range(2):  # IF NOT EXISTS: applying it again is harmless
                raw.driver_connection.executescript(schema_sql("sqlite"))  # type: ignore[union-attr]
        finally:
            raw.close()
        assert_schema_present(engine)
        exercise(SqlOutboundWebhookStore(engine))
    finally:
        engine.dispose()


def test_the_full_schema_has_every_table_on_the_one_metadata(tmp_path: Path) -> None:
    assert set(full_schema.ALL_TABLES) == set(metadata.sorted_tables)
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'full.db'}")
    try:
        raw = engine.raw_connection()
        try:
            raw.driver_connection.executescript(full_schema.schema_sql("sqlite"))  # type: ignore[union-attr]
        finally:
            raw.close()
        assert_schema_present(engine, full_schema.ALL_TABLES)
    finally:
        engine.dispose()


@pytest.fixture
def fresh_postgres_url(postgres_url: URL) -> Iterator[URL]:
    """A URL whose ``search_path`` is a new, empty schema, dropped after the test."""
    schema = f"harvest_ddl_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield postgres_url.update_query_dict({"options": f"-csearch_path={schema}"})
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


@pytest.mark.postgres
def test_webhook_schema_sql_applies_on_a_fresh_postgres_schema(fresh_postgres_url: URL) -> None:
    engine = sa.create_engine(fresh_postgres_url)
    try:
        for _ in range(2):
            # As psql -f would: the whole script in one go.
            with engine.begin() as conn:
                conn.exec_driver_sql(WEBHOOK_SCHEMA_SQL)
        assert_schema_present(engine)
        exercise(SqlOutboundWebhookStore(engine))
    finally:
        engine.dispose()


# -- errors --------------------------------------------------------------------------------------


def test_driver_error_is_a_store_error(sql_store: SqlOutboundWebhookStore) -> None:
    deliveries_table.drop(sql_store.engine)

    with pytest.raises(StoreError, match="could not read a delivery") as info:
        sql_store.get_delivery("dlv_1")
    assert isinstance(info.value.__cause__, sa.exc.SQLAlchemyError)
    assert "harvest_webhook_deliveries" in str(info.value)  # says which table is wrong

    delivery = DeliveryLog("dlv_1", "sub_1", "order.created", '{"card": "4242"}')
    with pytest.raises(StoreError, match="could not log deliveries") as info:
        sql_store.log_deliveries([delivery])
    # The cause lands in tracebacks and logs: its bound values (payloads) are hidden.
    assert "4242" not in str(info.value.__cause__)


def test_store_error_never_shows_the_secret(sql_store: SqlOutboundWebhookStore) -> None:
    subscription = sql_store.add_subscription(make_subscription())
    subscriptions_table.drop(sql_store.engine)

    calls: list[Callable[[], object]] = [
        lambda: sql_store.add_subscription(make_subscription()),
        lambda: sql_store.update_subscription(subscription.id, SubscriptionChanges(description="x")),
        lambda: sql_store.rotate_secret(subscription.id, SECRET, previous_expires_at=utcnow()),
    ]
    for call in calls:
        with pytest.raises(StoreError) as info:
            call()
        assert SECRET not in str(info.value)
        assert SECRET not in str(info.value.__cause__)


@pytest.mark.postgres
def test_store_error_never_shows_the_database_password(fresh_postgres_url: URL) -> None:
    # The test server trusts local connections, so it accepts (and ignores) any password.
    engine = sa.create_engine(fresh_postgres_url.set(password=PASSWORD))
    try:
        store = SqlOutboundWebhookStore(engine)  # no ensure_schema: the tables are missing
        assert PASSWORD not in repr(store)
        with pytest.raises(StoreError, match="could not read a delivery") as info:
            store.get_delivery("dlv_1")
        assert PASSWORD not in str(info.value)
        assert PASSWORD not in str(info.value.__cause__)
    finally:
        engine.dispose()


def test_unreachable_database_is_a_store_error() -> None:
    # Nothing listens on port 1: the connection itself fails, with no server needed.
    engine = sa.create_engine(f"postgresql+psycopg://harvest:{PASSWORD}@127.0.0.1:1/nowhere")
    try:
        store = SqlOutboundWebhookStore(engine)
        with pytest.raises(StoreError, match="could not list subscriptions in postgresql") as info:
            store.list_subscriptions()
        assert isinstance(info.value.__cause__, sa.exc.OperationalError)
        assert PASSWORD not in str(info.value)
        assert PASSWORD not in repr(store)
    finally:
        engine.dispose()


def field_names(model: type) -> set[str]:
    return {f.name for f in dataclasses.fields(model)}


def test_each_table_has_a_column_per_model_field() -> None:
    # The row mappings are derived from the models' fields by name: a field added to a model
    # without its column (or the reverse) fails here, not in production.
    assert set(subscriptions_table.c.keys()) == field_names(WebhookSubscription)
    assert set(deliveries_table.c.keys()) == field_names(DeliveryLog) | {"lease_token"}
    assert set(attempts_table.c.keys()) == field_names(DeliveryAttempt) | {"id"}


def test_an_integrity_error_that_is_not_a_taken_id_is_a_store_error(
    sql_store: SqlOutboundWebhookStore,
) -> None:
    # It used to be reported as "a subscription with id ... already exists" (issue 16, item 7).
    valid = make_subscription()
    values = {f.name: getattr(valid, f.name) for f in dataclasses.fields(WebhookSubscription)}
    broken = WebhookSubscription.from_trusted({**values, "description": None})  # past the model's checks

    with pytest.raises(StoreError, match="could not add a subscription") as info:
        sql_store.add_subscription(broken)
    assert SECRET not in str(info.value)
    assert sql_store.list_subscriptions() == []
    sql_store.add_subscription(valid)
    with pytest.raises(DuplicateSubscriptionError):
        sql_store.add_subscription(valid)


@pytest.mark.postgres
def test_a_batch_claim_probes_the_primary_key_even_with_statistics_from_before_a_burst(
    postgres_engine: sa.Engine,
) -> None:
    # A table just emptied (the fixture truncates it, so no statistics), then a burst of due rows,
    # as when a backlog builds faster than autovacuum analyses. The statement built before
    # (state and due time in the locking subquery's WHERE) was planned to read every PENDING row
    # through the due index to find its few, in this very setting: tens of milliseconds a claim.
    store = SqlOutboundWebhookStore(postgres_engine)
    now = utcnow()
    deliveries = [
        DeliveryLog(
            id=f"dlv_{n:05d}",
            subscription_id="sub_1",
            topic="a.b",
            payload="x" * 400,
            timestamp=now,
            next_attempt_at=now,
            created_at=now,
        )
        for n in range(4000)
    ]
    store.log_deliveries(deliveries)
    ids = [d.id for d in deliveries[::200]]
    params = {
        "ids": ids,
        "now": now.replace(tzinfo=None),
        "until": (now + timedelta(seconds=60)).replace(tzinfo=None),
        "token": "t" * 32,
        "max_attempts": 5,
    }

    with postgres_engine.begin() as conn:
        plan = "\n".join(conn.execute(sa.text("EXPLAIN " + CLAIM_MANY_SQL), params).scalars())
        conn.rollback()

    assert "pk_harvest_webhook_deliveries" in plan
    assert "_due" not in plan  # neither the due index nor its partial successor
    claimed = store.claim_deliveries(ids, now=now, lease_seconds=60, max_attempts=5)
    assert sorted(c.delivery.id for c in claimed) == ids
