"""Completion callbacks in one engine: registration at start, enqueue at the terminal transition,
delivery by the workers, the sweeper's step, and the operator's list and redrive.

The edges are thin: :mod:`flask_harvest.callbacks.policy`, ``filters``, ``targets``, ``envelope``
and :mod:`flask_harvest.callbacks.outcome` are pure, :mod:`flask_harvest.callbacks.store` is the
SQL.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import Connection

from .. import tracing
from .._input import id_problem
from .._time import utcnow
from ..config import KEYS, Settings
from ..errors import ConfigurationError, InvalidFieldError, NotFoundError
from ..http.cursor import decode_position, encode_position
from ..jobs.base import JobBackend, JobBackendError, JobRef
from ..jobs.requeue import requeue_missing
from ..jobs.tasks import run_here
from ..outbound.admission import Ticket
from ..outbound.attempt import DeliveryState, ResultObserver, Verdict, judge
from ..outbound.ssrf import redact_url
from ..outbound.transport import Transport
from ..sweeper import SweepReport
from ..workflows.hooks import after_commit
from ..workflows.models import Execution, JsonValue
from .envelope import CallbackSecret, build_envelope, headers_for
from .filters import EventFilter
from .outcome import callback_retry_policy
from .policy import CallbackPolicy, parse_allowlist
from .store import CompletionDelivery, NewDelivery, SqlCallbackStore, new_delivery_id
from .targets import CallbackTarget, CallbackTargetRejected, normalise_targets, parse_targets, stored_targets

__all__ = ["CALLBACK_JOB", "CompletionCallbacks", "CompletionDeliveryNotFoundError", "callback_job"]

log = logging.getLogger(__name__)

#: The job seam's kind for completion-callback deliveries.
CALLBACK_JOB = "callback"
# The sweeper leaves rows due for less than this alone: their after-commit job is on its way.
_SWEEP_GRACE = timedelta(seconds=2)

#: Told about every recorded attempt: ``(delivery as recorded, outcome)``.
CallbackListener = Callable[[CompletionDelivery, Verdict], None]


class CompletionDeliveryNotFoundError(NotFoundError):
    """The execution has no completion delivery with this id."""

    def __init__(self, execution_id: str, delivery_id: str) -> None:
        super().__init__(f"execution {execution_id!r:.80} has no completion delivery {delivery_id!r:.80}")


def callback_job(delivery: CompletionDelivery) -> JobRef:
    """The job reference of a delivery's next attempt."""
    return JobRef(CALLBACK_JOB, delivery.delivery_id, delivery.attempts, delivery.next_attempt_at)


def endpoint_of(url: str) -> str:
    """The endpoint a callback URL counts against in the worker's admission: scheme, host, port."""
    try:
        parts = urlsplit(url)
        return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}:{parts.port or ''}"
    except ValueError:
        return url


def policy_from_settings(settings: Settings) -> CallbackPolicy:
    """The callback SSRF policy the settings describe.

    :raises ConfigurationError: a bad allowlist entry (the message names it).
    """
    return CallbackPolicy(
        allowlist=parse_allowlist(settings.completion_callback_allowlist),
        allow_http=settings.completion_callback_allow_http,
        allow_ip_literals=settings.completion_callback_allow_ip_literals,
        allow_private=settings.completion_callback_allow_private_targets,
    )


class CompletionCallbacks:
    """Completion callbacks for one engine.

    :param settings: the ``HARVEST_COMPLETION_CALLBACK_*`` keys are read from it.
    :param store: the delivery rows, in the workflows' database.
    :param backend: the one job seam (kind ``"callback"``).
    :param transport: the one transport; each POST runs under the callback policy. In
        ``flask harvest worker`` the attempts run on the worker's pool, under the same per-endpoint
        admission as webhooks.
    :raises ConfigurationError: a bad allowlist entry, or a default target that is malformed or
        refused by the policy (the message names ``HARVEST_COMPLETION_CALLBACK_DEFAULTS``).
    """

    def __init__(
        self,
        settings: Settings,
        store: SqlCallbackStore,
        backend: JobBackend,
        transport: Transport,
        *,
        listener: CallbackListener | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.backend = backend
        self.transport = transport
        self.listener = listener
        self.policy = policy_from_settings(settings)
        self.retry_policy = callback_retry_policy(
            settings.completion_callback_max_attempts,
            settings.completion_callback_initial_backoff_ms,
            settings.completion_callback_max_backoff_ms,
        )
        try:
            self._secret = (
                CallbackSecret(settings.completion_callback_secret)
                if settings.completion_callback_secret
                else None
            )
        except ValueError as exc:  # a malformed whsec_ secret; the message does not quote it
            raise ConfigurationError(f"{KEYS['completion_callback_secret']}: {exc}") from None
        self.defaults: list[CallbackTarget] = []
        if settings.completion_callback_defaults:
            self._load_defaults(settings.completion_callback_defaults)
        if self.policy.allow_private:
            log.warning(
                "harvest: %s is on: completion callbacks may reach loopback and private addresses, over "
                "http:// too. Never turn it on in production.",
                KEYS["completion_callback_allow_private_targets"],
            )

    def __repr__(self) -> str:
        return f"<CompletionCallbacks defaults={len(self.defaults)} allowlist={len(self.policy.allowlist)}>"

    # -- registration --------------------------------------------------------------------------

    def _load_defaults(self, text: str) -> None:
        key = KEYS["completion_callback_defaults"]
        try:
            data = json.loads(text)
        except ValueError:
            raise ConfigurationError(f"{key} must be a JSON list of {{url, filter}} objects") from None
        try:
            targets = parse_targets(data, self.policy)
        except CallbackTargetRejected as exc:
            raise ConfigurationError(f"{key}: target {exc.index}: {exc.detail}") from None
        for target in targets:
            self._add(target)

    def add_default(self, url: str, event_filter: EventFilter | dict[str, Any] | None = None) -> None:
        """Add an app-wide default target (after those of the configuration).

        :raises ConfigurationError: the target is refused by the policy or malformed.
        """
        filter_json = event_filter.to_json() if isinstance(event_filter, EventFilter) else event_filter
        try:
            targets = parse_targets([{"url": url, "filter": filter_json}], self.policy)
        except CallbackTargetRejected as exc:
            raise ConfigurationError(
                f"default completion callback {redact_url(str(url))!r:.200}: {exc.detail}"
            ) from None
        self._add(targets[0])

    def _add(self, target: CallbackTarget) -> None:
        if self._secret is None:
            raise ConfigurationError(
                f"completion callbacks need {KEYS['completion_callback_secret']} "
                "(the HMAC key of their signature)"
            )
        self.defaults.append(target)

    def prepare(self, completion_callbacks: JsonValue) -> JsonValue:
        """The start preparer: validate a start's targets, add the defaults, return the stored form.

        :raises CallbackTargetRejected: a target is malformed or refused (HTTP 422).
        """
        own = parse_targets(completion_callbacks, self.policy)
        if own and self._secret is None:
            raise CallbackTargetRejected(
                None, message=f"completion callbacks are off: {KEYS['completion_callback_secret']} is not set"
            )
        stored = normalise_targets(own, self.defaults)
        return stored or None

    # -- enqueue, in the terminal transaction --------------------------------------------------

    def terminal_hook(self, conn: Connection, execution: Execution) -> None:
        """Insert one delivery row per matching target; queue their jobs once the transaction commits.

        A target the live policy no longer allows is skipped with a warning: the terminal
        transition is never blocked by a callback.
        """
        if not execution.notifies:  # ContinuedAsNew, or a fork that notifies no one
            return
        targets = stored_targets(execution.completion_callbacks)
        if not targets:
            return
        now = utcnow()
        rows = []
        for index, target in targets:
            if not target.filter.matches(execution.state):
                continue
            rejection = self.policy.check(target.url)
            if rejection is not None:
                log.warning(
                    "harvest: completion callback %d of execution %s skipped: %s",
                    index,
                    execution.execution_id,
                    rejection.message,
                    extra={
                        "harvest": {"execution_id": execution.execution_id, "rejection": rejection.to_json()}
                    },
                )
                continue
            delivery_id = new_delivery_id(execution.execution_id)
            rows.append(
                NewDelivery(
                    execution.execution_id,
                    index,
                    target.url,
                    target.filter.to_json(),
                    build_envelope(delivery_id, execution),
                    delivery_id,
                )
            )
        if not rows:
            return
        inserted = self.store.insert(conn, rows, self.retry_policy, now)
        if inserted:
            after_commit(conn, lambda: self._after_commit(inserted, now))

    def _after_commit(self, delivery_ids: list[str], due: datetime) -> None:
        """Start the new deliveries: at once on this thread when it is a worker's (the worker that
        ended the run makes the first attempt, without a round trip through the queue, under
        its pool's admission), else as jobs. Either way the rows are durable: a crash leaves them
        to the sweeper."""
        try:
            if run_here(CALLBACK_JOB, delivery_ids):
                return
        except Exception:
            log.warning("harvest: first completion-callback attempt failed here; queueing it", exc_info=True)
        # The job names the row's attempt and due time, as the sweeper's look for a live job does.
        self._enqueue([JobRef(CALLBACK_JOB, delivery_id, 0, due) for delivery_id in delivery_ids])

    def _enqueue(self, refs: list[JobRef]) -> None:
        try:
            self.backend.enqueue(refs)
        except JobBackendError as exc:
            log.warning("harvest: could not queue completion callbacks (%s); the sweeper will", exc)

    # -- delivery ------------------------------------------------------------------------------

    @property
    def lease_seconds(self) -> float:
        """How long a claimed delivery stays leased."""
        return self.settings.completion_callback_lease_seconds

    @property
    def deadline_seconds(self) -> float:
        """The longest one attempt takes (the shared transport's deadline)."""
        return self.transport.deadline

    @staticmethod
    def ticket(delivery: CompletionDelivery) -> Ticket:
        """What the worker's admission needs of a claimed delivery: its endpoint is the URL's
        scheme, host and port, failing when its last attempt was not delivered."""
        return Ticket(
            endpoint=endpoint_of(delivery.target_url),
            sendable=True,
            failing=delivery.attempts > 1 and delivery.last_error is not None,
            label=delivery.delivery_id,
        )

    @staticmethod
    def rate_wait(delivery: CompletionDelivery, horizon: float | None = None) -> float:
        """Completion callbacks have no rate limit (their tickets never ask): always ``0``."""
        return 0.0

    def claim_many(self, delivery_ids: Sequence[str]) -> list[CompletionDelivery]:
        """Lease the due ones among ``delivery_ids`` to the caller, in one round trip."""
        return self.store.claim(list(delivery_ids), now=utcnow(), lease_seconds=self.lease_seconds)

    def run_many(self, delivery_ids: Sequence[str]) -> None:
        """Claim the due ones among ``delivery_ids`` in one batch and make one attempt of each here."""
        for delivery in self.claim_many(delivery_ids):
            self.attempt(delivery)

    def attempt(
        self, delivery: CompletionDelivery, observe: ResultObserver | None = None
    ) -> DeliveryState | None:
        """Send one claimed delivery and record the outcome; ``None`` if the lease was lost.

        :param observe: called with what the transport returned, before the outcome is recorded
            (the worker's pool adapts the endpoint's limit to it); not called when nothing was sent.
        """
        with tracing.process(
            "completion callback",
            delivery.delivery_id,
            delivery.attempts,
            delivery.trace_context,
            {"harvest.execution.id": delivery.execution_id},
        ) as span:
            outcome = self._send(delivery, observe)
            recorded = self.store.record(delivery, outcome, now=utcnow())
            span.set("harvest.state", outcome.state.value)
        if recorded is None:
            log.warning(
                "harvest: lost the lease on completion delivery %s; its new holder records it",
                delivery.delivery_id,
            )
            return None
        self._log(recorded, outcome)
        if outcome.state is DeliveryState.PENDING and outcome.next_attempt_at is not None:
            self._schedule(recorded.delivery_id, recorded.attempts, outcome.next_attempt_at)
        if self.listener is not None:
            self.listener(recorded, outcome)
        return outcome.state

    def defer(self, delivery: CompletionDelivery, seconds: float, *, keep_place: bool = False) -> None:
        """Give a claimed delivery back, unsent and without using an attempt, due in ``seconds``
        (the worker's pool does, when its endpoint has as many attempts in flight as it may);
        with ``keep_place``, its job goes to the head of the queue when due."""
        due = utcnow() + timedelta(seconds=seconds)
        if self.store.give_back(delivery, due=due, now=utcnow()):
            self._schedule(delivery.delivery_id, delivery.attempts - 1, due, at_front=keep_place)

    def _send(self, delivery: CompletionDelivery, observe: ResultObserver | None) -> Verdict:
        now = utcnow()
        rejection = self.policy.check(delivery.target_url)
        if rejection is not None:  # the policy was tightened after the enqueue
            return Verdict(DeliveryState.DLQ, None, f"refused by the callback policy: {rejection.message}")
        if self._secret is None:
            return Verdict(DeliveryState.DLQ, None, "no completion-callback secret is configured")
        body = delivery.body.encode("utf-8")
        headers = headers_for(self._secret, delivery.delivery_id, body, now)
        result = self.transport.post_or_error(
            delivery.target_url, body, headers, policy=self.policy.ssrf_policy
        )
        if observe is not None:
            observe(result)
        return judge(result, attempt=delivery.attempts, policy=delivery.retry_policy, now=utcnow())

    def _schedule(self, delivery_id: str, attempts: int, due: datetime, *, at_front: bool = False) -> None:
        try:
            self.backend.schedule(JobRef(CALLBACK_JOB, delivery_id, attempts, due), at_front=at_front)
        except JobBackendError as exc:
            log.warning(
                "harvest: could not schedule completion delivery %s (%s); the sweeper will", delivery_id, exc
            )

    @staticmethod
    def _log(delivery: CompletionDelivery, outcome: Verdict) -> None:
        level = logging.INFO if outcome.state is DeliveryState.DELIVERED else logging.WARNING
        log.log(
            level,
            "harvest: completion delivery %s of execution %s attempt %d: %s%s",
            delivery.delivery_id,
            delivery.execution_id,
            delivery.attempts,
            delivery.wire_state,
            f" ({outcome.error})" if outcome.error else "",
            extra={"harvest": {"delivery_id": delivery.delivery_id, "state": delivery.wire_state}},
        )

    # -- the sweeper's step --------------------------------------------------------------------

    def sweep(self) -> SweepReport:
        """Queue the due deliveries (a lost enqueue, an expired lease) that no job waits for."""
        now = utcnow()
        due = self.store.due(now - _SWEEP_GRACE)
        refs = [JobRef(CALLBACK_JOB, d.delivery_id, d.attempts, d.next_attempt_at) for d in due]
        # A job for an expired lease was for the attempt before: a fresh one with no due time.
        fresh = [
            JobRef(CALLBACK_JOB, d.delivery_id, d.attempts, None)
            for d in due
            if d.state is DeliveryState.INFLIGHT
        ]
        expired = {r.id for r in fresh}
        missing = requeue_missing(self.backend, [r for r in refs if r.id not in expired] + fresh)
        return SweepReport(released=len(expired), requeued=len(missing))

    # -- operators -----------------------------------------------------------------------------

    def deliveries(self, execution_id: str) -> list[CompletionDelivery]:
        """Every delivery of the execution, ordered by ``callback_index``."""
        return self.store.list_for_execution(execution_id)

    def redrive(self, execution_id: str, delivery_id: str) -> str:
        """Send a ``FAILED`` delivery again with a fresh budget; same id, same bytes.

        :returns: ``"redriven"`` or ``"not_failed"``.
        :raises CompletionDeliveryNotFoundError: the execution has no such delivery.
        """
        for field, value in (("execution_id", execution_id), ("delivery_id", delivery_id)):
            # An id the database cannot compare (a NUL, a lone surrogate) is refused before a query.
            if id_problem(value, max_chars=64) is not None:
                raise InvalidFieldError(field, "is not an id")
        result = self.store.redrive(execution_id, delivery_id, now=utcnow())
        if result is None:
            raise CompletionDeliveryNotFoundError(execution_id, delivery_id)
        if isinstance(result, str):
            return result
        self._enqueue([callback_job(result)])
        return "redriven"

    def failed_page(
        self, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[CompletionDelivery], str | None]:
        """One page of the ``FAILED`` deliveries of every execution, the latest to fail first, and
        the cursor of the next page (or ``None``).

        :raises InvalidFieldError: a limit outside 1 to 500, or a bad cursor.
        """
        if not 1 <= limit <= 500:
            raise InvalidFieldError("limit", "must be between 1 and 500")
        rows = self.store.failed_page(limit=limit + 1, before=decode_position(cursor) if cursor else None)
        page = rows[:limit]
        more = len(rows) > limit
        return page, encode_position(page[-1].updated_at, page[-1].delivery_id) if more else None

    def count_failed(self, *, cap: int = 1000) -> int:
        """How many ``FAILED`` deliveries :meth:`failed_page` lists, counting at most ``cap`` (one
        bounded index walk; a count equal to ``cap`` means "at least")."""
        return self.store.count_failed(cap=cap)

    def redrive_selected(self, delivery_ids: Sequence[str]) -> list[CompletionDelivery]:
        """Redrive the chosen ``FAILED`` deliveries (same ids, same bytes, a fresh budget, due
        now); return those redriven (one not failed, or unknown, is left as it is).

        :raises InvalidFieldError: (field ``delivery_id``) an id no delivery can have.
        """
        for delivery_id in delivery_ids:
            if id_problem(delivery_id, max_chars=64) is not None:
                raise InvalidFieldError("delivery_id", "is not an id")
        rows = self.store.redrive_selected(list(dict.fromkeys(delivery_ids)), now=utcnow())
        if rows:
            self._enqueue([callback_job(row) for row in rows])
        return rows

    def redrive_failed(self, window_seconds: float) -> list[CompletionDelivery]:
        """Redrive every ``FAILED`` delivery, their attempts spread evenly over ``window_seconds``."""
        if window_seconds < 0:
            raise InvalidFieldError("window", "must not be negative")
        rows = self.store.redrive_failed(now=utcnow(), window_seconds=window_seconds)
        for row in rows:
            if row.next_attempt_at is not None and row.next_attempt_at > utcnow():
                self._schedule(row.delivery_id, 0, row.next_attempt_at)
            else:
                self._enqueue([callback_job(row)])
        return rows
