"""Configuration: every ``HARVEST_*`` key, its type and default, in one place.

Precedence: a key in ``app.config`` wins over the keyword argument given to the extension, which
wins over the default here. Keys are read once, in ``init_app``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._input import text_problem
from .errors import ConfigurationError, InvalidFieldError
from .outbound.backoff import RetryPolicy
from .outbound.signing import DEFAULT_SIGNATURE_HEADER, validate_secret
from .outbound.ssrf import TENANT_ALLOW_HINT, SsrfPolicy, parse_cidrs, validate_target
from .shards import MAX_SHARDS


@dataclass(frozen=True)
class Settings:
    """The extension's settings for one app. Field ``foo_bar`` is read from ``HARVEST_FOO_BAR``."""

    #: ``local`` (in-process threads, not durable; the default) or ``rq`` (Redis Queue).
    jobs_backend: str = "local"
    #: Redis URL of the ``rq`` backend.
    redis_url: str = "redis://127.0.0.1:6379/0"
    #: RQ queue name for delivery jobs.
    webhooks_queue: str = "harvest-webhooks"
    #: Attempts per delivery before it is dead-lettered; read when each attempt runs.
    webhooks_max_attempts: int = 5
    #: Base of the exponential backoff, in milliseconds.
    webhooks_initial_backoff_ms: int = 1000
    #: Cap of the backoff and of a ``Retry-After`` hint, in milliseconds.
    webhooks_max_backoff_ms: int = 3_600_000
    #: Seconds to wait for the receiver's response (between bytes).
    webhooks_timeout_seconds: float = 10.0
    #: Seconds to wait for a TCP (and TLS) connection.
    webhooks_connect_timeout_seconds: float = 5.0
    #: Hard limit in seconds on a whole attempt, so a receiver that drips bytes cannot hold a worker.
    webhooks_deadline_seconds: float = 30.0
    #: Consecutive failures after which an active subscription becomes ``failed``.
    webhooks_failure_threshold: int = 50
    #: Name of the Stripe-style signature header.
    webhooks_signature_header: str = DEFAULT_SIGNATURE_HEADER
    #: Seconds a claimed delivery stays leased to its worker; after that the sweeper frees it.
    webhooks_lease_seconds: float = 60.0
    #: Seconds between sweeps (stuck leases, lost jobs) in a worker or the local backend.
    sweep_interval_seconds: float = 5.0
    #: Seconds the old secret keeps signing deliveries after a rotation.
    webhooks_secret_grace_seconds: float = 24 * 3600.0
    #: What dispatch does with a payload that does not match its event type's schema (see the
    #: event catalog): ``refuse`` (raise, write nothing; the default) or ``warn`` (log, and send).
    event_validation: str = "refuse"
    #: Refuse to dispatch a topic that is not an event type in the catalog. Off by default: a topic
    #: without a type is sent unchecked, as it is with no catalog at all.
    event_catalog_strict: bool = False
    #: The application's own endpoint for operational notifications (a subscription turned off
    #: automatically, a delivery dead-lettered), sent through the delivery pipeline like every
    #: webhook. Empty (the default): none are made.
    operational_webhook_url: str = ""
    #: The secret the operational notifications are signed with (required with the URL).
    operational_webhook_secret: str = field(default="", repr=False)
    #: With an operational endpoint: tell it when a subscription's rate limit has held its
    #: deliveries back for this many seconds (from the first delivery held to the latest turn
    #: handed out), once per episode of holding; ``0`` tells nothing of rate limits.
    operational_rate_limit_hold_seconds: float = 300.0
    #: URL prefix of the actuator blueprint.
    actuator_prefix: str = "/actuator/webhooks"
    #: Bearer token that opens the actuator; with none (and no authorizer) every route is refused.
    actuator_token: str = field(default="", repr=False)
    #: Relayed outbox messages older than this many seconds are deleted by the sweeper.
    outbox_retention_seconds: float = 7 * 24 * 3600.0
    #: Threads of the ``local`` backend.
    local_workers: int = 8
    #: Attempts one ``flask harvest worker`` process keeps in flight at once (its thread pool);
    #: a quarter of it is the batch a worker takes, and the size of dispatch's batch jobs. Twice
    #: the ceiling per subscription, so a busy endpoint's next deliveries can wait in the process
    #: for its next free attempt.
    worker_concurrency: int = 64
    #: The most attempts in flight at once for one subscription in one worker process: the
    #: ceiling of its adaptive limit (see :mod:`flask_harvest.outbound.admission`), which grows while the
    #: endpoint answers fast and well and is cut on timeouts, 429/503 and rising latency. Past the
    #: limit, deliveries wait their turn (or, for a failing or slow endpoint, are given back).
    webhooks_max_inflight_per_subscription: int = 32
    #: The least the adaptive limit drops to; equal to the maximum, the limit is a fixed cap.
    webhooks_min_inflight_per_subscription: int = 1
    #: A subscription's limit is cut when its latency rises past this many times its usual
    #: (lowest recent) latency, and by at least 0.1 s.
    webhooks_latency_tolerance: float = 3.0
    #: Deliver to loopback, private, link-local and other non-public addresses. Off by default
    #: (SSRF); turn on for development and tests against a receiver on 127.0.0.1.
    webhooks_allow_private_targets: bool = False
    #: Accept only ``https://`` targets.
    webhooks_https_only: bool = False
    #: Comma-separated networks (``"10.1.0.0/16, fd00:1::/64"``) allowed although not public.
    webhooks_allow_cidrs: str = ""
    #: Comma-separated networks always refused, even when allowed by the two keys above.
    webhooks_deny_cidrs: str = ""
    #: Comma-separated networks a tenant's endpoint may reach although not public. The two allow
    #: keys above are the operator's and never apply to a tenant's endpoints (a customer must not
    #: reach the app's own network through them).
    webhooks_tenant_allow_cidrs: str = ""
    #: The largest workflow input accepted, in bytes of UTF-8 JSON.
    workflow_max_input_bytes: int = 256 * 1024
    #: Seconds a claimed workflow execution stays leased to its worker without a heartbeat.
    workflow_lease_seconds: float = 30.0
    #: Times an execution whose worker died while it ran alone in its process (its lease expired)
    #: is run again before it fails as a poison pill. A death beside other runs is not counted: it
    #: quarantines each of them (they run alone from then on).
    workflow_max_recovery_attempts: int = 5
    #: Workflow runs one worker process runs at once, on threads. A run that kills its process (a
    #: poison pill) takes the runs beside it down: none of them is charged for it, and each runs
    #: alone from then on, so only a death while alone counts towards the poison-pill limit.
    workflow_concurrency: int = 12
    #: Missed ticks a workflow schedule starts at most after its workers were down (the most
    #: recent ones; the older ones are skipped and logged); ``0`` starts none of them.
    workflow_schedule_catchup: int = 1
    #: URL prefix of the workflow HTTP API blueprint.
    workflow_api_prefix: str = "/api/harvest"
    #: Workflow queues and their limits: a mapping (or its JSON) of queue name to
    #: ``{"concurrency": n, "rate_limit": [limit, seconds]}``; they win over ``harvest.queue()``.
    workflow_queues: str = ""
    #: The databases workflow runs are spread over (shards): a list (or a comma-separated string)
    #: of SQLAlchemy URLs, shard 0 first. Empty (the default): every run lives in the app's database.
    workflow_shards: str = ""
    #: The longest ``?wait=N`` the result route holds a request open for, in seconds.
    workflow_result_max_wait_seconds: float = 30.0
    #: The deepest chain of completion triggers: a target whose trigger depth (1 for a target of a
    #: directly started run) would exceed it is not started (``chain_depth_exceeded``).
    trigger_max_chain_depth: int = 16
    #: Completion-trigger fires rows older than this many seconds, whose source execution no longer
    #: exists, are deleted by the sweeper; ``0`` (the default) keeps every row.
    trigger_fires_retention_seconds: float = 0.0
    #: Completion-callback targets of every execution, after its own: a JSON list (or a Python
    #: list) of ``{"url": ..., "filter": {"type": ...}}``. Checked at ``init_app``.
    completion_callback_defaults: str = ""
    #: Hosts completion callbacks may reach: comma-separated (or a list) ``api.example.com``,
    #: ``*.example.com`` (subdomains only), each with an optional ``:port``. Empty refuses every target.
    completion_callback_allowlist: str = ""
    #: The HMAC-SHA256 key of ``X-Harvest-Signature``; never stored, logged or shown.
    completion_callback_secret: str = field(default="", repr=False)
    #: Accept ``http://`` completion-callback targets, to any allowed host (not recommended).
    completion_callback_allow_http: bool = False
    #: Accept allowlisted IP-literal hosts; loopback, private, link-local, CGNAT and ULA stay refused.
    completion_callback_allow_ip_literals: bool = False
    #: Development and tests only: callbacks may reach loopback and private addresses, and use
    #: ``http://`` to those addresses only (still only allowlisted hosts). Warned about at start-up.
    completion_callback_allow_private_targets: bool = False
    #: Attempts per completion callback before it fails (frozen into each row at enqueue).
    completion_callback_max_attempts: int = 10
    #: The first retry delay of a completion callback, in milliseconds (doubling each attempt).
    completion_callback_initial_backoff_ms: int = 30_000
    #: The longest retry delay of a completion callback, in milliseconds.
    completion_callback_max_backoff_ms: int = 600_000
    #: Seconds a claimed completion delivery stays leased; after that it is due again.
    completion_callback_lease_seconds: float = 30.0
    #: The most completion callbacks in flight at once to one endpoint (scheme, host, port) in one
    #: worker process: the ceiling of its adaptive limit in the worker's delivery pool.
    completion_callback_max_inflight_per_endpoint: int = 8
    #: Serve the operator dashboard (needs ``app.secret_key``; opened like the actuator).
    dashboard: bool = False
    #: URL prefix of the operator dashboard.
    dashboard_url_prefix: str = "/harvest"
    #: Seconds a dashboard sign-in lasts before the token must be given again.
    dashboard_session_seconds: float = 8 * 3600.0

    #: The key that signs consumer portal links and sessions; empty (the default): the app's
    #: ``secret_key``. Changing it ends every portal link and session at once.
    portal_secret_key: str = field(default="", repr=False)
    #: Seconds a portal link made by ``harvest.portal_url`` can be opened (at most 7 days).
    portal_link_seconds: float = 600.0
    #: Seconds a portal session (opened from a link) lasts.
    portal_session_seconds: float = 3600.0
    #: The portal's title, shown to customers.
    portal_name: str = "Webhooks"
    #: An image shown beside the portal's title: an ``https://`` URL or a path of the app.
    portal_logo_url: str = ""
    #: The portal's accent colour (links, buttons), as ``#rrggbb``; empty: the console's.
    portal_accent_color: str = ""
    #: The portal's page background, as ``#rrggbb``; empty: the console's.
    portal_background_color: str = ""
    #: The portal's text colour, as ``#rrggbb``; empty: the console's.
    portal_text_color: str = ""
    #: The origins that may show the portal in a frame (comma-separated, such as
    #: ``https://app.example.com``); empty (the default): none may.
    portal_frame_ancestors: str = ""

    #: Count deliveries, attempts, workflow ends, callbacks and trigger fires as Prometheus metrics
    #: and serve them for scraping (needs the ``metrics`` extra, ``prometheus_client``).
    metrics: bool = False
    #: The scrape route; empty (the default) means ``<HARVEST_ACTUATOR_PREFIX>/metrics``.
    metrics_path: str = ""
    #: Serve the scrape route to anyone, without the actuator's token or authorizer: only where the
    #: network keeps strangers away from the app (the metrics hold no secrets, but do tell volumes).
    metrics_unauthenticated: bool = False
    #: Each count a scrape reads from the database (deliveries, runs, fires by state) stops at
    #: this many rows: the scrape's cost is bounded by it, whatever the tables hold.
    metrics_count_limit: int = 10_000

    @property
    def metrics_route(self) -> str:
        """The path the metrics are scraped from."""
        return self.metrics_path or self.actuator_prefix.rstrip("/") + "/metrics"

    @property
    def backoff(self) -> tuple[int, int]:
        return self.webhooks_initial_backoff_ms, self.webhooks_max_backoff_ms

    @property
    def webhook_retry_policy(self) -> RetryPolicy:
        """How webhook deliveries are retried: full jitter, every status but 410 retried, a
        ``Retry-After`` capped by the longest backoff."""
        return RetryPolicy(
            self.webhooks_max_attempts,
            self.webhooks_initial_backoff_ms,
            self.webhooks_max_backoff_ms,
            jitter=True,
        )

    @property
    def ssrf_policy(self) -> SsrfPolicy:
        """The SSRF policy these settings describe (delivery targets are checked against it)."""
        return SsrfPolicy(
            allow_private=self.webhooks_allow_private_targets,
            https_only=self.webhooks_https_only,
            allow_cidrs=parse_cidrs(self.webhooks_allow_cidrs),
            deny_cidrs=parse_cidrs(self.webhooks_deny_cidrs),
        )

    @property
    def tenant_ssrf_policy(self) -> SsrfPolicy:
        """The SSRF policy of a tenant's endpoints: public addresses and
        ``HARVEST_WEBHOOKS_TENANT_ALLOW_CIDRS`` only, whatever the operator's own targets may
        reach; the deny list and ``https://`` only apply as to every target."""
        return SsrfPolicy(
            allow_private=False,
            https_only=self.webhooks_https_only,
            allow_cidrs=parse_cidrs(self.webhooks_tenant_allow_cidrs),
            deny_cidrs=parse_cidrs(self.webhooks_deny_cidrs),
            allow_hint=TENANT_ALLOW_HINT,
        )

    def ssrf_policy_for(self, tenant: str | None) -> SsrfPolicy:
        """The SSRF policy of a subscription of ``tenant`` (``None``: the app's own)."""
        return self.ssrf_policy if tenant is None else self.tenant_ssrf_policy


#: The shortest ``HARVEST_ACTUATOR_TOKEN`` accepted (empty means "no token").
MIN_ACTUATOR_TOKEN_LENGTH = 16

#: A metrics route: an absolute path of plain characters.
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9._~/-]*")

PREFIX = "HARVEST_"
#: The ``HARVEST_*`` key of each setting, e.g. ``KEYS["jobs_backend"] == "HARVEST_JOBS_BACKEND"``.
KEYS = {f.name: PREFIX + f.name.upper() for f in dataclasses.fields(Settings)}
JOBS_BACKENDS = ("local", "rq")
#: The values of ``HARVEST_EVENT_VALIDATION``.
EVENT_VALIDATION_MODES = ("refuse", "warn")
#: Settings whose ``0`` means "never" rather than being refused.
_ZERO_MEANS_NEVER = frozenset(
    {"trigger_fires_retention_seconds", "workflow_schedule_catchup", "operational_rate_limit_hold_seconds"}
)


def _coerce(name: str, value: Any, default: Any) -> Any:
    key = KEYS[name]
    kind = type(default)
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "0", "false", "no"):
            return value.lower() in ("1", "true", "yes")
        raise ConfigurationError(f"{key} must be true or false, not {value!r}")
    if kind in (int, float):
        try:
            number = kind(value)
        except OverflowError:  # int(float("inf"))
            raise ConfigurationError(f"{key} must be a finite number, not {value!r}") from None
        except (TypeError, ValueError):
            raise ConfigurationError(f"{key} must be a number, not {value!r}") from None
        if not math.isfinite(number):  # "nan" and "inf" parse as floats; nan <= 0 is False
            raise ConfigurationError(f"{key} must be a finite number, not {value!r}")
        if number == 0 and name in _ZERO_MEANS_NEVER:
            return number
        if number <= 0:
            raise ConfigurationError(f"{key} must be greater than zero, not {value!r}")
        return number
    if name == "completion_callback_defaults" and isinstance(value, list | tuple):
        return json.dumps(list(value))
    if name == "workflow_queues" and isinstance(value, Mapping):
        try:
            return json.dumps(dict(value))
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"{key} must map queue names to JSON limits ({exc})") from None
    if name.endswith(
        ("_cidrs", "_allowlist", "_shards", "_ancestors")
    ):  # a network list: a comma-separated string, or a list of strings
        if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
            return ",".join(value)
        if not isinstance(value, str):
            raise ConfigurationError(f"{key} must be a comma-separated string or a list of strings")
        return value
    # A string whose default is empty (the actuator token) may be set empty: "off".
    if not isinstance(value, str) or (not value and default != ""):
        raise ConfigurationError(f"{key} must be a non-empty string")
    return value


def load_settings(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> Settings:
    """Build :class:`Settings` from an app's config and the extension's keyword arguments.

    :raises ConfigurationError: an unknown keyword or a value of the wrong type or range.
    """
    unknown = set(overrides) - set(KEYS)
    if unknown:
        raise ConfigurationError(
            f"unknown option(s) {', '.join(sorted(unknown))}; known options: {', '.join(KEYS)}"
        )
    values: dict[str, Any] = {}
    for setting in dataclasses.fields(Settings):
        default = setting.default
        if KEYS[setting.name] in config:
            values[setting.name] = _coerce(setting.name, config[KEYS[setting.name]], default)
        elif setting.name in overrides:
            values[setting.name] = _coerce(setting.name, overrides[setting.name], default)
    settings = Settings(**values)
    if settings.jobs_backend not in JOBS_BACKENDS:
        raise ConfigurationError(
            f"{KEYS['jobs_backend']} must be one of {', '.join(JOBS_BACKENDS)}, not {settings.jobs_backend!r}"
        )
    if settings.event_validation not in EVENT_VALIDATION_MODES:
        raise ConfigurationError(
            f"{KEYS['event_validation']} must be one of {', '.join(EVENT_VALIDATION_MODES)}, "
            f"not {settings.event_validation!r}"
        )
    for name in ("webhooks_allow_cidrs", "webhooks_deny_cidrs", "webhooks_tenant_allow_cidrs"):
        try:
            parse_cidrs(getattr(settings, name))
        except ValueError as exc:
            raise ConfigurationError(
                f"{KEYS[name]} must list networks such as '10.1.0.0/16, fd00::/8' ({exc})"
            ) from None
    shard_urls(settings)
    _check_operational_webhook(settings)
    _check_portal(settings)
    token = settings.actuator_token
    if token and (len(token.strip()) < MIN_ACTUATOR_TOKEN_LENGTH or token != token.strip()):
        # A guessable token opens the admin API; "Bearer " plus spaces must never be a credential.
        raise ConfigurationError(
            f"{KEYS['actuator_token']} must be at least {MIN_ACTUATOR_TOKEN_LENGTH} characters "
            "without leading or trailing whitespace (or empty, for no token)"
        )
    for name in ("actuator_prefix", "workflow_api_prefix"):
        # A URL prefix becomes part of every route's rule: without a leading '/' the routes cannot
        # be registered, and '<' would turn part of it into a URL converter.
        if not _PLAIN_PATH.fullmatch(getattr(settings, name)):
            raise ConfigurationError(
                f"{KEYS[name]} must be a plain path such as '/api/harvest' (a leading '/'; letters, "
                "digits, -._~/)"
            )
    prefix = settings.dashboard_url_prefix
    if not prefix.startswith("/") or prefix == "/" or prefix.endswith("/") or "//" in prefix:
        raise ConfigurationError(
            f"{KEYS['dashboard_url_prefix']} must be a path such as '/harvest' "
            "(a leading '/', no trailing one)"
        )
    if settings.completion_callback_initial_backoff_ms > settings.completion_callback_max_backoff_ms:
        raise ConfigurationError(
            f"{KEYS['completion_callback_initial_backoff_ms']} must not exceed "
            f"{KEYS['completion_callback_max_backoff_ms']}"
        )
    if settings.webhooks_min_inflight_per_subscription > settings.webhooks_max_inflight_per_subscription:
        raise ConfigurationError(
            f"{KEYS['webhooks_min_inflight_per_subscription']} must not exceed "
            f"{KEYS['webhooks_max_inflight_per_subscription']} (set them equal for a fixed cap)"
        )
    if settings.webhooks_latency_tolerance < 1:
        raise ConfigurationError(
            f"{KEYS['webhooks_latency_tolerance']} must be at least 1 (a latency of its usual value "
            f"never counts as rising), not {settings.webhooks_latency_tolerance!r}"
        )
    if settings.webhooks_initial_backoff_ms > settings.webhooks_max_backoff_ms:
        raise ConfigurationError(
            f"{KEYS['webhooks_initial_backoff_ms']} must not exceed {KEYS['webhooks_max_backoff_ms']}"
        )
    if settings.metrics_path and not _PLAIN_PATH.fullmatch(settings.metrics_path):
        # Letters, digits and -._~/ only: '<' would turn the route into a URL converter.
        raise ConfigurationError(
            f"{KEYS['metrics_path']} must be a plain path such as '/metrics' (letters, digits, -._~/)"
        )
    return settings


def _check_operational_webhook(settings: Settings) -> None:
    """Refuse an operational endpoint without its secret (or the reverse), a URL that is not one
    or that the SSRF policy refuses, and a secret that cannot sign; never showing the secret."""
    url_key, secret_key = KEYS["operational_webhook_url"], KEYS["operational_webhook_secret"]
    url, secret = settings.operational_webhook_url, settings.operational_webhook_secret
    if not url and not secret:
        return
    if not url or not secret:
        missing, given = (url_key, secret_key) if not url else (secret_key, url_key)
        raise ConfigurationError(f"{given} is set but {missing} is not: set both, or neither")
    try:
        # The syntax check of a subscription's URL, then the SSRF policy's.
        validate_target(url, settings.ssrf_policy)
    except InvalidFieldError as exc:
        raise ConfigurationError(f"{url_key} is not a usable endpoint: {exc.message}") from None
    try:
        validate_secret(secret, secret_key)
    except InvalidFieldError as exc:
        # The message names the problem, never the value.
        raise ConfigurationError(f"{secret_key} is not a usable signing secret: {exc.message}") from None


#: The longest life of a portal link (``HARVEST_PORTAL_LINK_SECONDS``, ``expires_in``): a link is a
#: credential in an address bar.
MAX_PORTAL_LINK_SECONDS = 7 * 24 * 3600
#: The longest portal session (``HARVEST_PORTAL_SESSION_SECONDS``).
MAX_PORTAL_SESSION_SECONDS = 30 * 24 * 3600
#: The shortest ``HARVEST_PORTAL_SECRET_KEY`` accepted: it signs credentials.
MIN_PORTAL_KEY_LENGTH = 32
#: The portal's theme colours, by setting, and the stylesheet variable each sets.
PORTAL_COLORS = {
    "portal_accent_color": "--accent",
    "portal_background_color": "--bg",
    "portal_text_color": "--fg",
}
#: A theme colour: six hex digits, nothing a stylesheet could read as more than a colour.
_COLOR = re.compile(r"#[0-9A-Fa-f]{6}")
#: A logo: an https URL or an absolute path of the app, without quotes, spaces or parentheses.
_LOGO_URL = re.compile(r"(?:https://[A-Za-z0-9.-]+(?::[0-9]{1,5})?)?/[A-Za-z0-9._~/%?=&+-]*")
#: A frame ancestor: ``'self'`` or a scheme and host (a ``*.`` subdomain wildcard and a port
#: allowed), the forms CSP's frame-ancestors takes.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_FRAME_ANCESTOR = re.compile(
    rf"'self'|https?://(?:\*\.{_LABEL}(?:\.{_LABEL})+|{_LABEL}(?:\.{_LABEL})*)(?::(?P<port>[0-9]{{1,5}}))?"
)


def portal_frame_ancestors(settings: Settings) -> list[str]:
    """The origins of ``HARVEST_PORTAL_FRAME_ANCESTORS``, in order (empty: no frame may show the
    portal).

    :raises ConfigurationError: an entry is not ``'self'`` or an origin such as
        ``https://app.example.com``.
    """
    key = KEYS["portal_frame_ancestors"]
    origins = [part.strip() for part in settings.portal_frame_ancestors.split(",") if part.strip()]
    for origin in origins:
        found = _FRAME_ANCESTOR.fullmatch(origin)
        if found is None or not 0 < int(found.group("port") or 1) <= 65535:
            raise ConfigurationError(
                f"{key} must list origins such as 'https://app.example.com' or 'self' in quotes, "
                f"not {origin[:100]!r}"
            )
    return origins


def _check_portal(settings: Settings) -> None:
    """Refuse a portal theme or frame policy that is not plainly a colour, a URL or origins: each
    reaches a stylesheet or a header as it is."""
    portal_frame_ancestors(settings)
    session = settings.portal_session_seconds
    if not 60 <= session <= MAX_PORTAL_SESSION_SECONDS:
        # A cookie's expiry must be a date (a huge value is none), and a session under a minute
        # ends before its first page is read.
        raise ConfigurationError(
            f"{KEYS['portal_session_seconds']} must be between 60 and {MAX_PORTAL_SESSION_SECONDS} (30 days)"
        )
    key = settings.portal_secret_key
    if key and (len(key) < MIN_PORTAL_KEY_LENGTH or key != key.strip()):
        raise ConfigurationError(
            f"{KEYS['portal_secret_key']} must be at least {MIN_PORTAL_KEY_LENGTH} characters without "
            "leading or trailing whitespace (a long random value), or empty for the app's secret_key"
        )
    if not 10 <= settings.portal_link_seconds <= MAX_PORTAL_LINK_SECONDS:
        # Refused here, or every harvest.portal_url() call would fail on the default life (or
        # make a link that expires before a browser follows the redirect to it).
        raise ConfigurationError(
            f"{KEYS['portal_link_seconds']} must be between 10 and {MAX_PORTAL_LINK_SECONDS} (7 days)"
        )
    for name in PORTAL_COLORS:
        color = getattr(settings, name)
        if color and not _COLOR.fullmatch(color):
            raise ConfigurationError(f"{KEYS[name]} must be a colour such as '#1f6feb'")
    logo = settings.portal_logo_url
    if logo and (len(logo) > 2048 or not _LOGO_URL.fullmatch(logo) or logo.startswith("//")):
        raise ConfigurationError(
            f"{KEYS['portal_logo_url']} must be an https:// URL or a path of the app such as "
            "'/static/logo.svg'"
        )
    name = settings.portal_name
    if len(name) > 100 or text_problem(name) is not None or not name.strip():
        raise ConfigurationError(f"{KEYS['portal_name']} must be a title of 1 to 100 characters")


def shard_urls(settings: Settings) -> list[str]:
    """The URLs of ``HARVEST_WORKFLOW_SHARDS``, in order (empty when runs are not sharded).

    :raises ConfigurationError: an entry is not a PostgreSQL or SQLite URL, or there are more than
        :data:`~flask_harvest.shards.MAX_SHARDS` (the message never shows a password).
    """
    key = KEYS["workflow_shards"]
    urls = [part.strip() for part in settings.workflow_shards.split(",") if part.strip()]
    if len(urls) > MAX_SHARDS:
        raise ConfigurationError(f"{key} lists {len(urls)} databases; at most {MAX_SHARDS}")
    for index, url in enumerate(urls):
        scheme = _DATABASE_URL.match(url)
        if scheme is None:
            raise ConfigurationError(
                f"{key} entry {index} is not a database URL such as postgresql+psycopg://user@host/db"
            )
        if scheme.group(1) not in ("postgresql", "sqlite"):
            raise ConfigurationError(
                f"{key} entry {index} must be a PostgreSQL or SQLite URL, not a {scheme.group(1)!r} one"
            )
    return urls


#: A SQLAlchemy URL's start: ``backend[+driver]://``; the engine parses the rest when it connects.
_DATABASE_URL = re.compile(r"([a-z][a-z0-9]*)(?:\+[a-z0-9_]+)?://")
