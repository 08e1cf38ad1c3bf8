"""Session stores for tests: every kind, each on fresh storage.

``PlainStore`` is a custom store with exactly the four methods of the protocol (no
``lock``); run tests use it as the kind ``"plain"`` besides the built-in ``KINDS``.
``working_until`` makes an agent that holds its session in a tool until released.

PostgreSQL comes from the session fixture ``postgres_dsn`` (``tests/conftest.py``): the
server ``LITTLEGHOST_TEST_POSTGRES_DSN`` names, or else a throwaway one the tests start.
"""

from __future__ import annotations

import gc
import threading
import uuid
import warnings
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import anyio
import pytest

from littleghost import Agent, Message, tool
from littleghost.errors import UnknownSessionError
from littleghost.sessions import (
    InMemorySessionStore,
    PostgresSessionStore,
    SQLiteSessionStore,
    message_from_json,
    message_to_json,
)
from littleghost.sessions.waits import WAITS

KINDS = ("memory", "sqlite", "postgres")
"""The built-in stores (each has a ``lock`` method)."""
RUN_KINDS = (*KINDS, "plain")
"""The built-in stores and ``PlainStore``."""


class PlainStore:
    """A custom store: the four protocol methods over a dict of JSON texts, no ``lock``."""

    def __init__(self) -> None:
        self.sessions: dict[str, list[str]] = {}

    async def load(self, session_id: str) -> tuple[Message, ...]:
        return tuple(message_from_json(text) for text in self.sessions.get(session_id, ()))

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        texts = [message_to_json(message) for message in messages]
        if texts:
            self.sessions.setdefault(session_id, []).extend(texts)

    async def list_sessions(self) -> tuple[str, ...]:
        return tuple(self.sessions)

    async def delete(self, session_id: str) -> None:
        if self.sessions.pop(session_id, None) is None:
            raise UnknownSessionError(f"no session {session_id!r}", session_id=session_id)


class SlowWrites(PlainStore):
    """``PlainStore`` whose writes take a while (a database under load): ``seconds``,
    each write to a session that holds ``after`` messages or more."""

    def __init__(self, seconds: float = 0.2, after: int = 0) -> None:
        super().__init__()
        self.seconds = seconds
        self.after = after

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        if len(self.sessions.get(session_id, ())) >= self.after:
            await anyio.sleep(self.seconds)
        await super().append(session_id, messages)


class SlottedStore:
    """``PlainStore`` with ``__slots__`` (as thin client wrappers often are): no weak
    reference can be made to it."""

    __slots__ = ("plain",)

    def __init__(self) -> None:
        self.plain = PlainStore()

    async def load(self, session_id: str) -> tuple[Message, ...]:
        return await self.plain.load(session_id)

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        await self.plain.append(session_id, messages)

    async def list_sessions(self) -> tuple[str, ...]:
        return await self.plain.list_sessions()

    async def delete(self, session_id: str) -> None:
        await self.plain.delete(session_id)


class LockingStore(PlainStore):
    """``PlainStore`` with a ``lock`` of its own: an anyio lock per session."""

    def __init__(self) -> None:
        super().__init__()
        self.locks: dict[str, anyio.Lock] = {}

    @asynccontextmanager
    async def lock(self, session_id: str) -> AsyncIterator[None]:
        async with self.locks.setdefault(session_id, anyio.Lock()):
            yield


def working_until(in_tool: anyio.Event, release: anyio.Event) -> type[Agent]:
    """An agent whose ``work`` tool sets ``in_tool``, then works until ``release``."""

    class Slow(Agent):
        @tool
        async def work(self) -> str:
            """Work until released."""
            in_tool.set()
            await release.wait()
            return "worked"

    return Slow


def blocking_until(in_tool: threading.Event, release: threading.Event) -> type[Agent]:
    """An agent whose ``work`` tool, a sync one run in a worker thread, sets ``in_tool``,
    then blocks until ``release`` (10 s at most): for runs in threads (``run_sync``)."""

    class Blocking(Agent):
        @tool
        def work(self) -> str:
            """Work until released (a sync tool, run in a worker thread)."""
            in_tool.set()
            release.wait(10)
            return "worked"

    return Blocking


def _run_sql(dsn: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(statement)


@asynccontextmanager
async def postgres_schema(dsn: str) -> AsyncIterator[str]:
    """A connection string (on the server ``dsn`` names) whose tables live in a new
    schema, dropped afterwards."""
    schema = f"lg_test_{uuid.uuid4().hex[:12]}"
    await anyio.to_thread.run_sync(_run_sql, dsn, f"CREATE SCHEMA {schema}")
    try:
        yield _in_schema(dsn, schema)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_run_sql, dsn, f"DROP SCHEMA {schema} CASCADE")


@contextmanager
def postgres_schema_sync(dsn: str) -> Iterator[str]:
    """``postgres_schema`` for tests that run no event loop of their own."""
    schema = f"lg_test_{uuid.uuid4().hex[:12]}"
    _run_sql(dsn, f"CREATE SCHEMA {schema}")
    try:
        yield _in_schema(dsn, schema)
    finally:
        _run_sql(dsn, f"DROP SCHEMA {schema} CASCADE")


def _in_schema(dsn: str, schema: str) -> str:
    from psycopg.conninfo import make_conninfo

    return make_conninfo(dsn, options=f"-csearch_path={schema}")


BuiltinStore = InMemorySessionStore | SQLiteSessionStore | PostgresSessionStore


@asynccontextmanager
async def open_store(
    kind: str, directory: Path, request: pytest.FixtureRequest, *, max_connections: int = 10
) -> AsyncIterator[BuiltinStore | PlainStore]:
    """A store of ``kind`` on fresh storage, closed afterwards (PostgreSQL's from the
    test's ``postgres_dsn`` fixture, started only when a test needs it, with
    ``max_connections``)."""
    if kind == "memory":
        yield InMemorySessionStore()
    elif kind == "plain":
        yield PlainStore()
    elif kind == "sqlite":
        async with SQLiteSessionStore(directory / "sessions.db") as sqlite_store:
            yield sqlite_store
    else:
        dsn = request.getfixturevalue("postgres_dsn")
        async with (
            postgres_schema(dsn) as conninfo,
            PostgresSessionStore(conninfo, max_connections=max_connections) as postgres,
        ):
            yield postgres


async def collected_warnings(held: list[object]) -> list[str]:
    """Let go of the one object ``held`` holds (the caller keeps no other reference), wait
    until the garbage collector took it, and return the warnings issued meanwhile."""
    dropped = weakref.ref(held[0])
    # A hang guard (a leak is never collected): a loaded machine took over 5 s once.
    with warnings.catch_warnings(record=True) as caught, anyio.fail_after(30):
        warnings.simplefilter("always")
        held.clear()
        while dropped() is not None:  # a worker thread lets go of its call just after it
            gc.collect()
            await anyio.sleep(0.01)
    return [str(warning.message) for warning in caught]


def waiting_runs(session_id: str) -> int:
    """The runs of this process waiting to hold ``session_id`` (of any store), in line:
    each waits at every lock that holds the session (the store's, this process's), and
    joins the innermost's line as it notes its wait there."""
    with WAITS._guard:
        owners = Counter(wait.key[0] for wait in WAITS._waits if wait.key[1] == session_id)
    return min(owners.values(), default=0)


async def eventually(check: Callable[[], bool], within: float = 5.0) -> bool:
    """Whether ``check()`` becomes true within ``within`` seconds."""
    for _ in range(max(1, round(within / 0.02))):
        if check():
            return True
        await anyio.sleep(0.02)
    return check()
