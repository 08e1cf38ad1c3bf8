"""A long-lived process keeps nothing of a request once it ended: its agent, its model and
the messages the model answered are collected, whatever way its runs ended (answered,
compacted, streamed, a stream left early, cancelled, timed out, ``run_sync`` from a
thread), once its session is deleted, in memory, SQLite and PostgreSQL.
``benchmarks/growth.py`` measures the same at scale."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from littleghost.sessions import (
    InMemorySessionStore,
    PostgresSessionStore,
    SessionStore,
    SQLiteSessionStore,
)
from tests.growth import KINDS, serve
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
