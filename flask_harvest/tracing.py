"""Traces across the app and its workers, with OpenTelemetry when the ``otel`` extra is installed.

Without ``opentelemetry-api`` nothing here does anything: the spans are one inert object,
:func:`capture` returns ``None`` (no column is written) and no header is added. With it, spans go
to whatever tracer provider the application configured (none configured: the API's no-op
provider, and nothing is stored either, since a no-op span has no valid context).

A trace crosses the queue inside the row, never inside the job: the W3C ``traceparent`` and
``tracestate`` of the span that caused the work are stored as a small JSON text with the delivery,
outbox message or execution, so a job rebuilt by the sweeper after Redis was lost still joins its
trace. Span names and attributes follow the OpenTelemetry semantic conventions (docs/tracing.rst).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, Protocol
from urllib.parse import urlsplit

from ._version import __version__

try:
    from opentelemetry import trace as _trace
    from opentelemetry.context import Context as _Context
    from opentelemetry.trace import SpanKind as _SpanKind
    from opentelemetry.trace import Status as _Status
    from opentelemetry.trace import StatusCode as _StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    #: Whether ``opentelemetry-api`` is installed.
    ENABLED = True
except ImportError:  # the otel extra is not installed: tracing is off, at no cost
    ENABLED = False

#: The ``messaging.system`` of the spans of queued work.
MESSAGING_SYSTEM = "flask_harvest"
# The longest stored trace context: a traceparent is 55 characters, and W3C caps a tracestate at
# 32 members of at most 256 characters; anything longer is not a context we wrote.
_MAX_STORED = 9000

if ENABLED:
    # Only the W3C trace context is stored and sent, whatever the app's global propagator is:
    # baggage can carry anything, and a receiver is a third party.
    _PROPAGATOR = TraceContextTextMapPropagator()
    _SPAN_KINDS = {
        "internal": _SpanKind.INTERNAL,
        "producer": _SpanKind.PRODUCER,
        "consumer": _SpanKind.CONSUMER,
        "client": _SpanKind.CLIENT,
    }


class Span:
    """A started span as this package uses it; every method is a no-op without OpenTelemetry."""

    __slots__ = ("_span",)

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def set(self, key: str, value: str | int | bool | None) -> None:
        """Set the attribute ``key`` (a ``None`` value is left out)."""
        if self._span is not None and value is not None:
            self._span.set_attribute(key, value)

    def fail(self, error_type: str) -> None:
        """Mark the span failed; ``error_type`` is a short class of error, never a message."""
        if self._span is not None:
            self._span.set_attribute("error.type", error_type)
            self._span.set_status(_Status(_StatusCode.ERROR, error_type))

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Add this span's ``traceparent`` (and ``tracestate``) to ``headers``."""
        if self._span is not None and self._span.get_span_context().is_valid:
            _PROPAGATOR.inject(headers, context=_trace.set_span_in_context(self._span))


_NO_SPAN = Span()


def capture() -> str | None:
    """Return the current span's trace context as the text to store with queued work, or ``None``
    when there is no valid current span (no OpenTelemetry, no tracer provider, no trace)."""
    if not ENABLED or not _trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return json.dumps(carrier, separators=(",", ":"), sort_keys=True) if carrier else None


def _parent(stored: str | None) -> _Context | None:
    """The context a stored trace context names; ``None`` (the current one) if none or unreadable.

    A row's trace context is data another process wrote: anything unreadable is ignored, never
    raised, as a trace must not fail the work it describes.
    """
    if not stored or len(stored) > _MAX_STORED:
        return None
    try:
        carrier = json.loads(stored)
    except ValueError:
        return None
    if not isinstance(carrier, dict):
        return None
    carrier = {k: v for k, v in carrier.items() if isinstance(k, str) and isinstance(v, str)}
    context = _PROPAGATOR.extract(carrier)
    return context if _trace.get_current_span(context).get_span_context().is_valid else None


def _inert() -> bool:
    """Whether a span started now, without a stored parent, could only be the API's invalid
    no-op span: no tracer provider is set, and no span is current (one from an incoming request
    would have to be carried on)."""
    provider = _trace.get_tracer_provider()
    if not isinstance(provider, _trace.ProxyTracerProvider | _trace.NoOpTracerProvider):
        return False
    return not _trace.get_current_span().get_span_context().is_valid


@contextlib.contextmanager
def span(
    name: str,
    *,
    kind: str = "internal",
    parent: str | None = None,
    attributes: Mapping[str, str | int | bool | None] | None = None,
    link_current: bool = False,
) -> Iterator[Span]:
    """Run the block inside a new current span named ``name``.

    :param kind: ``internal``, ``producer``, ``consumer`` or ``client``.
    :param parent: a trace context stored by :func:`capture` (in another process, maybe): the span
        joins that trace; ``None`` or unreadable: the current span is the parent.
    :param attributes: set on the span at its start; ``None`` values are left out.
    :param link_current: with a stored ``parent``, link the new span to the current one when
        that is in another trace (what made this happen now: an operator's request, say).

    An exception leaving the block marks the span failed with its type only (messages can hold
    secrets); the workflow engine's own unwinding (suspension, cancellation) does not.
    """
    if not ENABLED:
        yield _NO_SPAN
        return
    context = _parent(parent)
    if context is None and _inert():
        yield _NO_SPAN  # what the API's no-op tracer would start, at a tenth of its cost
        return
    tracer = _trace.get_tracer("flask_harvest", __version__)
    values = {k: v for k, v in (attributes or {}).items() if v is not None}
    links = []
    if link_current and context is not None:
        current = _trace.get_current_span().get_span_context()
        stored = _trace.get_current_span(context).get_span_context()
        if current.is_valid and current.trace_id != stored.trace_id:
            links.append(_trace.Link(current))
    with tracer.start_as_current_span(
        name,
        context=context,
        kind=_SPAN_KINDS[kind],
        attributes=values,
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    ) as started:
        handle = Span(started)
        try:
            yield handle
        except Exception as exc:
            handle.fail(type(exc).__qualname__)
            raise


# -- the spans of workflows ------------------------------------------------------------------------


class Run(Protocol):
    """What the workflow spans read of an execution."""

    @property
    def workflow_name(self) -> str: ...
    @property
    def workflow_id(self) -> str: ...
    @property
    def execution_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def trace_context(self) -> str | None: ...


def _workflow(run: Run) -> dict[str, str | int | bool | None]:
    return {
        "harvest.workflow.name": run.workflow_name,
        "harvest.workflow.id": run.workflow_id,
        "harvest.execution.id": run.execution_id,
    }


def started(name: str) -> str | None:
    """Make the producer span of a start, ``start <name>``, a child of the current span (a
    request's, a terminal hook's for a trigger's start), and return its context for the run to
    store, so all of a run's claims are in one trace even when nothing was traced before."""
    if not ENABLED:
        return None
    # Opened and closed here: it marks the moment of the start, and the insert that follows is
    # the store's, in a transaction the caller may hold open long after.
    with workflow_start(name):
        return capture()


def workflow_start(name: str) -> contextlib.AbstractContextManager[Span]:
    """The producer span of a start, ``start <name>`` (see :func:`started`)."""
    return span(
        f"start {name}",
        kind="producer",
        attributes={
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "start",
            "harvest.workflow.name": name,
        },
    )


def workflow_run(run: Run) -> contextlib.AbstractContextManager[Span]:
    """The consumer span of one claim of a run, ``run <name>``, in the trace of its start: a run
    that sleeps or is recovered after a crash has one such span per claim."""
    attributes = _workflow(run)
    attributes.update(
        {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "process",
            "messaging.message.id": run.execution_id,
            "harvest.attempt": run.attempt,
        }
    )
    return span(f"run {run.workflow_name}", kind="consumer", parent=run.trace_context, attributes=attributes)


def workflow_step(name: str, seq: int, attempt: int) -> contextlib.AbstractContextManager[Span]:
    """The span of one try of a step's function, ``step <name>`` (replayed steps run nothing and
    have none)."""
    return span(
        f"step {name}",
        attributes={"harvest.step.name": name, "harvest.step.seq": seq, "harvest.step.attempt": attempt},
    )


def workflow_end(run: Run, state: str) -> contextlib.AbstractContextManager[Span]:
    """The span of a run's terminal transition, ``end <name>``, in the trace of its start (linked
    to the current span when another trace ended it, an operator's terminate, say). The terminal
    hooks run inside it, so the completion callbacks and the trigger starts they write store its
    context and join the run's trace."""
    attributes = _workflow(run)
    attributes["harvest.workflow.state"] = state
    return span(
        f"end {run.workflow_name}", parent=run.trace_context, attributes=attributes, link_current=True
    )


# -- the spans of the delivery path -----------------------------------------------------------------


def publish(topic: str) -> contextlib.AbstractContextManager[Span]:
    """The producer span of a dispatch: ``send <topic>``; the deliveries store its context."""
    return span(
        f"send {topic}",
        kind="producer",
        attributes={
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "dispatch",
            "messaging.destination.name": topic,
        },
    )


def process(
    destination: str,
    message_id: str,
    attempt: int,
    parent: str | None,
    extra: Mapping[str, str | int | bool | None] | None = None,
) -> contextlib.AbstractContextManager[Span]:
    """The consumer span of one attempt of queued work, ``process <destination>``, in the trace
    of the context stored with it (``parent``)."""
    attributes: dict[str, str | int | bool | None] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "process",
        "messaging.destination.name": destination,
        "messaging.message.id": message_id,
        "harvest.attempt": attempt,
    }
    attributes.update(extra or {})
    return span(f"process {destination}", kind="consumer", parent=parent, attributes=attributes)


@contextlib.contextmanager
def http_post(url: str, shown_url: str, headers: MutableMapping[str, str]) -> Iterator[Span]:
    """The client span of one POST to ``url``, ``POST``: adds its ``traceparent`` to ``headers``
    (the signatures cover the id, timestamp and body only, so an added header breaks none).

    :param shown_url: ``url`` with its credentials, query values and fragment redacted, the
        ``url.full`` attribute: a URL can carry a token, and spans are read by many.
    """
    if not ENABLED:
        yield _NO_SPAN
        return
    attributes: dict[str, str | int | bool | None] = {
        "http.request.method": "POST",
        "url.full": shown_url,
    }
    attributes.update(_server(url))
    with span("POST", kind="client", attributes=attributes) as client:
        client.inject(headers)
        yield client


def http_result(client: Span, status: int | None, failure: str | None = None) -> None:
    """Record what a POST came to on its client span: the response's ``status``, or the kind of
    ``failure`` that left it without one."""
    if status is None:
        client.fail(failure or "error")
        return
    client.set("http.response.status_code", status)
    if status >= 400:
        client.fail(str(status))


def _server(url: str) -> dict[str, str | int | bool | None]:
    """``server.address`` and ``server.port`` of ``url`` (never its credentials)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a URL the SSRF check refuses anyway: the redacted url.full says enough
        return {}
    default = 443 if parts.scheme.lower() == "https" else 80
    return {"server.address": parts.hostname, "server.port": port if port is not None else default}
