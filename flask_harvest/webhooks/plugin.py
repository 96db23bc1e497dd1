"""The Flask extension: reads the configuration once and wires store, jobs and delivery per app."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import redis
from flask import Flask, Request, current_app

from .. import signals
from ..config import KEYS, Settings, load_settings
from ..errors import ConfigurationError, HarvestError
from ..jobs.base import JobBackend
from ..jobs.local import LocalBackend
from ..jobs.rq import RqBackend, job_timeout_for
from ..transport import Transport
from .delivery import DeliveryRunner
from .manager import Delegate, OutboundWebhookManager, RelayReport
from .models import AttemptResult, Claim, DeliveryLog, DeliveryState, WebhookSubscriptionStatus, utcnow
from .outbox import SqlOutbox
from .stores.base import OutboundWebhookHandler
from .stores.sql import SqlOutboundWebhookStore
from .sweeper import SweepReport, sweep

if TYPE_CHECKING:
    from flask_sqlalchemy import SQLAlchemy

EXTENSION_KEY = "harvest"
log = logging.getLogger("flask_harvest")


#: Decides whether a request may use the actuator (return ``True`` to allow it).
Authorizer = Callable[[Request], bool]


@dataclass
class ActuatorAccess:
    """Who may use the actuator: the authorizer registered on the extension, if any."""

    authorizer: Authorizer | None = None


@dataclass
class HarvestState:
    """Everything the extension built for one app, kept in ``app.extensions["harvest"]``."""

    settings: Settings
    store: OutboundWebhookHandler
    backend: JobBackend
    transport: Transport
    runner: DeliveryRunner
    manager: OutboundWebhookManager
    access: ActuatorAccess

    def sweep(self) -> SweepReport:
        """Run one sweep: relay outbox messages whose relay never ran, purge old relayed ones,
        then free expired leases and queue due deliveries that have no job."""
        relay = RelayReport(0, 0)
        outbox = self.manager.outbox
        if outbox is not None:
            # An outbox failure (its table missing, say) must not stop the delivery sweep below.
            try:
                relay = self.manager.relay_outbox()
                cutoff = utcnow() - timedelta(seconds=self.settings.outbox_retention_seconds)
                outbox.purge_relayed_before(cutoff)
            except HarvestError as exc:
                log.error("harvest: outbox relay failed (%s); sweeping deliveries anyway", exc)
        # A delegate owns the deliveries handed to it: queueing them here would send them twice.
        requeue = self.manager.delegate is None
        return sweep(self.store, self.backend, batch=1000, requeue=requeue).with_relay(relay)

    def close(self) -> None:
        """Finish after-commit relays, stop the job backend and release its connections."""
        self.manager.close()
        self.backend.close()


class OutboundWebhookPlugin:
    """Outbound webhooks for a Flask app.

    A store must be chosen explicitly, as in the seed: pass one (``InMemoryOutboundWebhookHandler``
    for tests, a :class:`~flask_harvest.webhooks.stores.sql.SqlOutboundWebhookStore`), or build the
    SQL store on a Flask-SQLAlchemy database with :meth:`sql`. Keyword options are the
    :class:`~flask_harvest.config.Settings` fields (``webhooks_max_attempts=3``); a ``HARVEST_*``
    key in ``app.config`` wins over them.

    :param store: the store, shared by every app this extension is registered on.
    :param app: register on this app at once, as with every Flask extension.
    :param delegate: hand each delivery to this callable instead of the job backend.
    """

    def __init__(
        self,
        store: OutboundWebhookHandler | None = None,
        app: Flask | None = None,
        *,
        delegate: Delegate | None = None,
        **options: Any,
    ) -> None:
        self._store = store
        self._store_factory: Callable[[Flask], OutboundWebhookHandler] | None = None
        self._delegate = delegate
        self._options = options
        self._access = ActuatorAccess()
        unknown = set(options) - set(KEYS)
        if unknown:
            raise ConfigurationError(
                f"unknown option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(KEYS))}"
            )
        if app is not None:
            self.init_app(app)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} store={self._store!r}>"

    @classmethod
    def sql(
        cls, db: SQLAlchemy, app: Flask | None = None, *, create_tables: bool = True, **options: Any
    ) -> OutboundWebhookPlugin:
        """Build the extension with a SQL store on the app's Flask-SQLAlchemy ``db``.

        :param create_tables: create the harvest tables at ``init_app`` if they do not exist
            (turn off when migrations own the schema).
        """

        def build(app: Flask) -> OutboundWebhookHandler:
            with app.app_context():
                store = SqlOutboundWebhookStore(db.engine)
            if create_tables:
                store.ensure_schema()
            return store

        plugin = cls(None, None, **options)
        plugin._store_factory = build
        if app is not None:
            plugin.init_app(app)
        return plugin

    def init_app(self, app: Flask) -> None:
        """Register the extension on ``app``: read ``HARVEST_*`` keys and build the pipeline."""
        if EXTENSION_KEY in app.extensions:
            raise ConfigurationError(
                "flask-harvest is already registered on this app; call init_app once per app "
                "(use one OutboundWebhookPlugin, or create the app anew in tests)"
            )
        settings = load_settings(app.config, self._options)
        store = self._store_factory(app) if self._store_factory else self._store
        if store is None:
            raise ConfigurationError(
                "choose a store: OutboundWebhookPlugin(InMemoryOutboundWebhookHandler()) for tests, "
                "or OutboundWebhookPlugin.sql(db) for the SQL store"
            )
        transport = Transport(
            connect_timeout=settings.webhooks_connect_timeout_seconds,
            read_timeout=settings.webhooks_timeout_seconds,
            deadline=settings.webhooks_deadline_seconds,
            policy=settings.ssrf_policy,
        )
        holder: list[HarvestState] = []
        backend = _build_backend(app, settings, holder)
        runner = DeliveryRunner(store, settings, transport, backend, listener=_signal_listener(app))
        outbox = SqlOutbox(store.engine) if isinstance(store, SqlOutboundWebhookStore) else None
        manager = OutboundWebhookManager(
            store, backend, settings, outbox=outbox, delegate=self._delegate, on_skipped=_skip_listener(app)
        )
        state = HarvestState(settings, store, backend, transport, runner, manager, self._access)
        holder.append(state)
        app.extensions[EXTENSION_KEY] = state

        from ..cli import harvest_cli
        from .actuator import actuator

        app.cli.add_command(harvest_cli)
        app.register_blueprint(actuator, url_prefix=settings.actuator_prefix)
        if not backend.durable:
            app.logger.warning(
                "flask-harvest uses the 'local' job backend: delivery jobs live in this process "
                "and are lost if it exits; set %s = 'rq' in production",
                KEYS["jobs_backend"],
            )

    def actuator_authorizer(self, authorizer: Authorizer) -> Authorizer:
        """Register a function that decides who may use the actuator; use it as a decorator::

            @plugin.actuator_authorizer
            def only_admins(request):
                return current_user.is_admin

        A request with the right ``HARVEST_ACTUATOR_TOKEN`` is allowed whatever it returns.
        """
        self._access.authorizer = authorizer
        return authorizer

    @property
    def store(self) -> OutboundWebhookHandler:
        """The store of the current app."""
        return get_state().store

    @property
    def manager(self) -> OutboundWebhookManager:
        """The manager of the current app (needs an app context)."""
        return get_state().manager

    @property
    def settings(self) -> Settings:
        return get_state().settings


def _build_backend(app: Flask, settings: Settings, holder: list[HarvestState]) -> JobBackend:
    if settings.jobs_backend == "rq":
        return RqBackend(
            redis.Redis.from_url(settings.redis_url),
            settings.webhooks_queue,
            job_timeout=job_timeout_for(
                settings.webhooks_deadline_seconds, settings.webhooks_connect_timeout_seconds
            ),
            # One job per this many deliveries of a fan-out: what a worker takes at a time.
            batch_size=max(1, settings.worker_concurrency // 4),
        )

    def run(delivery_id: str) -> object:
        with app.app_context():
            return holder[0].runner.run(delivery_id)

    def periodic() -> object:
        with app.app_context():
            return holder[0].sweep()

    return LocalBackend(
        run, workers=settings.local_workers, periodic=periodic, interval=settings.sweep_interval_seconds
    )


def _signal_listener(app: Flask) -> Callable[[Claim, AttemptResult, WebhookSubscriptionStatus | None], None]:
    by_state = {
        DeliveryState.DELIVERED: signals.delivery_succeeded,
        DeliveryState.PENDING: signals.delivery_failed,
        DeliveryState.DLQ: signals.delivery_dead_lettered,
        DeliveryState.SKIPPED: signals.delivery_skipped,
    }

    def listener(claim: Claim, result: AttemptResult, changed: WebhookSubscriptionStatus | None) -> None:
        delivery = claim.delivery.replace(
            state=result.state,
            attempt=result.attempt_number,
            next_attempt_at=result.next_attempt_at,
            last_error=result.last_error,
            timestamp=result.timestamp,
        )
        by_state[result.state].send(app, delivery=delivery)
        if changed is WebhookSubscriptionStatus.DISABLED:
            signals.subscription_disabled.send(app, subscription_id=delivery.subscription_id)
        elif changed is WebhookSubscriptionStatus.FAILED:
            signals.subscription_failed.send(app, subscription_id=delivery.subscription_id)

    return listener


def _skip_listener(app: Flask) -> Callable[[Sequence[DeliveryLog]], None]:
    def listener(deliveries: Sequence[DeliveryLog]) -> None:
        for delivery in deliveries:
            signals.delivery_skipped.send(app, delivery=delivery)

    return listener


def get_state(app: Flask | None = None) -> HarvestState:
    """Return the extension's state for ``app`` (default: the current app)."""
    target = app if app is not None else current_app
    try:
        state: HarvestState = target.extensions[EXTENSION_KEY]
    except KeyError:
        raise ConfigurationError(
            "flask-harvest is not registered on this app; call OutboundWebhookPlugin(...).init_app(app)"
        ) from None
    return state


def get_manager() -> OutboundWebhookManager:
    """Return the current app's :class:`OutboundWebhookManager` (needs an app context)."""
    return get_state().manager
