"""The Flask extension: reads the configuration once, builds the engine and registers it on an app.

Everything that runs (store, jobs, delivery, sweeper) is the Flask-free engine of
:mod:`flask_harvest.engine`; this module only wires it to Flask: configuration, signals, the
actuator blueprint and the ``flask harvest`` commands.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from flask import Flask

from . import signals
from ._app import EXTENSION_KEY, get_engine
from .cli import harvest_cli
from .config import KEYS, Settings, load_settings
from .dashboard import install_dashboard
from .dashboard._core import check_dashboard_config
from .engine import AdminAccess, Authorizer, HarvestEngine, build_engine
from .errors import ConfigurationError
from .webhooks.actuator import actuator
from .webhooks.delivery import AttemptListener
from .webhooks.manager import Delegate, OutboundWebhookManager
from .webhooks.models import AttemptResult, Claim, DeliveryLog, DeliveryState, WebhookSubscriptionStatus
from .webhooks.stores.base import OutboundWebhookHandler
from .webhooks.stores.sql import SqlOutboundWebhookStore

if TYPE_CHECKING:
    from flask_sqlalchemy import SQLAlchemy

log = logging.getLogger(__name__)


class OutboundWebhookPlugin:
    """Outbound webhooks for a Flask app.

    A store must be chosen explicitly: pass one (``InMemoryOutboundWebhookHandler``
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
        self._access = AdminAccess()
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
        if settings.dashboard:
            check_dashboard_config(app)
        # Before anything is built: a missing prometheus_client leaves nothing to clean up.
        install_metrics = _install_metrics() if settings.metrics else None
        store = self._store_factory(app) if self._store_factory else self._store
        if store is None:
            raise ConfigurationError(
                "choose a store: OutboundWebhookPlugin(InMemoryOutboundWebhookHandler()) for tests, "
                "or OutboundWebhookPlugin.sql(db) for the SQL store"
            )
        engine = build_engine(
            settings,
            store,
            delegate=self._delegate,
            job_context=app.app_context,
            on_attempt=_signal_listener(app),
            on_skipped=_skip_listener(app),
            access=self._access,
        )
        app.extensions[EXTENSION_KEY] = engine
        app.cli.add_command(harvest_cli)
        app.register_blueprint(actuator, url_prefix=settings.actuator_prefix)
        if settings.dashboard:
            install_dashboard(app, settings)
        if install_metrics is not None:
            try:
                install_metrics(app)
            except BaseException:
                engine.close()  # its job threads must not outlive an app that failed to start
                raise
        if not engine.backend.durable:
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
    def engine(self) -> HarvestEngine:
        """The engine of the current app (needs an app context)."""
        return get_engine()

    @property
    def store(self) -> OutboundWebhookHandler:
        """The store of the current app (needs an app context)."""
        return get_engine().store

    @property
    def manager(self) -> OutboundWebhookManager:
        """The manager of the current app (needs an app context)."""
        return get_engine().manager

    @property
    def settings(self) -> Settings:
        """The settings of the current app (needs an app context)."""
        return get_engine().settings

    def close(self, app: Flask | None = None) -> None:
        """Stop the engine of ``app`` (default: the current app): finish after-commit relays, stop
        the job backend's threads and release its connections. Call it when a script or test ends."""
        get_engine(app).close()


def _signal_listener(app: Flask) -> AttemptListener:
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
        by_state[result.state].send(app, delivery=delivery, attempt=result.attempt)
        if changed is WebhookSubscriptionStatus.DISABLED:
            signals.subscription_disabled.send(app, subscription_id=delivery.subscription_id)
        elif changed is WebhookSubscriptionStatus.FAILED:
            signals.subscription_failed.send(app, subscription_id=delivery.subscription_id)

    return listener


def _skip_listener(app: Flask) -> Callable[[Sequence[DeliveryLog]], None]:
    def listener(deliveries: Sequence[DeliveryLog]) -> None:
        for delivery in deliveries:
            signals.delivery_skipped.send(app, delivery=delivery, attempt=None)

    return listener


def _install_metrics() -> Callable[[Flask], None]:
    """Return :func:`flask_harvest.metrics.install`; that module needs the optional ``prometheus_client``."""
    # Imported here, not at the top: importing flask_harvest must work without prometheus_client.
    try:
        from . import metrics
    except ModuleNotFoundError as exc:
        if exc.name != "prometheus_client":
            raise
        raise ConfigurationError(
            f"{KEYS['metrics']} needs prometheus_client: pip install 'flask-harvest[metrics]' "
            f"(or set {KEYS['metrics']} = False)"
        ) from None
    return metrics.install


def get_manager() -> OutboundWebhookManager:
    """Return the current app's :class:`OutboundWebhookManager` (needs an app context)."""
    return get_engine().manager
