"""Helpers for testing code that sends webhooks: a capturing receiver on 127.0.0.1, and
:func:`drain`, which sends an app's due deliveries synchronously.

::

    from flask_harvest.testing import CapturingReceiver, drain

    with CapturingReceiver() as receiver:
        receiver.respond("/hook", status=500, times=1)   # first call fails, then 200
        ...dispatch to receiver.url("/hook")...
        drain(app)                                       # or: received = receiver.wait_for(1)
        received = receiver.requests

With pytest, the ``harvest_receiver`` fixture (from the ``flask_harvest.pytest_plugin`` plugin,
registered when flask-harvest is installed) is a started :class:`CapturingReceiver`. The app under
test must allow loopback targets: ``HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS = True``.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING

from werkzeug.datastructures import Headers
from werkzeug.serving import BaseWSGIServer, make_server
from werkzeug.wrappers import Request, Response

from ._app import get_engine
from ._time import utcnow
from .errors import ConfigurationError
from .webhooks.models import DeliveryState

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment
    from flask import Flask

#: A custom behaviour: given the request, return a werkzeug ``Response``.
Handler = Callable[[Request], Response]


@dataclass(frozen=True)
class ReceivedRequest:
    """One request the receiver got."""

    path: str
    headers: Mapping[str, str]
    body: bytes
    received_at: float = field(default_factory=time.time)

    @property
    def webhook_id(self) -> str | None:
        return self.headers.get("webhook-id")


class CapturingReceiver:
    """A threaded HTTP server on 127.0.0.1 that records every request.

    By default every path answers ``200``. :meth:`respond` queues other answers for a path, and
    :meth:`handle` installs a function for full control (slow answers, streamed bodies).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.Condition()
        self._requests: list[ReceivedRequest] = []
        self._scripted: dict[str, list[Handler]] = {}
        self._handlers: dict[str, Handler] = {}
        self._server: BaseWSGIServer = make_server(host, port, self._wsgi, threaded=True)
        self._thread: threading.Thread | None = None
        # What stop() writes to, to wake the serving loop at once.
        self._wake_read, self._wake_write = socket.socketpair()

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> CapturingReceiver:
        self._thread = threading.Thread(target=self._serve, name=f"harvest-receiver-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the port; returns once the serving thread has ended.

        Prompt: the loop is woken, where ``serve_forever`` would notice only at its next poll
        (half a second later, paid by every test that uses the receiver).
        """
        if self._wake_write.fileno() == -1:
            return
        self._wake_write.send(b"x")
        if self._thread is not None:
            self._thread.join()
        self._server.server_close()
        self._wake_write.close()
        self._wake_read.close()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._server, selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            # No timeout: the loop wakes only for a connection or for stop().
            while True:
                ready = {key.fileobj for key, _ in selector.select()}
                if self._wake_read in ready:
                    return
                self._server.handle_request()

    def __enter__(self) -> CapturingReceiver:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def url(self, path: str = "/") -> str:
        """Return the absolute URL of ``path`` on this receiver."""
        return f"http://127.0.0.1:{self.port}{path}"

    # -- behaviour -------------------------------------------------------------------------

    def respond(
        self,
        path: str,
        status: int = 200,
        body: str = "",
        headers: Mapping[str, str] | None = None,
        *,
        times: int = 1,
    ) -> None:
        """Answer the next ``times`` requests to ``path`` with this response (then the default)."""
        response = (status, body, dict(headers or {}))

        def handler(_request: Request) -> Response:
            code, text, extra = response
            return Response(text, status=code, headers=Headers(extra))

        with self._lock:
            self._scripted.setdefault(path, []).extend([handler] * times)

    def handle(self, path: str, handler: Handler) -> None:
        """Answer every request to ``path`` with ``handler`` (after any scripted answers)."""
        with self._lock:
            self._handlers[path] = handler

    # -- what was received -----------------------------------------------------------------

    @property
    def requests(self) -> list[ReceivedRequest]:
        with self._lock:
            return list(self._requests)

    def wait_for(self, count: int, timeout: float = 10.0, path: str | None = None) -> list[ReceivedRequest]:
        """Wait until ``count`` requests (to ``path``, if given) arrived; return them.

        :raises TimeoutError: fewer arrived within ``timeout`` seconds.
        """
        end = time.monotonic() + timeout
        with self._lock:
            while True:
                matching = [r for r in self._requests if path is None or r.path == path]
                if len(matching) >= count:
                    return matching
                remaining = end - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"received {len(matching)} of {count} requests in {timeout} s")
                self._lock.wait(remaining)

    # -- the WSGI app ----------------------------------------------------------------------

    def _wsgi(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ)
        received = ReceivedRequest(
            request.path, {k.lower(): v for k, v in request.headers.items()}, request.get_data()
        )
        with self._lock:
            self._requests.append(received)
            self._lock.notify_all()
            scripted = self._scripted.get(request.path)
            handler = scripted.pop(0) if scripted else self._handlers.get(request.path)
        response = handler(request) if handler else Response("", status=200)
        return response(environ, start_response)


def drain(app: Flask, timeout: float = 30.0, *, retries: bool = False) -> int:
    """Send the app's due deliveries on this thread, until none is due and none is in flight.

    The simplest way that is correct with either job backend: it does not go through the backend.
    It relays the outbox (after waiting for the relays that commits started), then makes one
    attempt of each due ``PENDING`` delivery with the app's runner, again and again. Jobs the
    backend already holds for those deliveries find them done and do nothing (the claim decides
    who sends). With the ``local`` backend it first waits for the attempts its threads are making;
    attempts made elsewhere (an RQ worker, a sweeper's relay) are waited for through the store:
    drain returns when no delivery is due or in flight and no outbox message waits.

    A failed attempt schedules its retry as usual, at ``next_attempt_at``. By default drain does
    not wait for it; with ``retries=True`` it goes on, sleeping until each retry is due, until
    every delivery is delivered, dead-lettered or skipped (set a short
    ``HARVEST_WEBHOOKS_INITIAL_BACKOFF_MS`` in tests).

    :returns: the number of attempts drain made itself.
    :raises TimeoutError: deliveries were still due, in flight (or, with ``retries``, pending)
        after ``timeout`` seconds.
    :raises ConfigurationError: the app hands its deliveries to a delegate, which owns them.
    """
    engine = get_engine(app)
    if engine.manager.delegate is not None:
        raise ConfigurationError("this app hands its deliveries to a delegate: drain would send them twice")
    end = time.monotonic() + timeout
    attempts = 0
    with app.app_context():
        # Wait for relays that commits started; the manager starts a new relay thread when needed.
        engine.manager.close()
        while True:
            while engine.manager.relay_outbox().relayed:
                pass
            engine.backend.join(timeout=max(0.0, end - time.monotonic()))
            due = engine.store.due_deliveries(now=utcnow(), limit=100)
            for delivery_id in due:
                if engine.runner.run(delivery_id) is not None:
                    attempts += 1
            if not due:
                counts = engine.store.delivery_stats()[0].counts
                waiting = counts.get(DeliveryState.INFLIGHT.value, 0)
                if retries:
                    waiting += counts.get(DeliveryState.PENDING.value, 0)
                if engine.manager.outbox is not None:  # being relayed elsewhere (the sweeper)
                    waiting += engine.manager.outbox.pending_count()
                if not waiting:
                    return attempts
            if time.monotonic() > end:
                raise TimeoutError(f"deliveries were still waiting after {timeout} s")
            if not due:
                time.sleep(0.02)
