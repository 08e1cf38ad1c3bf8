"""A long-lived process keeps nothing of a request once it ended: its agent, its model and
the messages the model answered are collected, whatever way its runs ended (answered,
compacted, streamed, a stream left early, cancelled, timed out, ``run_sync`` from a
thread), once its session is deleted, in memory, SQLite and PostgreSQL.
``benchmarks/growth.py`` measures the same at scale."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from littleghost.sessions import (
    InMemorySessionStore,
    PostgresSessionStore,
    SessionStore,
    SQLiteSessionStore,
)
from tests.growth import KINDS, serve, tenant_agent
from tests.stores import postgres_schema_sync

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    if request.param == "memory":
        yield InMemorySessionStore()
    elif request.param == "sqlite":
        yield SQLiteSessionStore(tmp_path / "sessions.db")
    else:
        with postgres_schema_sync(request.getfixturevalue("postgres_dsn")) as conninfo:
            yield PostgresSessionStore(conninfo)


@pytest.mark.parametrize("kind", KINDS)
async def test_nothing_of_a_request_is_kept_once_it_ended(kind: str, store: SessionStore) -> None:
    """Requests of one kind on sessions not used before: once each ended (its session
    deleted), its agent and its model are collected."""
    kept = [ref for number in range(3) for ref in await serve(kind, store, f"{kind}-{number}")]
    await until_collected(kept, store)


@pytest.mark.parametrize("kind", KINDS)
async def test_an_agent_class_made_per_tenant_is_collected_once_its_requests_ended(
    kind: str, store: SessionStore
) -> None:
    """A class per tenant (with the SDK's providers installed, as the tests have them):
    nothing kept across runs (class-level caches, the context engine's index, the
    store's locks, telemetry) holds the class once its requests ended."""
    kept = []
    for tenant in range(3):
        agent_class = tenant_agent(tenant, kind)
        kept += [weakref.ref(agent_class), *await serve(kind, store, f"t{tenant}", agent_class)]
        del agent_class
    await until_collected(kept, store)


async def until_collected(kept: list[weakref.ref[Any]], store: SessionStore) -> None:
    """Fail unless every object of ``kept`` is collected once ``store`` is closed."""
    assert await store.list_sessions() == ()
    close = getattr(store, "aclose", None)
    if close is not None:
        await close()
    # a store call a run stopped waiting for may go on in its worker thread a moment,
    # holding the run's objects until it ends; what is leaked stays for good
    with anyio.move_on_after(10):
        while any(ref() is not None for ref in kept):
            await anyio.sleep(0.05)
            gc.collect()
    alive = [ref() for ref in kept if ref() is not None]
    assert not alive, f"kept after the requests ended: {[type(o).__name__ for o in alive]}"


PER_TENANT_MODELS = """
import gc, logging, os, sys, tracemalloc
from pathlib import Path

import anyio

import littleghost
from littleghost import Agent, manage_context
from littleghost.models import register_provider
from littleghost.testing import ScriptedModel, text_response

logging.getLogger("littleghost.context").setLevel(logging.ERROR)  # a warning per model
register_provider(
    "pertenant", lambda name: ScriptedModel([text_response("hello")], name=name or "default")
)


@manage_context(context_window_tokens=4_000)
class Tenanted(Agent):
    instructions = "You help customers."


async def tenants(first, count):
    for tenant in range(first, first + count):
        async with Tenanted(model=f"pertenant:ft-tenant-{tenant}") as agent:
            await agent.run("hi")


own = [tracemalloc.Filter(True, f"{Path(littleghost.__file__).parent}{os.sep}*")]
tracemalloc.start()
snapshots = []
for first, count in [(0, 300), (300, 500), (800, 500)]:  # the first make what is made once
    anyio.run(tenants, first, count, backend=sys.argv[1])
    gc.collect()
    snapshots.append(tracemalloc.take_snapshot().filter_traces(own))
grown = snapshots[2].compare_to(snapshots[1], "lineno")  # the last 500 tenants'
for stat in grown:
    if stat.count_diff >= 100:  # one block for every 5 tenants or more
        print(stat)
"""


def check_script(script: str, *args: str) -> None:
    """Run ``script`` in a Python process of its own: it exits 0, printing nothing."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_model_string_per_tenant_leaves_nothing_once_its_requests_ended(backend: str) -> None:
    """A model string per tenant (a fine-tuned model each, ``@manage_context`` assuming
    the window none of them advertises): what littleghost keeps across requests does not
    grow with the tenants (the warning said once per model remembered each model for
    good, some 180 bytes a tenant). No line of littleghost's code holds 100 blocks of
    memory more after 500 more tenants, in a process without an OpenTelemetry SDK (whose
    metric series, one per model, are its own: see docs/telemetry.md)."""
    check_script(PER_TENANT_MODELS, backend)


WARNING_THREADS = """
import logging, sys, threading

import anyio

from littleghost import Agent, manage_context
from littleghost.testing import ScriptedModel, text_response

logging.getLogger("littleghost.context").setLevel(logging.ERROR)  # a warning per model
sys.setswitchinterval(1e-6)  # threads take turns between almost any two bytecodes


@manage_context(context_window_tokens=4_000)
class Tenanted(Agent):
    pass


async def tenants(thread):
    for tenant in range(4_000):
        model = ScriptedModel([text_response("hello")], name=f"ft-{thread}-{tenant}")
        try:
            await Tenanted(model=model).run("hi")
        except Exception as error:
            print(repr(error))


threads = [threading.Thread(target=anyio.run, args=(tenants, n)) for n in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
"""


def test_runs_in_threads_each_of_a_model_of_its_own_all_answer() -> None:
    """Runs in four threads, each with a model of its own that advertises no window:
    the warning said once per model, which forgets the oldest of them past 256, failed
    some of them with ``KeyError`` (two threads forgetting the same one at once)."""
    check_script(WARNING_THREADS)
