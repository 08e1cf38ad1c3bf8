"""``PostgresSessionStore``: sessions in PostgreSQL, shared by many workers (psycopg 3).

psycopg's sync API runs in worker threads (``anyio.to_thread``), so the store works
under asyncio and trio alike. A run holds its session through a session-level advisory
lock on a connection of its own; the lock goes with the connection, so a worker that
dies frees its sessions.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from littleghost.errors import (
    ConfigurationError,
    CorruptSessionStoreError,
    SessionStoreError,
    UnknownSessionError,
)
from littleghost.messages import Message
from littleghost.sessions.base import (
    SCHEMA_VERSION,
    STORE_FORMAT,
    check_schema,
    check_session_id,
)
from littleghost.sessions.codec import message_from_json, messages_to_json
from littleghost.sessions.locks import SessionLocks

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresSessionStore"]

T = TypeVar("T")

_SCHEMA = (
    "CREATE TABLE littleghost_meta (key text PRIMARY KEY, value text NOT NULL)",
    "CREATE TABLE littleghost_sessions (id text PRIMARY KEY, length bigint NOT NULL,"
    " created bigint GENERATED ALWAYS AS IDENTITY)",
    "CREATE TABLE littleghost_messages (session_id text NOT NULL, position bigint NOT NULL,"
    " body text NOT NULL, PRIMARY KEY (session_id, position))",
)
_TABLES = ("littleghost_meta", "littleghost_sessions", "littleghost_messages")


def _lock_key(name: str) -> int:
    """A 64-bit advisory lock key for ``name`` (a collision only serializes more)."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8, person=b"littleghost").digest()
    return int.from_bytes(digest, "big", signed=True)


_SCHEMA_LOCK = _lock_key("littleghost schema")


class _Pool:
    """At most ``size`` connections for short operations, kept open between them."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], size: int) -> None:
        self._connect = connect
        self._slots = threading.BoundedSemaphore(size)
        self._guard = threading.Lock()
        self._idle: list[psycopg.Connection[Any]] = []

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        from psycopg.pq import TransactionStatus

        with self._slots:
            with self._guard:
                connection = self._idle.pop() if self._idle else None
            if connection is None or connection.closed or connection.broken:
                connection = self._connect()
            try:
                yield connection
            finally:
                reusable = (
                    not connection.broken
                    and connection.info.transaction_status == TransactionStatus.IDLE
                )
                if reusable:
                    with self._guard:
                        self._idle.append(connection)
                else:
                    connection.close()

    def close(self) -> None:
        with self._guard:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


class _Waiter:
    """A blocking statement in a worker thread that a cancellation can interrupt."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self._connection = connection
        self._guard = threading.Lock()
        self._started = False
        self._abandoned = False
        self._done = threading.Event()

    def run(self, query: str, parameters: tuple[Any, ...]) -> None:
        with self._guard:
            if self._abandoned:
                return
            self._started = True
        try:
            self._connection.execute(query, parameters)
        finally:
            self._done.set()

    def interrupt(self) -> None:
        """Stop the statement and wait until its thread has let go of the connection."""
        with self._guard:
            self._abandoned = True
            if not self._started:
                return
        while not self._done.wait(0.05):
            self._connection.cancel()


class PostgresSessionStore:
    """Sessions in PostgreSQL, for deployments with many workers on many machines.

    The tables (``littleghost_meta``, ``littleghost_sessions``, ``littleghost_messages``)
    are created on first use in the connection's current schema (choose one with
    ``options=-csearch_path=...`` in the connection string). Each ``append`` is one
    transaction. A run holds its session with a PostgreSQL advisory lock, so runs of one
    session are serialized across every process that uses the database; the wait is
    cancellable and counts against the waiting run's deadline.

    Args:
        conninfo: A libpq connection string or URI.
        max_connections: Connections kept for short operations (> 0); each running
            session holds one more while it runs.

    Raises:
        ConfigurationError: psycopg 3 is not installed, or an argument is invalid.
    """

    def __init__(self, conninfo: str, *, max_connections: int = 10) -> None:
        try:
            import psycopg
        except ImportError:
            raise ConfigurationError(
                "PostgresSessionStore needs psycopg 3: pip install 'littleghost[postgres]'"
            ) from None
        if not isinstance(conninfo, str):
            raise ConfigurationError(
                f"PostgresSessionStore: conninfo must be a str, not {type(conninfo).__name__}"
            )
        if (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise ConfigurationError(
                f"PostgresSessionStore: max_connections must be an int >= 1, not {max_connections!r}"
            )
        self._psycopg = psycopg
        self._conninfo = conninfo
        self._pool = _Pool(self._connect, max_connections)
        self._ready = False
        self._locks = SessionLocks()

    def __repr__(self) -> str:
        return "PostgresSessionStore(...)"

    async def __aenter__(self) -> PostgresSessionStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the idle connections (a later call opens new ones)."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._pool.close)

    async def load(self, session_id: str) -> tuple[Message, ...]:
        """The session's messages in append order; ``()`` for an unknown session."""
        check_session_id(session_id)
        rows = await self._call(
            lambda connection: connection.execute(
                "SELECT body FROM littleghost_messages WHERE session_id = %s ORDER BY position",
                (session_id,),
            ).fetchall()
        )
        return tuple(message_from_json(body) for (body,) in rows)

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        """Append ``messages`` to the session in one transaction.

        Raises:
            UnstorableValueError: A message holds a value that is not JSON-like; nothing
                was stored.
        """
        check_session_id(session_id)
        bodies = messages_to_json(messages)
        if not bodies:
            return

        def write(connection: psycopg.Connection[Any]) -> None:
            with connection.transaction():
                row = connection.execute(
                    "INSERT INTO littleghost_sessions (id, length) VALUES (%s, %s) "
                    "ON CONFLICT (id) DO UPDATE "
                    "SET length = littleghost_sessions.length + EXCLUDED.length "
                    "RETURNING length",
                    (session_id, len(bodies)),
                ).fetchone()
                assert row is not None
                start = int(row[0]) - len(bodies)
                with connection.cursor() as cursor:
                    cursor.executemany(
                        "INSERT INTO littleghost_messages (session_id, position, body) "
                        "VALUES (%s, %s, %s)",
                        [(session_id, start + index, body) for index, body in enumerate(bodies)],
                    )

        await self._call(write)

    async def list_sessions(self) -> tuple[str, ...]:
        """The ids of the stored sessions, oldest first."""
        rows = await self._call(
            lambda connection: connection.execute(
                "SELECT id FROM littleghost_sessions ORDER BY created"
            ).fetchall()
        )
        return tuple(session_id for (session_id,) in rows)

    async def delete(self, session_id: str) -> None:
        """Remove the session and its messages in one transaction.

        Raises:
            UnknownSessionError: There is no such session.
        """
        check_session_id(session_id)

        def remove(connection: psycopg.Connection[Any]) -> None:
            with connection.transaction():
                cursor = connection.execute(
                    "DELETE FROM littleghost_sessions WHERE id = %s", (session_id,)
                )
                if cursor.rowcount == 0:
                    raise UnknownSessionError(
                        f"no session {session_id!r} to delete", session_id=session_id
                    )
                connection.execute(
                    "DELETE FROM littleghost_messages WHERE session_id = %s", (session_id,)
                )

        await self._call(remove)

    def lock(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """Hold the session exclusively, across processes, while the context is open.

        Runs of this process queue on an in-process lock first, so each waiting session
        costs at most one connection per process.
        """
        check_session_id(session_id)
        return self._hold(session_id)

    @asynccontextmanager
    async def _hold(self, session_id: str) -> AsyncIterator[None]:
        async with self._locks.hold(session_id):
            connection = await anyio.to_thread.run_sync(self._guarded, self._connect)
            try:
                waiter = _Waiter(connection)
                try:
                    await anyio.to_thread.run_sync(
                        self._guarded,
                        lambda: waiter.run("SELECT pg_advisory_lock(%s)", (_lock_key(session_id),)),
                        abandon_on_cancel=True,
                        limiter=anyio.CapacityLimiter(1),
                    )
                except anyio.get_cancelled_exc_class():
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(waiter.interrupt)
                    raise
                yield
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(connection.close)

    def _connect(self) -> psycopg.Connection[Any]:
        return self._psycopg.connect(self._conninfo, autocommit=True)

    def _guarded(self, work: Callable[[], T]) -> T:
        try:
            return work()
        except self._psycopg.Error as error:
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise SessionStoreError(
                f"PostgreSQL session store failed: {type(error).__name__}: {first_line}"
            ) from error

    async def _call(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        return await anyio.to_thread.run_sync(self._guarded, lambda: self._run(work))

    def _run(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        with self._pool.connection() as connection:
            if not self._ready:
                self._prepare(connection)
                self._ready = True
            return work(connection)

    def _prepare(self, connection: psycopg.Connection[Any]) -> None:
        """Check the tables are a littleghost store of a known schema; make them if absent."""
        with connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            found = connection.execute(
                "SELECT to_regclass(%s), to_regclass(%s), to_regclass(%s)", _TABLES
            ).fetchone()
            assert found is not None
            present = [name for name, oid in zip(_TABLES, found, strict=True) if oid is not None]
            if not present:
                for statement in _SCHEMA:
                    connection.execute(statement)
                connection.execute(
                    "INSERT INTO littleghost_meta (key, value) VALUES (%s, %s), (%s, %s)",
                    ("format", STORE_FORMAT, "schema_version", str(SCHEMA_VERSION)),
                )
                return
            if "littleghost_meta" not in present:
                raise CorruptSessionStoreError(
                    "the PostgreSQL schema has littleghost tables but no littleghost_meta table"
                )
            meta = dict(connection.execute("SELECT key, value FROM littleghost_meta").fetchall())
            check_schema(meta, "the PostgreSQL session store")
            if len(present) < len(_TABLES):
                raise CorruptSessionStoreError(
                    "the PostgreSQL session store is missing littleghost tables"
                )
