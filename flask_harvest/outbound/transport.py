"""The HTTP edge: one POST with hard limits, and a classification of what went wrong.

Every attempt runs under three limits: a connect timeout, a read timeout between bytes, and a
total deadline enforced by a watchdog thread that shuts the socket down, so a receiver that drips
one byte a second cannot hold a worker. Redirects are never followed, proxies from the environment
are ignored, and at most ``MAX_RESPONSE_BYTES`` of the response body are read.

With an :class:`~flask_harvest.outbound.ssrf.SsrfPolicy`, the URL is checked before each attempt, and the
connection resolves the host itself, refuses unless every address passes the policy, and connects
to a checked address. TLS still sends and verifies the host name: only the socket is ours.
"""

from __future__ import annotations

import contextlib
import heapq
import ipaddress
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util.connection import create_connection

# Re-exported: these were defined here first, and the transport is where callers look for them.
from .. import tracing
from .attempt import FailureKind as FailureKind
from .attempt import HttpResponse as HttpResponse
from .attempt import TransportError as TransportError
from .ssrf import SsrfError, SsrfPolicy, SsrfRejection, check_address, check_url, describe, redact_url

#: The most of a response body that is read and stored.
MAX_RESPONSE_BYTES = 20 * 1024
_CHUNK = 4096
# urllib3's debug line of each request; its fifth argument is the request target (path and query).
_URLLIB3_REQUEST_LINE = '%s://%s:%s "%s %s %s" %s %s'


class _RedactRequestTargets(logging.Filter):
    """Redacts the path-and-query that urllib3 logs at DEBUG for every request: a target URL's query
    can hold a credential, and debug logs are shipped and read by people who must not see it."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.msg == _URLLIB3_REQUEST_LINE and isinstance(args, tuple) and len(args) == 8:
            record.args = (*args[:4], redact_url(str(args[4])), *args[5:])
        return True


def _redact_urllib3_debug_lines() -> None:
    logger = logging.getLogger("urllib3.connectionpool")
    if not any(isinstance(f, _RedactRequestTargets) for f in logger.filters):
        logger.addFilter(_RedactRequestTargets())


class _Watchdog:
    """One daemon thread that shuts down sockets whose attempt outlived its deadline."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, socket.socket]] = []
        self._live: set[int] = set()
        self._seq = itertools.count()
        self._pid = -1

    def watch(self, sock: socket.socket, deadline: float) -> int:
        with self._cond:
            if self._pid != os.getpid():  # first use, or in a forked child: (re)start the thread
                self._pid = os.getpid()
                self._heap.clear()
                self._live.clear()
                threading.Thread(target=self._run, name="harvest-deadline", daemon=True).start()
            handle = next(self._seq)
            heapq.heappush(self._heap, (deadline, handle, sock))
            self._live.add(handle)
            self._cond.notify()
            return handle

    def cancel(self, handle: int) -> None:
        with self._cond:
            self._live.discard(handle)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                deadline, handle, sock = self._heap[0]
                wait = deadline - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                expired = handle in self._live
                self._live.discard(handle)
            if expired:
                # OSError: already closed, the attempt ended on its own.
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


_watchdog = _Watchdog()
_attempt = threading.local()


def _arm(sock: socket.socket | None) -> None:
    """Put the current attempt's socket under its deadline (called once the request is sent)."""
    deadline = getattr(_attempt, "deadline", None)
    if sock is not None and deadline is not None:
        _attempt.handles.append(_watchdog.watch(sock, deadline))


#: Resolves a host at connect time: ``(host, port)`` to the addresses to try, in order.
Resolver = Callable[[str, int], Sequence[str]]


def resolve(host: str, port: int) -> list[str]:
    """Resolve ``host`` with ``getaddrinfo``; return its distinct addresses in the resolver's order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class _Guard:
    policy: SsrfPolicy
    resolve: Resolver

    def connect(self, conn: HTTPConnection) -> socket.socket:
        """Resolve once, refuse unless every address passes, connect to a checked address."""
        try:
            addresses = self.resolve(conn.host.strip("[]"), conn.port)
        except socket.gaierror as exc:
            raise NameResolutionError(conn.host, conn, exc) from exc
        for address in addresses:
            try:
                reason = check_address(ipaddress.ip_address(address), self.policy)
            except ValueError:
                reason = SsrfRejection.RESERVED_ADDRESS
            if reason is not None:
                raise SsrfError(reason, address=address, hint=self.policy.allow_hint)
        error: OSError = OSError("the host name resolved to no address")
        for address in addresses:
            try:
                return create_connection(
                    (address, conn.port),
                    conn.timeout,
                    source_address=conn.source_address,
                    socket_options=conn.socket_options,
                )
            except TimeoutError as exc:
                raise ConnectTimeoutError(conn, f"connect timed out (timeout={conn.timeout})") from exc
            except OSError as exc:
                error = exc
        raise NewConnectionError(conn, f"Failed to establish a new connection: {error}") from error


def _new_conn(conn: HTTPConnection, default: Callable[[], socket.socket]) -> socket.socket:
    # The guard travels with the attempt, like its deadline: pools cannot carry extra arguments.
    guard: _Guard | None = getattr(_attempt, "guard", None)
    return default() if guard is None else guard.connect(conn)


class _DeadlineHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        return _new_conn(self, super()._new_conn)

    def getresponse(self) -> Any:
        _arm(self.sock)
        return super().getresponse()


class _DeadlineHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        return _new_conn(self, super()._new_conn)

    def getresponse(self) -> Any:
        _arm(self.sock)
        return super().getresponse()


class _DeadlineHTTPPool(HTTPConnectionPool):
    ConnectionCls = _DeadlineHTTPConnection


class _DeadlineHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _DeadlineHTTPSConnection


class _DeadlineAdapter(HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _DeadlineHTTPPool, "https": _DeadlineHTTPSPool}


class Transport:
    """Sends delivery POSTs; one pooled ``requests.Session`` per thread.

    :param connect_timeout: seconds to establish the connection.
    :param read_timeout: seconds to wait for each read of the response.
    :param deadline: seconds an attempt may take in all, from sending to the end of the body read.
    :param policy: the SSRF policy every URL and every resolved address must pass; ``None`` checks
        nothing.
    :param resolver: resolves host names at connect time (tests map names to addresses with it).
    """

    def __init__(
        self,
        *,
        connect_timeout: float,
        read_timeout: float,
        deadline: float,
        policy: SsrfPolicy | None = None,
        resolver: Resolver = resolve,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.deadline = deadline
        self.policy = policy
        self._resolver = resolver
        self._guard = _Guard(policy, resolver) if policy is not None else None
        _redact_urllib3_debug_lines()
        self._local = threading.local()

    def _session(self, policy: SsrfPolicy | None) -> requests.Session:
        """This thread's session for ``policy``: a pooled connection was checked against the
        policy it was opened under, so one is never reused for a request under another (a
        tenant's endpoint must not ride on a connection the operator's policy allowed)."""
        sessions: dict[SsrfPolicy | None, requests.Session] | None = getattr(self._local, "sessions", None)
        if sessions is None:
            sessions = self._local.sessions = {}
        session = sessions.get(policy)
        if session is None:
            session = requests.Session()
            session.trust_env = False  # no proxies or .netrc from the environment
            # A thread sends one request at a time, so each host pool it caches keeps at most one
            # idle connection: 64 threads x 8 hosts stay at 512 sockets, well under the usual
            # limit of 1,024 open files, however many receivers there are.
            adapter = _DeadlineAdapter(pool_connections=8, pool_maxsize=4, max_retries=0)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
            sessions[policy] = session
        return session

    def post(
        self, url: str, body: bytes, headers: Mapping[str, str], *, policy: SsrfPolicy | None = None
    ) -> HttpResponse:
        """POST ``body`` to ``url``; return the response or raise :class:`TransportError`.

        :param policy: check the URL and the connection against this policy instead of the
            transport's own (completion callbacks have theirs).
        """
        chosen = policy if policy is not None else self.policy
        reason = check_url(url, chosen) if chosen is not None else None
        if chosen is not None and reason is not None:
            raise TransportError(FailureKind.SSRF, describe(reason, url, hint=chosen.allow_hint), 0)
        started = time.monotonic()
        _attempt.deadline = started + self.deadline
        _attempt.handles = []
        _attempt.guard = self._guard if policy is None else _Guard(policy, self._resolver)
        try:
            return self._post(self._session(chosen), url, body, headers, started)
        finally:
            for handle in _attempt.handles:
                _watchdog.cancel(handle)
            _attempt.deadline = None
            _attempt.guard = None

    def post_or_error(
        self, url: str, body: bytes, headers: Mapping[str, str], *, policy: SsrfPolicy | None = None
    ) -> HttpResponse | TransportError:
        """Like :meth:`post`, but return the :class:`TransportError` instead of raising it."""
        # The one HTTP transport, so webhooks and completion callbacks alike get a client span
        # and send its traceparent (a no-op without OpenTelemetry).
        sent = dict(headers)
        with tracing.http_post(url, redact_url(url), sent) as client:
            try:
                response = self.post(url, body, sent, policy=policy)
            except TransportError as exc:
                tracing.http_result(client, None, exc.kind.value)
                return exc
            tracing.http_result(client, response.status)
        return response

    def _post(
        self, session: requests.Session, url: str, body: bytes, headers: Mapping[str, str], started: float
    ) -> HttpResponse:
        def elapsed() -> int:
            return int((time.monotonic() - started) * 1000)

        try:
            response = session.post(
                url,
                data=body,
                headers=dict(headers),
                timeout=(self.connect_timeout, self.read_timeout),
                allow_redirects=False,
                stream=True,
            )
            try:
                text = self._read_body(response)
            finally:
                response.close()
        except SsrfError as exc:  # from the connection: a resolved address is not allowed
            message = describe(exc.reason, url, exc.address, hint=exc.hint)
            raise TransportError(FailureKind.SSRF, message, elapsed()) from None
        except requests.exceptions.RequestException as exc:
            raise self._classify(exc, started, elapsed()) from None
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            raise self._classify(exc, started, elapsed()) from None
        return HttpResponse(response.status_code, response.headers.get("Retry-After"), text, elapsed())

    @staticmethod
    def _read_body(response: requests.Response) -> str:
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_RESPONSE_BYTES:
            chunk = response.raw.read(_CHUNK, decode_content=True)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)[:MAX_RESPONSE_BYTES].decode("utf-8", errors="replace")

    def _classify(self, exc: BaseException, started: float, elapsed_ms: int) -> TransportError:
        # The messages are ours: a driver's text can carry the URL, and URLs can carry tokens.
        if time.monotonic() - started >= self.deadline:
            return TransportError(
                FailureKind.DEADLINE, f"attempt exceeded its deadline of {self.deadline:g} s", elapsed_ms
            )
        if isinstance(exc, requests.exceptions.ConnectTimeout):
            return TransportError(
                FailureKind.TIMEOUT, f"connect timed out after {self.connect_timeout:g} s", elapsed_ms
            )
        if isinstance(exc, requests.exceptions.SSLError):
            message = "TLS handshake or certificate verification failed"
            return TransportError(FailureKind.TLS, message, elapsed_ms)
        if isinstance(exc, requests.exceptions.Timeout | socket.timeout):
            return TransportError(
                FailureKind.TIMEOUT, f"read timed out after {self.read_timeout:g} s", elapsed_ms
            )
        if isinstance(exc, requests.exceptions.ConnectionError):
            reason = _connection_reason(exc)
            return TransportError(FailureKind.CONNECT, f"connection failed: {reason}", elapsed_ms)
        message = f"invalid HTTP response ({type(exc).__name__})"
        return TransportError(FailureKind.PROTOCOL, message, elapsed_ms)


def _connection_reason(exc: BaseException) -> str:
    """Name the root cause of a connection error (refused, reset, DNS) without quoting the URL."""
    text = repr(exc)
    for needle, reason in (
        ("refused", "connection refused"),
        ("reset", "connection reset by peer"),
        ("NameResolutionError", "host name could not be resolved"),
        ("Name or service not known", "host name could not be resolved"),
        ("RemoteDisconnected", "the receiver closed the connection without answering"),
    ):
        if needle in text:
            return reason
    return type(exc).__name__
