"""An OpenTelemetry SDK for the tracing tests: spans kept in memory, switched on per test.

The global tracer provider can be set once per process, and a provider that is always on would
add ``traceparent`` to every request every later test makes. So the global provider is a switch:
the SDK's while a test holds :func:`recording`, the API's no-op provider otherwise.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

EXPORTER = InMemorySpanExporter()
_SDK = TracerProvider()
_SDK.add_span_processor(SimpleSpanProcessor(EXPORTER))
_OFF = trace.NoOpTracerProvider()


class _Switch(trace.TracerProvider):
    """The SDK provider while :attr:`on`, the no-op one otherwise."""

    on = False

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return (_SDK if self.on else _OFF).get_tracer(*args, **kwargs)


_SWITCH = _Switch()
_LOCK = threading.Lock()
_installed = False


@contextmanager
def recording() -> Iterator[InMemorySpanExporter]:
    """Record the spans of the block; yield the exporter that holds them (cleared first)."""
    global _installed
    with _LOCK:
        if not _installed:
            trace.set_tracer_provider(_SWITCH)
            _installed = True
    EXPORTER.clear()
    _SWITCH.on = True
    try:
        yield EXPORTER
    finally:
        _SWITCH.on = False
        EXPORTER.clear()


def tracer() -> trace.Tracer:
    """The test's own tracer (an application's request spans)."""
    return trace.get_tracer("tests")


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    """The spans called ``name``, in the order they ended."""
    return [s for s in spans if s.name == name]


def traceparent(span: ReadableSpan) -> str:
    """The ``traceparent`` header value naming ``span``."""
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
