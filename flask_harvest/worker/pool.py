"""Attempts in flight inside one worker process, with an adaptive limit per endpoint.

A worker takes delivery jobs off the queue in batches (a quarter of its slots at a time), claims
their rows in one statement, and runs the attempts on this pool, so one process keeps many
receivers in flight at once and pays the queue's per-job cost once per batch.

The pool runs every kind of outbound delivery through the same admission: webhooks, and each
other kind given as a *lane* (completion callbacks), whose runner has the same shape
(:class:`OutboundRunner`) and whose endpoints have limits of their own, within that lane's
ceiling. The slots, the failing endpoints' share and the limits' rules are the same for all.

Each endpoint (a webhook's subscription, a callback's scheme, host and port) may have at most its
limit in flight (:mod:`flask_harvest.outbound.admission`:
it grows while the endpoint answers fast and well, and is cut at once on timeouts, 429/503 and
rising latency, within the configured floor and ceiling and never past the pool's slots). A
claimed delivery over its endpoint's limit waits in the process for that endpoint's next free
attempt while the endpoint is healthy, so a busy endpoint keeps its limit in flight without the
worker giving deliveries back and taking them again. When the endpoint is failing (its last
attempt failed) or slow (an attempt of it has been in flight longer than ``slow_after``),
deliveries over the limit are given back unsent instead (no attempt used) and come round again
later, so a dead endpoint holds at most its limit while the others go ahead. Endpoints whose
last attempt timed out together hold at most a quarter of the slots, or one endpoint's starting
limit if that is more (past that their deliveries are given back too), and the worker takes new
jobs for any free slots once a whole batch has not come free within a tenth of a second, so many
silent or slow endpoints cannot stop a process serving the others.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..outbound.admission import INITIAL_LIMIT, AdmissionPolicy, EndpointLimit, Signal, Ticket, signal_of
from ..outbound.attempt import DeliveryState, HttpResponse, ResultObserver, TransportError
from ..webhooks.delivery import WEBHOOK_JOB

log = logging.getLogger(__name__)
# How often a worker waiting for slots looks for endpoints that turned slow with deliveries
# waiting for them.
_CHECK_SECONDS = 0.25
# A waiting delivery's lease must still cover its attempt when it starts.
_LEASE_MARGIN_SECONDS = 5.0
# Endpoints whose last attempt timed out may together hold at most this share of a process's
# slots: each of their attempts can hold a slot until it times out, and ten silent endpoints at
# their starting limit would hold every slot of a 32-slot process (bench S14: healthy p99 rose
# from 0.5 to 4-7 s in quick runs).
_FAILING_SHARE = 0.25
# How long the worker waits for a whole batch of free slots before it takes jobs for fewer: slots
# that slow or silent endpoints hold for seconds must not stop the process taking work.
_BATCH_PATIENCE_SECONDS = 0.1
# An endpoint with nothing in flight or waiting keeps its learnt limit this long, then is
# forgotten (and starts afresh), so a worker serving thousands of endpoints stays bounded.
_FORGET_SECONDS = 300.0
# A delivery whose rate limit says "later" waits in the process, holding its place under the
# endpoint's in-flight limit (and lending its slot to other endpoints), when its turn comes within
# this many seconds (and within its lease); a longer wait gives it back to the queue, due at its
# turn. Holding only what the endpoint's in-flight limit admits keeps a rate-limited endpoint from
# holding more deliveries than an unlimited one could, and the short hold keeps its pace exact
# (the queue's delayed jobs move on whole seconds). Lending the slot keeps the held deliveries
# from slowing the other endpoints (bench S21: an unlimited backlog beside a limited one went
# from about 1,000 to 600-700 deliveries/s while the held ones kept their slots).
_RATE_HOLD_SECONDS = 5.0
# Deliveries given back for their rate's pace come due one interval of the limit apart, but at
# most this many seconds ahead: a backlog beyond that comes round again and goes back, so a limit
# raised meanwhile applies to it within about this long.
_PACED_RETURN_MAX_SECONDS = 10.0
# The start time a held delivery has among its endpoint's attempts until it is sent.
_HELD = math.inf


class OutboundRunner(Protocol):
    """What the pool needs of a kind's runner (:class:`~flask_harvest.webhooks.delivery.DeliveryRunner`,
    :class:`~flask_harvest.callbacks.service.CompletionCallbacks`). Claims are the runner's own."""

    @property
    def lease_seconds(self) -> float:
        """How long a claim stays leased."""

    @property
    def deadline_seconds(self) -> float:
        """The longest one attempt takes."""

    def claim_many(self, ids: Sequence[str]) -> Sequence[Any]:
        """Lease the due ones among ``ids``, in one round trip."""

    def ticket(self, claim: Any) -> Ticket:
        """What admission needs to know of ``claim``."""

    def attempt(self, claim: Any, observe: ResultObserver | None = None) -> object:
        """Send ``claim``, telling ``observe`` what the transport returned, and record it."""

    def defer(self, claim: Any, seconds: float, *, keep_place: bool = False) -> None:
        """Give ``claim`` back unsent, without using an attempt, due in ``seconds``; with
        ``keep_place``, to the head of the queue when due."""

    def rate_wait(self, claim: Any, horizon: float | None = None) -> float:
        """Seconds until ``claim``'s endpoint's rate limit lets it go (``0``: now, and counted;
        a turn further than ``horizon`` seconds is not handed out); asked only of claims whose
        ticket is ``rate_limited``."""


@dataclass(frozen=True)
class _Lane:
    """One kind of delivery in the pool: its runner and its endpoints' limits."""

    kind: str
    runner: OutboundRunner
    policy: AdmissionPolicy
    max_wait: float  # the longest a claim may wait for its turn: its lease must cover the attempt


@dataclass(frozen=True)
class _Work:
    """One claimed delivery in the pool."""

    lane: _Lane
    claim: Any
    ticket: Ticket
    claimed: float = field(default_factory=time.monotonic)  # its lease started about then


@dataclass
class _Endpoint:
    """One endpoint's attempts in this process, and its adaptive limit."""

    limit: EndpointLimit
    started: list[float] = field(default_factory=list)  # monotonic start of each attempt in flight
    waiting: deque[tuple[_Work, float]] = field(default_factory=deque)  # (work, since)
    idle_since: float = 0.0
    last: Signal | None = None  # what its last attempt in this process came to
    failing: bool = False  # its last attempt timed out (or, before any, its subscription failed)
    returns_at: float = 0.0  # when the last delivery given back for its rate's pace is due again

    @property
    def idle(self) -> bool:
        return not self.started and not self.waiting


class DeliveryPool:
    """A bounded thread pool for delivery attempts.

    :param runner: makes the webhook attempts.
    :param size: deliveries this process holds at once (in flight or waiting their turn); up to
        as many again may wait for their rate limit's turn, which need no slot until then.
    :param per_subscription: the most attempts in flight at once for one subscription in this
        process (the ceiling of its adaptive limit; the pool's size bounds it too).
    :param min_per_subscription: the least its limit drops to; equal to ``per_subscription``, the
        limit is a fixed cap.
    :param latency_tolerance: how many times its usual latency a subscription's latency may
        rise to before its limit is cut.
    :param context: wraps each attempt (the worker pushes the Flask app context with it).
    :param slow_after: seconds after which an attempt in flight marks its endpoint as slow.
    :param lanes: other kinds of delivery, each with its runner and the most attempts in flight at
        once to one of its endpoints (the ceiling of that endpoint's limit).
    """

    def __init__(
        self,
        runner: OutboundRunner,
        *,
        size: int,
        per_subscription: int,
        min_per_subscription: int = 1,
        latency_tolerance: float = 3.0,
        context: Callable[[], AbstractContextManager[object]] | None = None,
        slow_after: float = 1.0,
        lanes: Mapping[str, tuple[OutboundRunner, int]] | None = None,
    ) -> None:
        self.runner = runner
        self.size = size
        self.per_subscription = per_subscription

        def lane(kind: str, runner: OutboundRunner, per_endpoint: int) -> _Lane:
            ceiling = max(1, min(per_endpoint, size))
            # A limit's ceiling never exceeds the pool's slots.
            policy = AdmissionPolicy(
                floor=max(1, min(min_per_subscription, ceiling)),
                ceiling=ceiling,
                latency_tolerance=latency_tolerance,
            )
            wait = max(0.0, runner.lease_seconds - runner.deadline_seconds - _LEASE_MARGIN_SECONDS)
            return _Lane(kind, runner, policy, wait)

        self._lanes = {WEBHOOK_JOB: lane(WEBHOOK_JOB, runner, per_subscription)}
        for kind, (other, per_endpoint) in (lanes or {}).items():
            self._lanes[kind] = lane(kind, other, per_endpoint)
        #: How every webhook endpoint's limit moves.
        self.policy = self._lanes[WEBHOOK_JOB].policy
        self.slow_after = slow_after
        #: Slots the worker waits for before it takes more jobs: taking them in batches spreads
        #: the queue's per-job cost and the claim's round trip over many deliveries.
        self.batch = max(1, size // 4)
        #: Slots that failing endpoints may hold together (see ``_FAILING_SHARE``); never fewer
        #: than one endpoint's starting limit, so a single failing endpoint (one that answers
        #: just around the timeout, say) keeps the room it had, and only many together are held.
        self.failing_slots = max(INITIAL_LIMIT, int(size * _FAILING_SHARE))
        self._context = context
        self._cond = threading.Condition()
        self._busy = 0  # slots held: attempts in flight and deliveries waiting their turn
        self._wake_at = -1  # wake the waiting job loop once _busy is down to this (-1: none waits)
        self._closing = False
        self._endpoints: dict[tuple[str, str], _Endpoint] = {}  # by (kind, endpoint)
        self._forgot_at = time.monotonic()
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="harvest-attempt")
        # Deliveries waiting for their rate limit's turn: (due, seq, work, whether it lent its
        # slot), and the one thread that starts them when due (no pool thread sleeps for a turn).
        self._held: list[tuple[float, int, _Work, bool]] = []
        self._held_seq = itertools.count()
        self._held_cond = threading.Condition()
        self._holding = True
        # Cleared as the pool starts stopping: a key's chain must not keep its attempts going.
        self._following = True
        self._timer: threading.Thread | None = None

    @property
    def kinds(self) -> frozenset[str]:
        """The kinds of delivery this pool runs."""
        return frozenset(self._lanes)

    def limit(self, endpoint: str, kind: str = WEBHOOK_JOB) -> int:
        """Return the attempts ``endpoint`` (a webhook's subscription id, or the endpoint of a
        ``kind``'s ticket) may have in flight in this process now."""
        with self._cond:
            found = self._endpoints.get((kind, endpoint))
            if found is None:
                return EndpointLimit(self._lanes[kind].policy, time.monotonic()).limit
            return found.limit.limit

    def free_slots(self) -> int:
        """Return how many more deliveries this process can hold now."""
        with self._cond:
            return self.size - self._busy

    def wait_for_slots(self) -> None:
        """Block until a batch of slots is free, or any slot once a batch has not come free within
        ``_BATCH_PATIENCE_SECONDS`` (the worker calls it before taking more jobs)."""
        if not self._wait_until(self.size - self.batch, timeout=_BATCH_PATIENCE_SECONDS):
            self._wait_until(self.size - 1)

    def _wait_until(self, busy: int, timeout: float | None = None) -> bool:
        """Wait until at most ``busy`` slots are held (for at most ``timeout`` seconds; return
        whether they are), giving back every ``_CHECK_SECONDS`` the deliveries that wait for an
        endpoint that turned slow, since they hold slots too.

        Only the worker's job loop waits here. A slot freed wakes it only once enough are free
        (waking it on every attempt's end cost a tenth of a busy worker's CPU), and the check,
        which walks every endpoint, runs on the clock rather than on each wake."""
        check_at = time.monotonic() + _CHECK_SECONDS
        give_up = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                if self._busy <= busy:
                    self._wake_at = -1
                    return True
                now = time.monotonic()
                if give_up is not None and now >= give_up:
                    self._wake_at = -1
                    return False
                self._wake_at = busy
                until = check_at if give_up is None else min(check_at, give_up)
                self._cond.wait(max(0.0, until - now))
            if time.monotonic() >= check_at:
                self._give_back_stale()
                check_at = time.monotonic() + _CHECK_SECONDS

    def deliver(self, delivery_id: str, kind: str = WEBHOOK_JOB) -> DeliveryState | None:
        """Claim ``delivery_id`` and start its attempt on the pool; return at once.

        Returns ``INFLIGHT`` if the attempt started or waits its turn, ``PENDING`` if the delivery
        was given back for its endpoint's limit, ``None`` if there was nothing to do.
        """
        states = self.deliver_many([delivery_id], kind)
        return states[0] if states else None

    def deliver_many(self, delivery_ids: Sequence[str], kind: str = WEBHOOK_JOB) -> list[DeliveryState]:
        """Claim the due ones among ``delivery_ids``, as many at a time as there are free slots,
        and start their attempts.

        Slots are taken *before* claiming, so a claim's lease never ticks while it queues for one.
        Returns the state of each delivery claimed, as :meth:`deliver` does.
        """
        lane = self._lanes[kind]
        states: list[DeliveryState] = []
        for chunk, taken in self._reserve(delivery_ids):
            states.extend(self._claim_and_start(lane, chunk, taken))
        return states

    def run_here(self, kind: str, delivery_ids: Sequence[str]) -> None:
        """Claim the due ones among ``delivery_ids`` and make their attempts on the calling thread
        as far as their endpoints' limits admit them; the others go to the pool as claimed
        deliveries do (they wait their turn, or are given back).

        The fast path of a thread that has just made the work (the workflow run that ended and
        queued its callbacks): no round trip through the queue, the same admission. It takes its
        slots without waiting for them, so the pool may hold a few more than its size meanwhile.
        """
        lane = self._lanes[kind]
        ids = list(dict.fromkeys(delivery_ids))
        with self._cond:
            self._busy += len(ids)
        claims: Sequence[Any] = []
        try:
            with self._entered():
                claims = lane.runner.claim_many(ids)
        finally:
            self._release(len(ids) - len(claims))
        for claim in claims:
            work = _Work(lane, claim, lane.runner.ticket(claim))
            now = time.monotonic()
            if self._admit(work, now) == "run":
                self._attempt(work, now)
            else:
                self._place(work, now)

    def follow(self, claims: Sequence[Any], kind: str = WEBHOOK_JOB) -> None:
        """Start deliveries claimed by someone else as the pool's own claims start: the next
        delivery of an ordering key, leased in the transaction that recorded the one ahead of it
        (:attr:`DeliveryRunner.follow <flask_harvest.webhooks.delivery.DeliveryRunner.follow>`).

        Called on a pool thread as its attempt ends, it takes their slots without waiting (that
        thread's slot is freed right after) and never runs an attempt on the calling thread, so a
        key's chain neither nests calls nor waits for the queue. A pool that is stopping gives
        them back unsent (no attempt used).
        """
        lane = self._lanes[kind]
        with self._cond:
            self._busy += len(claims)
        for claim in claims:
            work = _Work(lane, claim, lane.runner.ticket(claim))
            now = time.monotonic()
            if not self._following:
                self._give_back([work])
            elif self._admit(work, now) == "run":
                try:
                    self._executor.submit(self._attempt, work, now)
                except RuntimeError:  # the pool stopped meanwhile: for later
                    self._answered(work, now, None)
                    self._give_back([work])
            else:
                self._place(work, now)

    def submit_many(self, delivery_ids: Sequence[str], kind: str = WEBHOOK_JOB) -> None:
        """As :meth:`deliver_many`, but the claims run on the pool's threads: return as soon as
        slots are reserved for every delivery (the worker's job loop, which calls it, goes on
        taking jobs while a pool thread claims, instead of waiting for the claim's round trip).

        A failed claim is logged; its rows stay due with no job, and the sweeper queues them again.
        """
        lane = self._lanes[kind]
        for chunk, taken in self._reserve(delivery_ids):
            try:
                self._executor.submit(self._claim_and_start_logged, lane, chunk, taken)
            except RuntimeError:  # the pool is shutting down: the rows stay due for later
                self._release(taken)

    def _reserve(self, delivery_ids: Sequence[str]) -> Iterator[tuple[list[str], int]]:
        """Yield chunks of ``delivery_ids`` with the slots taken for each, waiting for free ones.

        Only the worker's job loop takes slots, so the ones just seen free are still free; the
        consumer releases whatever it does not use."""
        waiting = list(dict.fromkeys(delivery_ids))
        while waiting:
            self._wait_until(self.size - 1)
            with self._cond:
                taken = max(1, min(len(waiting), self.size - self._busy))
                self._busy += taken
            chunk, waiting = waiting[:taken], waiting[taken:]
            yield chunk, taken

    def _entered(self) -> AbstractContextManager[object]:
        return self._context() if self._context is not None else nullcontext()

    def _claim_and_start(self, lane: _Lane, chunk: list[str], taken: int) -> list[DeliveryState]:
        claims: Sequence[Any] = []
        try:
            with self._entered():
                claims = lane.runner.claim_many(chunk)
        finally:
            self._release(taken - len(claims))
        return [self._start(_Work(lane, claim, lane.runner.ticket(claim))) for claim in claims]

    def _claim_and_start_logged(self, lane: _Lane, chunk: list[str], taken: int) -> None:
        try:
            self._claim_and_start(lane, chunk, taken)
        except Exception:  # the rows stay PENDING with no job: the sweeper queues them again
            log.exception("harvest: could not claim %s deliveries %s", lane.kind, chunk)

    def _start(self, work: _Work) -> DeliveryState:
        now = time.monotonic()
        if self._admit(work, now) == "run":
            self._executor.submit(self._attempt, work, now)
            return DeliveryState.INFLIGHT
        return self._place(work, now)

    def _admit(self, work: _Work, now: float) -> str:
        """Count ``work`` as started on its endpoint if its limit has room (``"run"``: the caller
        runs it), else ``"over"``."""
        key = (work.lane.kind, work.ticket.endpoint)
        with self._cond:
            endpoint = self._endpoints.get(key)
            if endpoint is None:
                self._forget_idle(now)
                endpoint = self._endpoints[key] = _Endpoint(EndpointLimit(work.lane.policy, now))
            if endpoint.last is None:  # nothing seen in this process yet: ask the row
                endpoint.failing = work.ticket.failing
            if len(endpoint.started) < endpoint.limit.limit and not self._crowded(endpoint):
                endpoint.started.append(now)
                return "run"
            return "over"

    def _place(self, work: _Work, now: float) -> DeliveryState:
        """A delivery over its endpoint's limit waits its turn in the process while the endpoint
        is healthy (``INFLIGHT``), else is given back unsent (``PENDING``)."""
        with self._cond:
            endpoint = self._endpoints[(work.lane.kind, work.ticket.endpoint)]
            if not self._closing and self._healthy(work, endpoint, now):
                endpoint.waiting.append((work, now))
                return DeliveryState.INFLIGHT
            due = self._paced_return(work, endpoint, now) if self._paced(work, endpoint) else None
        # One held back only because its rate sets the pace keeps its place in the queue: behind
        # another subscription's backlog, its endpoint would get nothing until that was through.
        self._give_back([work], seconds=due, keep_place=due is not None)
        return DeliveryState.PENDING

    def _healthy(self, work: _Work, endpoint: _Endpoint, now: float) -> bool:
        if not work.ticket.sendable or self._slow(endpoint, now):
            return False
        if self._paced(work, endpoint):
            # Its rate, not its answers, sets the pace now: waiting here would only hold a slot
            # that other endpoints could use (the held deliveries already keep the pace).
            return False
        if endpoint.last is None:  # nothing seen in this process yet: ask the row
            return not work.ticket.failing
        # An endpoint that answers "too busy" is alive: its limit already eases the load, and
        # waiting here for a turn under it is the relief (giving the delivery back would only
        # bring it round again later). One that fails otherwise or times out is not healthy.
        return endpoint.last in (Signal.SUCCESS, Signal.OVERLOAD)

    @staticmethod
    def _paced(work: _Work, endpoint: _Endpoint) -> bool:
        """Whether ``work``'s rate limit sets its endpoint's pace now (deliveries of it are held
        for their turns)."""
        return work.ticket.rate_limited and _HELD in endpoint.started

    @staticmethod
    def _paced_return(work: _Work, endpoint: _Endpoint, now: float) -> float:
        """Seconds until a delivery given back for its rate's pace is due again (under the lock).

        This process's give-backs come due one interval of the limit apart, so they return at
        the limit's pace from each process rather than all together: enough to keep the held
        turns going, without claiming and giving back the whole backlog every second."""
        interval = 1.0 / (work.ticket.per_second or 1.0)
        endpoint.returns_at = min(max(endpoint.returns_at + interval, now), now + _PACED_RETURN_MAX_SECONDS)
        return endpoint.returns_at - now

    def _crowded(self, endpoint: _Endpoint) -> bool:
        """Whether ``endpoint`` is failing and the failing endpoints already hold their share of
        the slots (under the lock; the sum only runs for a failing endpoint's delivery)."""
        if not endpoint.failing:
            return False
        held = sum(len(other.started) for other in self._endpoints.values() if other.failing)
        return held >= self.failing_slots

    def _slow(self, endpoint: _Endpoint, now: float) -> bool:
        return bool(endpoint.started) and now - min(endpoint.started) > self.slow_after

    def _attempt(self, work: _Work, started: float) -> None:
        if work.ticket.rate_limited and self._rate_held(work, started):
            return
        answered = False

        def observe(result: HttpResponse | TransportError) -> None:
            nonlocal answered
            answered = True
            self._answered(work, started, result)

        try:
            with self._entered():
                work.lane.runner.attempt(work.claim, observe)
        except Exception:
            # The lease runs out and the sweeper hands the delivery to another attempt.
            log.exception("harvest: attempt of %s delivery %s failed", work.lane.kind, work.ticket.label)
        finally:
            if not answered:  # nothing was sent, or the attempt failed before its answer
                self._answered(work, started, None)
            self._release(1)

    def _answered(self, work: _Work, started: float, result: HttpResponse | TransportError | None) -> None:
        """An attempt's request is over (its outcome is yet to be recorded, on this thread): let
        its outcome move the endpoint's limit, and start as many of the endpoint's waiting
        deliveries (each holding a slot of its own) as the limit allows. Starting them before
        the record keeps the endpoint as busy as its limit says."""
        stale: list[_Work] = []
        successors: list[_Work] = []
        with self._cond:
            endpoint = self._endpoints[(work.lane.kind, work.ticket.endpoint)]
            now = time.monotonic()
            if result is not None:
                self._learn(work.ticket.endpoint, endpoint, result, now)
            endpoint.started.remove(started)
            # An attempt that took longer than slow_after shows the endpoint slow: its waiting
            # deliveries go back rather than each holding a slot for another slow attempt.
            slow = now - started > self.slow_after or self._slow(endpoint, now)
            room = endpoint.limit.limit - len(endpoint.started)
            while endpoint.waiting and len(successors) < room:
                waiting, since = endpoint.waiting.popleft()
                if self._closing or slow or now - since > waiting.lane.max_wait:
                    stale.append(waiting)
                else:
                    successors.append(waiting)
                    endpoint.started.append(now)
            if endpoint.idle:
                endpoint.idle_since = now
        for position, successor in enumerate(successors):
            try:
                self._executor.submit(self._attempt, successor, now)
            except RuntimeError:  # stopped meanwhile (a fast path outlived the worker): for later
                stale.extend(successors[position:])
                break
        self._give_back(stale)

    def _rate_held(self, work: _Work, started: float) -> bool:
        """Ask ``work``'s rate limit (it passed the in-flight limit already); when it must wait,
        hold it until its turn or give it back due then, and return ``True``. Its place under the
        in-flight limit stays taken while it is held, its slot is lent to the other endpoints
        (while at most ``size`` deliveries are held); nothing is learnt of it."""
        try:
            with self._entered():
                wait = work.lane.runner.rate_wait(work.claim, _RATE_HOLD_SECONDS)
        except Exception:  # the limit could not say: it holds, and the delivery comes round again
            log.exception("harvest: rate limit of %s delivery %s failed", work.lane.kind, work.ticket.label)
            wait = 1.0
        if wait <= 0:
            return False
        now = time.monotonic()
        if wait <= _RATE_HOLD_SECONDS and now + wait - work.claimed <= work.lane.max_wait:
            with self._held_cond:
                if self._holding:
                    # Held, it keeps its place under the in-flight limit but is not in flight: an
                    # endless start time keeps a long hold from making the endpoint look slow
                    # (which would give back its waiting deliveries).
                    with self._cond:
                        endpoint = self._endpoints[(work.lane.kind, work.ticket.endpoint)]
                        endpoint.started.remove(started)
                        endpoint.started.append(_HELD)
                    # A held delivery needs no thread until its turn: it lends its slot to the other
                    # endpoints meanwhile (up to a pool's worth of them), and takes one again then.
                    slotless = len(self._held) < self.size
                    heapq.heappush(self._held, (now + wait, next(self._held_seq), work, slotless))
                    if slotless:
                        self._release(1)
                    if self._timer is None:
                        self._timer = threading.Thread(
                            target=self._start_held, name="harvest-rate-timer", daemon=True
                        )
                        self._timer.start()
                    self._held_cond.notify()
                    return True
        # Too long to hold (or stopping): its place goes to the endpoint's next delivery, and
        # it goes back to the queue due at its turn, to the head of the queue then.
        self._answered(work, started, None)
        self._give_back([work], seconds=wait, keep_place=True)
        return True

    def _start_held(self) -> None:
        """The timer thread: start each held delivery at its turn (it asks its limit again)."""
        while True:
            with self._held_cond:
                while self._holding and (not self._held or self._held[0][0] > time.monotonic()):
                    self._held_cond.wait(None if not self._held else self._held[0][0] - time.monotonic())
                now = time.monotonic()
                due = []
                while self._held and (not self._holding or self._held[0][0] <= now):
                    due.append(heapq.heappop(self._held))
                holding = self._holding
            for due_at, _, work, slotless in due:
                started = _HELD
                if slotless:  # its slot again, without waiting for one (as run_here takes them)
                    with self._cond:
                        self._busy += 1
                if not holding:  # stopping: back to the queue, due at its turn
                    self._answered(work, started, None)
                    self._give_back([work], seconds=max(0.0, due_at - now), keep_place=True)
                    continue
                with self._cond:  # it starts now: its in-flight time counts from now
                    endpoint = self._endpoints[(work.lane.kind, work.ticket.endpoint)]
                    endpoint.started.remove(started)
                    endpoint.started.append(now)
                try:
                    self._executor.submit(self._attempt, work, now)
                except RuntimeError:  # the pool stopped meanwhile: for later
                    self._answered(work, now, None)
                    self._give_back([work])
            if not holding:
                return

    def _stop_holding(self) -> None:
        """Give back every held delivery, due at its turn, and end the timer thread."""
        with self._held_cond:
            self._holding = False
            self._held_cond.notify()
            timer = self._timer
        if timer is not None:
            timer.join()

    @staticmethod
    def _learn(
        endpoint_id: str, endpoint: _Endpoint, result: HttpResponse | TransportError, now: float
    ) -> None:
        """Feed an answer to the endpoint's limit (under the lock)."""
        # Saturated: the limit, not a lack of deliveries, held the endpoint back.
        saturated = len(endpoint.started) + len(endpoint.waiting) >= endpoint.limit.limit
        endpoint.last = signal_of(result)
        # Only a timeout held its slot for long; a prompt error answer (a 500 storm) freed it at once.
        endpoint.failing = endpoint.last is Signal.TIMEOUT
        before = endpoint.limit.limit
        endpoint.limit.record(endpoint.last, result.elapsed_ms / 1000, now, saturated=saturated)
        if endpoint.limit.limit < before:
            log.info(
                "harvest: endpoint %s: in-flight limit %d -> %d (%s after %d ms)",
                endpoint_id,
                before,
                endpoint.limit.limit,
                endpoint.last.value,
                result.elapsed_ms,
            )

    def _forget_idle(self, now: float) -> None:
        """Drop endpoints idle for a while (called under the lock when a new one is added)."""
        if now - self._forgot_at < _FORGET_SECONDS / 10:
            return
        self._forgot_at = now
        forget = [
            key
            for key, endpoint in self._endpoints.items()
            if endpoint.idle and now - endpoint.idle_since > _FORGET_SECONDS
        ]
        for key in forget:
            del self._endpoints[key]

    def _give_back_stale(self) -> None:
        """Give back the deliveries waiting for an endpoint that turned slow, or for too long."""
        stale: list[_Work] = []
        now = time.monotonic()
        with self._cond:
            for endpoint in self._endpoints.values():
                slow = self._closing or self._slow(endpoint, now)
                keep: deque[tuple[_Work, float]] = deque()
                for work, since in endpoint.waiting:
                    if slow or now - since > work.lane.max_wait:
                        stale.append(work)
                    else:
                        keep.append((work, since))
                endpoint.waiting = keep
        self._give_back(stale)

    def _give_back(
        self, works: Sequence[_Work], seconds: float | None = None, *, keep_place: bool = False
    ) -> None:
        """Return claimed deliveries unsent, without using an attempt, and free their slots; due
        in ``seconds`` (default: as their endpoint's state says); with ``keep_place``, to the
        head of the queue when due (they wait for their rate limit's turn, not for their endpoint)."""
        for work in works:
            due = self._defer_seconds(work) if seconds is None else seconds
            try:
                work.lane.runner.defer(work.claim, due, keep_place=keep_place)
            except Exception:  # the lease runs out and the sweeper queues it again
                log.exception(
                    "harvest: could not give back %s delivery %s", work.lane.kind, work.ticket.label
                )
            finally:
                self._release(1)

    @staticmethod
    def _defer_seconds(work: _Work) -> float:
        # A failing endpoint frees its slots about once per deadline; a healthy busy one within a
        # second. Jitter keeps deferred deliveries from coming back together.
        base = work.lane.runner.deadline_seconds if work.ticket.failing else 1.0
        return base * random.uniform(0.5, 1.5)  # noqa: S311 (spreading load, not security)

    def _release(self, slots: int) -> None:
        if slots <= 0:
            return
        with self._cond:
            self._busy -= slots
            if self._busy <= self._wake_at:
                self._cond.notify_all()

    def shutdown(self, wait: bool = True) -> None:
        """Stop the pool. With ``wait``, let the attempts in flight finish (each within a deadline)
        and the deliveries waiting their turn have theirs; without, give those back for later."""
        self._following = False
        self._stop_holding()  # a turn may be seconds away: those go back to the queue
        if wait:
            self._wait_until(0)
        with self._cond:
            self._closing = True
        self._give_back_stale()
        self._executor.shutdown(wait=wait)
