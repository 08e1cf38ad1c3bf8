"""Whether a long-lived process grows: many short runs over rotating session ids, one
agent instance per request (``ScriptedModel``), as a support bot serves them for weeks.

Each workload runs ``--batches`` batches of ``--runs`` requests after a warm-up batch;
each request is a fresh agent on a session id not used before (two runs on it, three
when managed, then the session is deleted, as an erasure request does). Requests rotate
through: a tool call and its answer; ``@manage_context`` compacting (a summary call in
the third run); a stream; a stream left at its first event; a run cancelled while its
model call waits; a run that times out; ``run_sync`` from a thread. Between batches it
collects garbage and prints the bytes ``tracemalloc`` still counts, and the live objects
of the types whose count grew; ``--lines N`` lists the N lines whose allocations grew
most from the first batch to the last. Flat figures mean nothing is kept per run,
session, message or agent once its requests ended::

    python benchmarks/growth.py                     # memory and SQLite stores
    python benchmarks/growth.py --store sqlite --runs 2000 --batches 5 --lines 10
    python benchmarks/growth.py --base ../lg-base        # beside an earlier checkout
    python benchmarks/growth.py --store none --postgres postgresql://...   # and PostgreSQL
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib.util
import os
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from littleghost.sessions import (
    InMemorySessionStore,
    PostgresSessionStore,
    SessionStore,
    SQLiteSessionStore,
)


def _requests() -> Any:
    """``tests/growth.py`` of this checkout, the requests ``tests/test_growth.py`` checks,
    loaded by its path: with ``--base`` it runs on the littleghost ``PYTHONPATH`` gives."""
    path = Path(__file__).resolve().parent.parent / "tests" / "growth.py"
    spec = importlib.util.spec_from_file_location("growth_requests", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REQUESTS = _requests()
KINDS: tuple[str, ...] = REQUESTS.KINDS


def live_types() -> collections.Counter[str]:
    return collections.Counter(type(item).__qualname__ for item in gc.get_objects())


async def workload(
    store: SessionStore, runs: int, batches: int, show: int, lines: int
) -> list[int]:
    sizes: list[int] = []
    counted = 0
    before: collections.Counter[str] = collections.Counter()
    first: tracemalloc.Snapshot | None = None
    for batch in range(batches + 1):
        for _ in range(runs):
            kind = KINDS[counted % len(KINDS)]
            await REQUESTS.serve(kind, store, f"session-{counted}")
            counted += 1
        gc.collect()
        size = tracemalloc.get_traced_memory()[0]
        types = live_types()
        if batch == 0:
            print(f"  warm-up: {size / 1024:9.1f} KiB traced")
        else:
            sizes.append(size)
            grown = (types - before).most_common(show)
            listed = ", ".join(f"{name} +{count}" for name, count in grown) or "none"
            print(f"  batch {batch}: {size / 1024:9.1f} KiB traced; grown: {listed}")
        before = types
        if lines and batch == 1:
            first = tracemalloc.take_snapshot()
    if first is not None:
        for stat in tracemalloc.take_snapshot().compare_to(first, "lineno")[:lines]:
            print(f"    {stat}")
    return sizes


KEPT = "bytes kept per request after warm-up"


def report(name: str, runs: int, sizes: list[int]) -> None:
    per_run = (sizes[-1] - sizes[0]) / (runs * (len(sizes) - 1)) if len(sizes) > 1 else 0.0
    print(f"{name}: {per_run:+.1f} {KEPT}")


def compare(base: str) -> None:
    """This checkout and ``base``, each in a fresh process, then their figures side by side."""
    arguments = [a for a in sys.argv[1:] if a != "--base" and not a.startswith("--base=")]
    if base in arguments:
        arguments.remove(base)
    figures: dict[str, dict[str, str]] = {}
    for label, root in (("this", str(Path(__file__).resolve().parent.parent)), ("base", base)):
        print(f"== {label}: {root}")
        environment = {**os.environ, "PYTHONPATH": root}
        command = [sys.executable, __file__, *arguments]
        done = subprocess.run(command, env=environment, capture_output=True, text=True)
        print(done.stdout + done.stderr, end="")
        for line in done.stdout.splitlines():
            if line.endswith(KEPT):
                name, figure = line.split(": ", 1)
                figures.setdefault(name, {})[label] = figure.split()[0]
    print(f"{'bytes kept per request after warm-up':46} {'this':>8} {'base':>8}")
    for name, by in figures.items():
        print(f"  {name:44} {by.get('this', '-'):>8} {by.get('base', '-'):>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1200, help="requests per batch")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--store", choices=("memory", "sqlite", "both", "none"), default="both")
    parser.add_argument("--postgres", metavar="DSN", help="also a PostgreSQL store of DSN")
    parser.add_argument("--show", type=int, default=6, help="grown types listed per batch")
    parser.add_argument("--lines", type=int, default=0, help="lines that grew most, listed")
    parser.add_argument("--base", help="another checkout, measured the same way alongside")
    options = parser.parse_args()
    if options.base:
        compare(options.base)
        return
    tracemalloc.start()
    makers: dict[str, Callable[[Path], SessionStore]] = {
        "memory": lambda _: InMemorySessionStore(),
        "sqlite": lambda folder: SQLiteSessionStore(folder / "sessions.db"),
    }
    if options.postgres:
        makers["postgres"] = lambda _: PostgresSessionStore(options.postgres)
    for name, make in makers.items():
        if options.store not in (name, "both") and name != "postgres":
            continue
        print(f"{name} store, {options.runs} requests a batch ({', '.join(KINDS)} in turn)")
        with tempfile.TemporaryDirectory() as folder:
            store = make(Path(folder))
            sizes = anyio.run(
                workload, store, options.runs, options.batches, options.show, options.lines
            )
            if isinstance(store, (SQLiteSessionStore, PostgresSessionStore)):
                anyio.run(store.aclose)
        report(name, options.runs, sizes)


if __name__ == "__main__":
    main()
