"""Shared fixtures: both anyio backends, and spans captured in memory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class SpanLedger(SpanProcessor):
    """Which spans started and which ended (an exporter sees only the ended ones)."""

    def __init__(self) -> None:
        self.started: set[int] = set()
        self.ended: set[int] = set()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.started.add(span.context.span_id)

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.add(span.context.span_id)

    @property
    def open(self) -> set[int]:
        return self.started - self.ended


_exporter = InMemorySpanExporter()
_ledger = SpanLedger()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(_exporter))
_provider.add_span_processor(_ledger)
trace.set_tracer_provider(_provider)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run each async test under asyncio and under trio."""
    return str(request.param)


class Spans:
    """The spans finished during one test."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self._exporter = exporter

    def all(self) -> tuple[ReadableSpan, ...]:
        return tuple(self._exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [span for span in self.all() if span.name.startswith(prefix)]

    @property
    def still_open(self) -> set[int]:
        """Spans started during the test that have not ended."""
        return set(_ledger.open)

    def one(self, prefix: str) -> ReadableSpan:
        found = self.named(prefix)
        assert len(found) == 1, [span.name for span in self.all()]
        return found[0]


@pytest.fixture
def spans() -> Iterator[Spans]:
    """Spans finished during the test, read back from an in-memory exporter."""
    _exporter.clear()
    _ledger.started.clear()
    _ledger.ended.clear()
    yield Spans(_exporter)
    _exporter.clear()
