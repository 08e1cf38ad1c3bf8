"""``PostgresSessionStore``: sessions in PostgreSQL, shared by many workers (psycopg 3).

psycopg's sync API runs in worker threads (``anyio.to_thread``), so the store works
under asyncio and trio alike. A run holds its session through a session-level advisory
lock on a connection of its own; the lock goes with the connection, so a worker that
dies frees its sessions.

No call waits past its caller's deadline: connecting has a timeout, server-side waits of
a transaction end at the deadline (``statement_timeout``, so the transaction rolls back),
and a caller that stops waiting leaves its worker thread behind after shutting the
thread's socket down: the thread's blocking I/O fails at once, and the thread closes the
connection, which is never used again. A connection still being opened is left to its
``connect_timeout``; it has written nothing. The store's threads are its own (not
anyio's default limiter's), and a session's connection is closed without waiting.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import select
import socket
import threading
import traceback
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    asynccontextmanager,
    contextmanager,
    nullcontext,
)
from datetime import datetime, timezone
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from littleghost._validators import is_number, safe_repr
from littleghost.cleanup import close_leaving
from littleghost.context.index import forget_recent_logs
from littleghost.errors import (
    ConfigurationError,
    CorruptSessionStoreError,
    SessionStoreError,
    UnknownSessionError,
    UnstorableValueError,
)
from littleghost.messages import Message
from littleghost.sessions import alarms
from littleghost.sessions.base import (
    SCHEMA_VERSION,
    STORE_FORMAT,
    SessionStats,
    StoredMessage,
    StoredPage,
    changed_under_holder,
    check_page,
    check_schema,
    check_session_id,
    decoded_off_loop,
    length_error,
    page_bounds,
    read_log,
    thread_limiter,
)
from littleghost.sessions.codec import (
    SUMMARY_FLAG,
    SUMMARY_PATHS,
    messages_to_json,
)
from littleghost.sessions.forks import reset_in_child
from littleghost.sessions.locks import SessionLocks, TimeLeft, acquire, shared_locks
from littleghost.sessions.schemes import is_postgres, lowercase_fault, url_scheme

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresSessionStore", "check_conninfo"]

T = TypeVar("T")

_SCHEMA = (
    "CREATE TABLE littleghost_meta (key text PRIMARY KEY, value text NOT NULL)",
    "CREATE TABLE littleghost_sessions (id text PRIMARY KEY, length bigint NOT NULL,"
    " created bigint GENERATED ALWAYS AS IDENTITY)",
    "CREATE TABLE littleghost_messages (session_id text NOT NULL, position bigint NOT NULL,"
    " body text NOT NULL, stored_at timestamptz DEFAULT now(),"
    " PRIMARY KEY (session_id, position))",
)
"""The tables of a new store. ``stored_at`` (the appending transaction's start, filled in
by PostgreSQL) is optional: tables made before it existed are read without times."""
_ESCAPE = r"\\u[0-9a-fA-F]{4}"
_HARMLESS_ESCAPE = r"\\u0020"
"""PostgreSQL parses JSON only when it can decode every ``\\u`` escape (not ``\\u0000``,
a lone surrogate, or a character outside the server's encoding): stored JSON is read
with each escape made a space (no key that matters has one)."""
_TABLES = ("littleghost_meta", "littleghost_sessions", "littleghost_messages")
_POLL = 0.05
"""Seconds a worker thread waits for a free connection between checks that it is wanted."""
_SHORTEST_CONNECT_TIMEOUT = 2
"""libpq's: a shorter ``connect_timeout`` counts as 2 seconds."""


_LONGEST_BODY = 1_000_000_000
"""The most characters of a message's stored JSON (SQLite's longest text by default):
PostgreSQL takes no value of 1 GiB or more, and ends the connection that sends one."""
_LONGEST_TIMEOUT_MS = 2_147_483_647
"""PostgreSQL's longest ``statement_timeout`` (about 24.8 days)."""


def _milliseconds(seconds: float) -> str:
    """A ``statement_timeout`` value: at least 1 ms (0 would mean none); none ("0") for
    a time longer than PostgreSQL's longest, or an endless one."""
    if seconds * 1000 > _LONGEST_TIMEOUT_MS:
        return "0"
    return str(max(1, math.ceil(seconds * 1000)))


def _gone() -> SessionStoreError:
    """Ends a worker thread whose caller stopped waiting (nobody sees it)."""
    return SessionStoreError("PostgreSQL session store: the caller stopped waiting")


def _duplicate(connection: psycopg.Connection[Any]) -> socket.socket:
    """A socket object of its own on ``connection``'s socket (through ``socket.dup``: on
    Windows a socket is no file descriptor, and ``os.dup`` cannot copy it)."""
    return socket.socket(fileno=socket.dup(connection.fileno()))


def _close_now(connection: psycopg.Connection[Any]) -> None:
    """Close ``connection`` without waiting for the server: its socket is shut down
    first (through a duplicate of its descriptor), so what closing sends cannot block.
    The server ends the session, and frees its advisory locks, when it sees the end."""
    if not (connection.closed or connection.broken):  # a broken one has no socket left
        try:
            with _duplicate(connection) as duplicate:
                duplicate.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    connection.close()


def _leave_in_child(opened: psycopg.Connection[Any] | socket.socket) -> None:
    """In a process ``fork()`` made (a process pool's worker, say), put ``/dev/null`` in
    place of the socket of ``opened``, a parent's connection (or a call's duplicate of
    its socket): the child keeps none of the parent's server sessions, nor the session
    locks they hold, alive once the parent dies, and never talks on them (a kept one
    reads as ended and is replaced)."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, opened.fileno(), inheritable=False)
    except Exception:  # closed already: no socket to leave
        pass
    finally:
        os.close(null)


_SOCKETS = reset_in_child(_leave_in_child)
"""The connections the stores of this process opened, and the duplicates of their
sockets ``_Operation.attach`` made."""

_QUOTED = re.compile(r'"[^"]*"')


def check_conninfo(conninfo: object) -> str:
    """``conninfo`` if libpq can take it whole: a str, not empty or blank (libpq's
    defaults: a variable left unset, most likely), without NUL characters (libpq would
    end it at the first one) that UTF-8 can encode (an undecodable byte from the command
    line cannot be sent), a URL without a bare ``@`` in its password (``_bare_at``) and,
    with psycopg installed, that libpq can parse. The error never quotes it: it may hold
    a password.

    Raises:
        ConfigurationError: It is not such a str.
    """
    if not isinstance(conninfo, str):
        raise ConfigurationError(
            f"PostgresSessionStore: conninfo must be a str, not {type(conninfo).__name__}"
        )
    if not conninfo.strip():
        raise ConfigurationError(
            f"PostgresSessionStore: conninfo is {'blank' if conninfo else 'empty'}, with which "
            "libpq would connect wherever its PG* environment variables and defaults lead "
            "(an environment variable unset or blank?); give a connection string, or "
            "'postgresql://' for libpq's defaults on purpose"
        )
    nul = conninfo.find("\x00")
    if nul >= 0:
        raise ConfigurationError(f"PostgresSessionStore: conninfo holds a NUL character (at {nul})")
    try:
        conninfo.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ConfigurationError(
            f"PostgresSessionStore: conninfo is not encodable as UTF-8 (an undecodable byte "
            f"at {error.start})"
        ) from None
    _check_scheme(conninfo)
    if _bare_at(conninfo):
        raise ConfigurationError(
            "PostgresSessionStore: the connection URL's password holds a bare '@': write "
            "it as %40 (libpq would take the rest of the password for the host, and look "
            "it up)"
        )
    try:
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:  # the store says so as it is made
        return conninfo
    try:
        conninfo_to_dict(conninfo)
    except ProgrammingError as error:
        unparsable = _unparsable(error)
    else:
        return conninfo
    # raised here, out of the except block, so that libpq's error, which quotes the part
    # it could not parse, is not even its suppressed __context__
    sqlite = "; an SQLite file goes to SQLiteSessionStore(path)"
    hint = sqlite if conninfo[:7].lower() == "sqlite:" else ""
    raise ConfigurationError(f"PostgresSessionStore: {unparsable}{hint}")


def _check_scheme(conninfo: str) -> None:
    """Refuse a URL of another scheme (``mysql://``) or one libpq reads only in lowercase
    (``POSTGRESQL://``), naming the scheme alone (the rest may hold a password); an
    ``sqlite:`` one is said as libpq fails to parse it.

    Raises:
        ConfigurationError: ``conninfo`` is such a URL.
    """
    scheme = url_scheme(conninfo, slashes=True)
    if scheme is None or scheme.lower() == "sqlite":
        return
    why = lowercase_fault(scheme)
    if why is None and not is_postgres(scheme):
        why = f"{scheme}:// is not a PostgreSQL URL (postgresql://... or a conninfo)"
    if why is not None:
        raise ConfigurationError(f"PostgresSessionStore: {why}")


def _unparsable(error: Exception) -> str:
    """What is wrong with a connection string libpq cannot parse, without the parts of it
    libpq quotes in its message (they may be the password)."""
    text = str(error).strip()
    reason = _QUOTED.sub(_hidden, text.splitlines()[0]) if text else type(error).__name__
    return f"the connection string is not a valid PostgreSQL URL or conninfo ({reason})"


def _malformed(error: Exception) -> SessionStoreError:
    """The error for a connection string libpq could not parse as it connected."""
    return SessionStoreError(f"PostgreSQL session store: {_unparsable(error)}")


def _bare_at(conninfo: str) -> bool:
    """Whether a URL's password holds a bare ``@``: libpq ends the password at the first
    one and takes the rest for the host, which it looks up (a DNS query) and its errors
    and psycopg's DEBUG logs quote."""
    _, scheme, rest = conninfo.partition("://")
    password = rest.split("/", 1)[0].rpartition("@")[0].partition(":")[2]
    return bool(scheme) and "@" in password


def _hidden(quoted: re.Match[str]) -> str:
    """A quoted part of a libpq message as ``"…"``, but the punctuation it expects."""
    return quoted[0] if quoted[0] in ('"="', '"]"') else '"…"'


def _first_line(error: Exception) -> str:
    """The first line of a driver's message (``""`` when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def _in_doubt(where: str, error: Exception) -> SessionStoreError:
    """The error for a connection lost once a commit was sent: the write may have landed."""
    return SessionStoreError(
        f"{where}: the connection was lost while committing, so the write may have been "
        f"stored or not ({type(error).__name__}: {_first_line(error)})"
    )


def _utc(moment: datetime | None) -> datetime | None:
    return None if moment is None else moment.astimezone(timezone.utc)


_SESSION_LOCK = "SELECT pg_advisory_lock(hashtextextended(quote_ident(%s) || '.' || %s, 0))"
"""Takes the advisory lock of a session (the key made on the server from the schema that
holds the tables and the session id: one key space per schema)."""
_CHECK_CLIENT = "SET client_connection_check_interval = 500"
"""Has the server look for a closed client connection every 0.5 s while a session's lock
is awaited: a waiter that stops waiting (cancelled, or its process killed) leaves no
backend queued for the lock, holding a connection slot, until the holder lets go."""
_CHECKS_CLIENT = 140_000
"""The first server version with ``client_connection_check_interval`` (PostgreSQL 14)."""
_OWN_SETTINGS = (
    # a server's would cut a wait for a session short
    ("lock_timeout", "0", 0),
    # a write reads the session after taking its write lock: it sees the writes before
    ("default_transaction_isolation", "read committed", 0),
    # the only DateStyle psycopg reads a time zone in
    ("datestyle", "ISO", 0),
    # quote_ident would quote every schema name, changing the sessions' lock keys
    ("quote_all_identifiers", "off", 0),
    # would end a held session's connection, idle while its run works (PostgreSQL 14+)
    ("idle_session_timeout", "0", 140_000),
    # bounds a single statement too, a wait for a session among them (PostgreSQL 17+)
    ("transaction_timeout", "0", 170_000),
)
"""What the store's connections set for themselves, whatever a role or database sets:
each setting's name, value, and the first server version that has it."""
_TCP_SETTINGS = (
    ("tcp_keepalives_idle", "keepalives_idle", "10", 0),
    ("tcp_keepalives_interval", "keepalives_interval", "5", 0),
    ("tcp_keepalives_count", "keepalives_count", "3", 0),
    ("tcp_user_timeout", "tcp_user_timeout", "30000", 120_000),
)
"""TCP keepalives on both ends of the store's connections: each as the server's setting,
libpq's parameter, the value, and the first version (of the server, and of libpq alike)
that has it.

The server's end is set where nothing else did (the setting's ``reset_val`` is ``0``, the
system's default; ``current_setting`` shows the system's value instead, 7200 for an idle
time on Linux), as ``_OWN_SETTINGS``: the server finds a worker whose machine went without
a word (power lost, cut off the network) gone, and frees its sessions, about 30 s after
its last packet (Linux ends a connection whose probes go unanswered at its
``tcp_user_timeout``, whatever the count), not Linux's 2 h 11 min for an idle connection
(15 min for one whose last answer was never acknowledged). This end is set unless the
conninfo sets it: a kept connection to a server gone so (a failover's old primary, cut
off) is found gone as soon, and not used (a call waited on it for its whole patience).
A Unix socket's peer cannot vanish so: there they do nothing."""
_WRITE_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(quote_ident(%s) || '.' || %s, 1))"
"""Takes the write lock of a session (its key made as the session lock's, with seed 1)
until the transaction ends: each write of a session holds it, and a new holder takes it
once before it loads, so a write whose caller stopped waiting, which may still commit
after its holder let the session go, has landed or gone by then."""
_SCHEMA_LOCK = (0x6C67686F, 1)
"""The two-key advisory lock held while checking or making the tables: PostgreSQL keeps
two-key locks apart from the one-key locks of sessions, so no session id can meet it."""


def _digest(body: str) -> str:
    """The SHA-256 of a stored body's UTF-8 text, in hex, as the server computes it in
    ``_append_statement`` (a holder's fence sends it, not the body: it may be 1 GB)."""
    return hashlib.sha256(body.encode()).hexdigest()


def _append_statement(seen: int | None) -> str:
    """The statement that adds ``%(added)s`` to a session's length and returns the new
    length: only while the session holds the ``seen`` messages its holder last saw, the
    last stored with the ``_digest`` ``%(last)s`` (no row otherwise); any length when
    ``seen`` is ``None`` (not held, or not yet loaded)."""
    if seen:
        return (
            "UPDATE littleghost_sessions SET length = length + %(added)s"
            " WHERE id = %(id)s AND length = %(seen)s AND (SELECT"
            " encode(sha256(convert_to(body, 'UTF8')), 'hex') FROM littleghost_messages"
            " WHERE session_id = %(id)s AND position = %(seen)s - 1) = %(last)s"
            " RETURNING length"
        )
    return (
        "INSERT INTO littleghost_sessions (id, length) VALUES (%(id)s, %(added)s)"
        " ON CONFLICT (id) DO UPDATE SET length = littleghost_sessions.length + EXCLUDED.length"
        + ("" if seen is None else " WHERE littleghost_sessions.length = 0")
        + " RETURNING length"
    )


def _check_lengths(bodies: Sequence[str], session_id: str) -> None:
    """Refuse an append whose message's JSON is longer than ``_LONGEST_BODY``.

    Raises:
        UnstorableValueError: One is; it names the first.
    """
    for position, body in enumerate(bodies):
        if len(body) > _LONGEST_BODY:
            raise UnstorableValueError(
                f"message {position} of the append is {len(body):,} characters long as JSON; "
                f"the PostgreSQL session store keeps at most {_LONGEST_BODY:,}; nothing was "
                "stored",
                session_id=session_id,
            )


def _stale(connection: psycopg.Connection[Any]) -> bool:
    """An idle connection the server ended (or wrote to, which it never does unasked):
    its socket has something to read, or psycopg already knows it is gone."""
    if connection.closed or connection.broken:
        return True
    try:
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(connection.fileno(), select.POLLIN)
            return bool(poller.poll(0))
        return bool(select.select([connection.fileno()], [], [], 0)[0])
    except (OSError, ValueError):
        return True


class _Operation:
    """One call's work in a worker thread, which its caller may stop waiting for.

    The thread attaches the connection it uses. A caller that stops waiting calls
    ``abandon``, which shuts the attached connection's socket down (through a duplicate
    of its descriptor, so a descriptor number that libpq closed and the process reused
    is never touched): the thread's blocking I/O fails at once, and the thread closes
    the connection. Nothing else opens, uses or closes a connection from another thread.
    """

    def __init__(self, time_left: TimeLeft) -> None:
        self.time_left = time_left
        self._guard = threading.Lock()
        self._socket: socket.socket | None = None
        self._abandoned = False
        self._delivered: psycopg.Connection[Any] | None = None
        self.committing = False
        """A commit was sent: the work may have landed, so it is never tried again."""

    @property
    def abandoned(self) -> bool:
        """The caller stopped waiting."""
        return self._abandoned

    def attach(self, connection: psycopg.Connection[Any]) -> None:
        """Make ``connection`` the one ``abandon`` shuts down.

        Raises:
            SessionStoreError: The caller already stopped waiting; the caller of
                ``attach`` still owns (and closes) the connection.
        """
        duplicate = _duplicate(connection)
        _SOCKETS.add(duplicate)
        with self._guard:
            if not self._abandoned:
                self._socket = duplicate
                return
        duplicate.close()
        raise _gone()

    def detach(self) -> bool:
        """Let go of the attached connection; ``False`` when the caller stopped waiting
        (then the connection may be broken and must be closed)."""
        with self._guard:
            duplicate, self._socket = self._socket, None
            wanted = not self._abandoned
        if duplicate is not None:
            duplicate.close()
        return wanted

    def deliver(self, connection: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        """Hand the thread's last connection, detached, over to the caller: ``abandon``
        closes it if the caller stops waiting before it gets it.

        Raises:
            SessionStoreError: The caller already stopped waiting; the connection was
                closed.
        """
        with self._guard:
            duplicate, self._socket = self._socket, None
            wanted = not self._abandoned
            if wanted:
                self._delivered = connection
        if duplicate is not None:
            duplicate.close()
        if not wanted:
            connection.close()
            raise _gone()
        return connection

    def abandon(self) -> None:
        """Stop waiting: end the thread's I/O on the attached connection, or close the
        connection it delivered (never blocks)."""
        with self._guard:
            self._abandoned = True
            if self._socket is not None:
                try:
                    self._socket.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            delivered, self._delivered = self._delivered, None
        if delivered is not None:
            _close_now(delivered)


class _Pool:
    """At most ``size`` connections for short operations, kept open between them."""

    def __init__(self, connect: Callable[[_Operation], psycopg.Connection[Any]], size: int) -> None:
        self._connect = connect
        self._size = size
        self._slots = threading.BoundedSemaphore(size)
        self._guard = threading.Lock()
        self._idle: list[psycopg.Connection[Any]] = []
        self._closings = 0
        """How many times the pool was closed: a connection taken before the last time
        is closed, not kept, as its call ends."""
        # kept connections of a store never closed are closed as it is collected, or at exit
        weakref.finalize(self, _close_all, self._idle)
        _POOLS.add(self)

    def _forget_in_child(self) -> None:
        """In a process ``fork()`` made: the parent's calls in flight, whose threads are
        not in it, hold no slot."""
        self._slots = threading.BoundedSemaphore(self._size)
        self._guard = threading.Lock()

    @contextmanager
    def connection(
        self, operation: _Operation, *, fresh: bool = False
    ) -> Iterator[tuple[psycopg.Connection[Any], bool]]:
        """A connection attached to ``operation``, and whether it was kept from an earlier
        operation (never when ``fresh``); back to the pool afterwards only when it is
        sound, idle, its caller still waits, and the pool was not closed meanwhile. Kept
        connections the server ended are closed, not handed out."""
        from psycopg.pq import TransactionStatus

        while not self._slots.acquire(timeout=_POLL):
            if operation.abandoned:
                raise _gone()
        try:
            connection = None
            with self._guard:
                closings = self._closings
            while connection is None and not fresh:
                with self._guard:
                    if not self._idle:
                        break
                    connection = self._idle.pop()
                if _stale(connection):
                    connection.close()
                    connection = None
            reused = connection is not None
            if connection is None:
                connection = self._connect(operation)
            else:
                try:
                    operation.attach(connection)
                except BaseException:
                    connection.close()
                    raise
            try:
                yield connection, reused
            finally:
                wanted = operation.detach()
                reusable = (
                    wanted
                    and not connection.broken
                    and connection.info.transaction_status == TransactionStatus.IDLE
                )
                kept = False
                if reusable:
                    with self._guard:
                        kept = self._closings == closings
                        if kept:
                            self._idle.append(connection)
                if not kept:
                    connection.close()
        finally:
            self._slots.release()

    def close(self) -> None:
        """Close the kept connections now, and those in use as their calls end."""
        with self._guard:
            self._closings += 1
            idle = self._idle.copy()
            self._idle.clear()
        _close_all(idle)


def _close_all(idle: list[psycopg.Connection[Any]]) -> None:
    """Close a pool's kept connections (psycopg reports one left to the garbage collector
    as a ``ResourceWarning``)."""
    while idle:
        idle.pop().close()


_POOLS = reset_in_child(_Pool._forget_in_child)
"""The stores' pools: in a process ``fork()`` made, the parent's calls in flight hold no
slot."""


class _SessionSlots:
    """At most ``size`` sessions held at once, each on a connection of its own; a holder
    past them waits, in arrival order within an event loop."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._forget_in_child()
        _SESSION_SLOTS.add(self)

    def _forget_in_child(self) -> None:
        """In a process ``fork()`` made: the parent's holders hold no slot."""
        self._slots = threading.BoundedSemaphore(self._size)

    @asynccontextmanager
    async def taken(self) -> AsyncIterator[None]:
        """A slot while the context is open (waiting for one is cancellable)."""
        queue, borrower = thread_limiter(self, self._size), object()
        await queue.acquire_on_behalf_of(borrower)
        try:
            slots = self._slots
            await acquire(slots)
            try:
                yield
            finally:
                slots.release()
        finally:
            queue.release_on_behalf_of(borrower)


_SESSION_SLOTS = reset_in_child(_SessionSlots._forget_in_child)
"""The stores' session slots: in a process ``fork()`` made, the parent's holders hold
none."""


class PostgresSessionStore:
    """Sessions in PostgreSQL, for deployments with many workers on many machines.

    The tables (``littleghost_meta``, ``littleghost_sessions``, ``littleghost_messages``)
    are created on first use in the connection's current schema (choose one with
    ``options=-csearch_path=...`` in the connection string). Each ``append`` is one
    transaction. A run holds its session with a PostgreSQL advisory lock, keyed
    ``hashtextextended(quote_ident(schema) || '.' || session_id, 0)``, so runs of one
    session are serialized across every process that uses the schema; the wait is
    cancellable and counts against the waiting run's deadline. Each write of a session (an
    append, a delete) holds the advisory lock of the same text with seed ``1`` until it
    ends, and a run that takes the session waits for that lock before it loads (a write
    its caller stopped waiting for may still commit). Every store object of the schema in
    a process shares one in-process lock table, so a run started inside a run of its own
    session raises ``SessionBusyError`` whichever store object it goes through. An
    append of a session's holder is refused, with nothing written, once the session no
    longer holds the messages the holder last saw (its lock connection was lost and another
    worker ran the session, or it was deleted meanwhile).

    The server frees the sessions of a worker whose machine went without a word (power
    lost, cut off the network) within about 30 s: the store's connections set TCP
    keepalives and ``tcp_user_timeout`` where nothing else set them, on both ends (a kept
    connection to a server gone so is found gone, and not used).

    A kept connection the server ended while idle (a restart, failover or idle timeout)
    is replaced when next taken; one that fails on first use is replaced and the call
    tried once more, unless a commit had been sent (a write is never made twice). Tables
    dropped while the store is open are made anew by the call after the one that found
    them gone, as a new process would.

    No call waits past the caller's deadline (``anyio.current_effective_deadline()``):
    a write still waiting on the server then is rolled back, and a caller cancelled
    while the server does not answer stops waiting at once (that connection is closed,
    never reused).

    Args:
        conninfo: A libpq connection string or URI; one libpq cannot parse is an error
            as the store is made.
        max_connections: Connections kept for short operations (> 0); each running
            session holds one more while it runs.
        max_sessions: Sessions held at once (> 0), each by a run on a connection of its
            own, so that the store opens at most ``max_connections + max_sessions``
            connections; a run past them waits (in arrival order within an event loop),
            the wait counting against its deadline. A run started inside a run of the
            store (from a tool), or by the reader of a stream of one, takes none, as it
            would wait for its own. ``None``: no bound (a spike of runs opens a
            connection each, and a run whose connection the server refuses fails).
        connect_timeout: Seconds to wait for a new connection (> 0; libpq waits at
            least 2 s and rounds up to whole seconds); overrides ``connect_timeout``
            in ``conninfo``.
        statement_timeout: Seconds the server may spend on one statement of a load,
            append or delete (> 0); waiting for a session held by another run is
            bounded by the waiting run's deadline instead. A call the server stops
            answering is given up after twice ``connect_timeout`` and this.
        read_only: Read an existing store only: every transaction is read-only on the
            server (``default_transaction_read_only``), missing tables are an error
            instead of being made, and ``append``, ``delete`` and ``lock`` raise
            ``SessionStoreError``.

    Raises:
        ConfigurationError: psycopg 3 is not installed, or an argument is invalid.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        max_connections: int = 10,
        max_sessions: int | None = None,
        connect_timeout: float = 10.0,
        statement_timeout: float = 30.0,
        read_only: bool = False,
    ) -> None:
        try:
            import psycopg
        except ImportError:
            raise ConfigurationError(
                "PostgresSessionStore needs psycopg 3: pip install 'littleghost[postgres]'"
            ) from None
        check_conninfo(conninfo)
        if (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise ConfigurationError(
                "PostgresSessionStore: max_connections must be an int >= 1, "
                f"not {safe_repr(max_connections)}"
            )
        if max_sessions is not None and (
            isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1
        ):
            raise ConfigurationError(
                "PostgresSessionStore: max_sessions must be an int >= 1 or None, "
                f"not {safe_repr(max_sessions)}"
            )
        for name, value in (
            ("connect_timeout", connect_timeout),
            ("statement_timeout", statement_timeout),
        ):
            if not (is_number(value) and value > 0):
                raise ConfigurationError(
                    f"PostgresSessionStore: {name} must be finite seconds > 0, "
                    f"not {safe_repr(value)}"
                )
        if not isinstance(read_only, bool):
            raise ConfigurationError(
                f"PostgresSessionStore: read_only must be True or False, not {safe_repr(read_only)}"
            )
        self._psycopg = psycopg
        self._conninfo = conninfo
        self._connect_timeout = float(connect_timeout)
        self._statement_timeout = float(statement_timeout)
        self._max_connections = max_connections
        self._read_only = read_only
        self._pool = _Pool(self._pooled, max_connections)
        self._sessions = None if max_sessions is None else _SessionSlots(max_sessions)
        self._ready = False
        self._stored_at = "NULL"
        """What a query selects for a message's time: ``stored_at``, or ``NULL`` in tables
        made before it existed (known once the tables are checked)."""
        self._schema = ""
        """The schema that holds the tables (known once they are checked)."""
        self._where = "PostgreSQL session store"
        """The store in error messages (its database and schema, once known)."""
        self._locks: SessionLocks | None = None
        """The lock table shared by the store objects of the schema (known once the
        tables are checked)."""

    def __repr__(self) -> str:
        if self._read_only:
            return "PostgresSessionStore(..., read_only=True)"
        return "PostgresSessionStore(...)"

    async def __aenter__(self) -> PostgresSessionStore:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        """``aclose()``; when the block is leaving by an exception, a close failure is
        logged and that exception goes on."""
        await close_leaving(self.aclose, "closing the PostgreSQL store", error)

    async def aclose(self) -> None:
        """Close the idle connections, and those of calls under way as they end (a later
        call opens new ones), in a worker thread of its own: the store's own may all be
        taken by calls waiting on the server."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._pool.close, limiter=anyio.CapacityLimiter(1))

    async def load(self, session_id: str) -> tuple[Message, ...]:
        """The session's messages in append order; ``()`` for an unknown session."""
        return tuple(stored.message for stored in (await self._read(session_id, None))[0])

    async def load_stored(self, session_id: str) -> tuple[StoredMessage, ...]:
        """The session's messages in append order, each with the time it was stored
        (``None`` in tables made before stores recorded times); ``()`` for an unknown
        session."""
        return tuple((await self._read(session_id, _utc))[0])

    async def load_page(self, session_id: str, start: int, limit: int) -> StoredPage:
        """The messages at positions ``start`` to ``start + limit - 1`` of the session's
        log (fewer at its end), each with the time it was stored, and the log's length
        then (0 for an unknown session), in one statement."""
        page = check_page(start, limit)
        log, length = await self._read(session_id, _utc, page)
        return StoredPage(tuple(log), length)

    async def _read(
        self,
        session_id: str,
        when: Callable[[Any], datetime | None] | None,
        page: tuple[int, int] | None = None,
    ) -> tuple[list[StoredMessage], int]:
        """The session's log (or its ``page``: ``start``, ``limit``) and its length, its
        times read by ``when``, in one statement (one snapshot)."""
        session_id = check_session_id(session_id, stored=True)
        start, stop = page_bounds(page)
        locks = await self._prepared()
        async with locks.writing(session_id):  # a holder's read is not older than its writes
            rows = await self._call(
                lambda connection, operation: connection.execute(
                    f"SELECT s.length, position, body, {self._stored_at}"
                    " FROM (SELECT %s::text AS id) AS k"
                    " LEFT JOIN littleghost_sessions AS s ON s.id = k.id"
                    " LEFT JOIN littleghost_messages ON session_id = k.id"
                    " AND position >= %s AND position < %s ORDER BY position",
                    (session_id, start, stop),
                ).fetchall()
            )
            # decoded in a worker thread (not on the event loop), once the pooled
            # connection is back for other calls
            last = rows[-1][2] if page is None and locks.held(session_id) else None
            log, digest = await decoded_off_loop(
                lambda stopped: (
                    read_log(rows, session_id, self._where, when, stopped, page),
                    None if last is None else _digest(str(last)),
                )
            )
            if page is None:  # what a holder saw: the whole log
                locks.saw(session_id, len(log), digest)
        return log, int(rows[0][0] or 0)

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        """Append ``messages`` to the session in one transaction.

        Raises:
            UnstorableValueError: A message holds a value that is not JSON-like, or is
                longer than 1,000,000,000 characters as JSON; nothing was stored.
            SessionStoreError: The current task holds the session, which no longer holds
                the messages it last saw; nothing was stored.
        """
        session_id = check_session_id(session_id)
        self._check_writable()
        bodies = messages_to_json(messages, session_id=session_id)
        if not bodies:
            return
        _check_lengths(bodies, session_id)
        locks = await self._prepared()
        async with locks.writing(session_id) as hold:
            seen, last = (None, None) if hold is None else (hold.seen, hold.last)

            def write(
                connection: psycopg.Connection[Any], operation: _Operation
            ) -> tuple[int, str | None]:
                # for a holder's next append; in the worker thread (it may be 1 GB)
                last_digest = None if hold is None else _digest(bodies[-1])
                with self._transaction(connection, operation):
                    connection.execute(_WRITE_LOCK, (self._schema, session_id))
                    row = connection.execute(
                        _append_statement(seen),
                        {"id": session_id, "added": len(bodies), "seen": seen, "last": last},
                    ).fetchone()
                    if row is None:
                        assert seen is not None
                        found = connection.execute(
                            "SELECT length FROM littleghost_sessions WHERE id = %s", (session_id,)
                        ).fetchone()
                        raise changed_under_holder(
                            self._where, session_id, seen, 0 if found is None else int(found[0])
                        )
                    start = int(row[0]) - len(bodies)
                    try:
                        # one statement each, not psycopg's executemany: its pipeline,
                        # shut down by a caller that stopped waiting, logs a warning
                        for index, body in enumerate(bodies):
                            connection.execute(
                                "INSERT INTO littleghost_messages (session_id, position, body) "
                                "VALUES (%s, %s, %s)",
                                (session_id, start + index, body),
                            )
                    except self._psycopg.errors.UniqueViolation as error:
                        raise length_error(self._where, session_id, start) from error
                    return start + len(bodies), last_digest

            locks.saw(session_id, *await self._call(write))

    async def list_sessions(self) -> tuple[str, ...]:
        """The ids of the stored sessions, oldest first."""
        rows = await self._call(
            lambda connection, operation: connection.execute(
                "SELECT id FROM littleghost_sessions ORDER BY created"
            ).fetchall()
        )
        return tuple(session_id for (session_id,) in rows)

    async def session_stats(self) -> tuple[SessionStats, ...]:
        """Each session's message and summary counts and last activity, oldest first
        (one query; the logs stay in the database)."""
        parsed = "regexp_replace(body, %(escape)s, %(harmless)s, 'g')::json"
        rows = await self._call(
            lambda connection, operation: connection.execute(
                "SELECT s.id, coalesce(m.messages, 0), coalesce(m.summaries, 0), m.last"
                " FROM littleghost_sessions AS s LEFT JOIN (SELECT session_id,"
                " count(*) AS messages, count(CASE WHEN strpos(body, %(flag)s) = 0 THEN NULL"
                f" WHEN coalesce({parsed} #> %(plain)s, {parsed} #> %(wrapped)s)::text = 'true'"
                f" THEN 1 END) AS summaries, max({self._stored_at})"
                " AS last FROM littleghost_messages GROUP BY session_id) AS m"
                " ON m.session_id = s.id ORDER BY s.created",
                {
                    "flag": SUMMARY_FLAG,
                    "escape": _ESCAPE,
                    "harmless": _HARMLESS_ESCAPE,
                    "plain": list(SUMMARY_PATHS[0]),
                    "wrapped": list(SUMMARY_PATHS[1]),
                },
            ).fetchall()
        )
        return tuple(
            SessionStats(session_id, messages, summaries, _utc(last))
            for session_id, messages, summaries, last in rows
        )

    async def delete(self, session_id: str) -> None:
        """Remove the session and its messages in one transaction; the context engine
        forgets the logs it was given lately (``forget_recent_logs``).

        Raises:
            UnknownSessionError: There is no such session.
        """
        session_id = check_session_id(session_id, stored=True)
        self._check_writable()

        def remove(connection: psycopg.Connection[Any], operation: _Operation) -> None:
            with self._transaction(connection, operation):
                connection.execute(_WRITE_LOCK, (self._schema, session_id))
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

        try:
            await self._call(remove)
        finally:
            forget_recent_logs()

    def lock(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """Hold the session exclusively, across processes, while the context is open.

        Runs of this process queue on an in-process lock first, so each waiting session
        costs at most one connection per process.
        """
        session_id = check_session_id(session_id, stored=True)
        self._check_writable()
        return self._hold(session_id)

    def _check_writable(self) -> None:
        if self._read_only:
            raise SessionStoreError(
                "the PostgreSQL session store is open read-only; nothing was changed"
            )

    @asynccontextmanager
    async def _hold(self, session_id: str) -> AsyncIterator[None]:
        locks = await self._prepared()
        # a run's tool holding another session, or a stream's reader, takes no slot: it
        # would wait for its own; the slot comes before the session, which such a run
        # may want
        slots = None if locks.holds_any() else self._sessions
        slot = nullcontext() if slots is None else slots.taken()
        async with slot, locks.hold(session_id):
            # A thread of its own: long waits for sessions do not starve other calls.
            connection = await self._dispatch(
                lambda operation: self._take_lock(operation, session_id),
                limiter=anyio.CapacityLimiter(1),
            )
            try:
                yield
            finally:
                _close_now(connection)

    def _take_lock(self, operation: _Operation, session_id: str) -> psycopg.Connection[Any]:
        """A new connection holding the session's advisory lock; the server-side wait
        ends at the caller's deadline (none without one)."""
        connection = self._connect(operation, _milliseconds(operation.time_left.seconds()))
        try:
            if connection.info.server_version >= _CHECKS_CLIENT:
                try:
                    connection.execute(_CHECK_CLIENT)
                except self._psycopg.errors.InvalidParameterValue:
                    pass  # a server that cannot check sockets (on Windows, say) refuses it
            connection.execute(_SESSION_LOCK, (self._schema, session_id))
            connection.execute(_WRITE_LOCK, (self._schema, session_id))  # held and let go
        except BaseException:
            operation.detach()
            connection.close()
            raise
        return operation.deliver(connection)

    def _pooled(self, operation: _Operation) -> psycopg.Connection[Any]:
        return self._connect(operation, _milliseconds(self._statement_timeout))

    def _connect(self, operation: _Operation, statement_timeout: str) -> psycopg.Connection[Any]:
        """A new connection attached to ``operation``, with its ``statement_timeout``, the
        ``_OWN_SETTINGS`` its server has, the ``_TCP_SETTINGS`` nothing else set (on
        both ends), and read-only transactions for a read-only store.

        Opening it is bounded by ``connect_timeout`` or the time left, whichever is
        shorter (but libpq's 2 s at least); a caller that stops waiting meanwhile leaves
        the thread to finish, then close it.
        """
        seconds = operation.time_left.cap(self._connect_timeout)
        try:
            connection = self._psycopg.connect(
                self._with_client_tcp(),
                autocommit=True,
                connect_timeout=max(_SHORTEST_CONNECT_TIMEOUT, math.ceil(seconds)),
                client_encoding="utf8",  # text as str whatever the database's encoding
            )
        except self._psycopg.ProgrammingError as error:  # libpq could not parse it
            raise _malformed(error) from None  # its message may quote the password
        except self._psycopg.Error as error:
            # psycopg's error keeps the half-open connection (and its socket) in a
            # reference cycle through its traceback until the garbage collector runs.
            traceback.clear_frames(error.__traceback__)
            raise
        _SOCKETS.add(connection)
        try:
            operation.attach(connection)
            version = connection.info.server_version
            settings = [("statement_timeout", statement_timeout)]
            settings += [(name, value) for name, value, since in _OWN_SETTINGS if version >= since]
            if self._read_only:
                settings.append(("default_transaction_read_only", "on"))
            defaults = [
                (name, value) for name, _, value, since in _TCP_SETTINGS if version >= since
            ]
            connection.execute(
                # one scan of pg_settings: the names whose value at connection start is 0
                "WITH unset AS (SELECT name FROM pg_catalog.pg_settings WHERE reset_val = '0')"
                " SELECT "
                + ", ".join(
                    ["set_config(%s, %s, false)"] * len(settings)
                    + [
                        "set_config(%s, CASE WHEN %s IN (SELECT name FROM unset) THEN %s"
                        " ELSE current_setting(%s) END, false)"
                    ]
                    * len(defaults)
                ),
                [word for setting in settings for word in setting]
                + [word for name, value in defaults for word in (name, name, value, name)],
            )
        except BaseException:
            operation.detach()
            connection.close()
            raise
        return connection

    def _with_client_tcp(self) -> str:
        """The conninfo with keepalives on, and the ``_TCP_SETTINGS`` of this end libpq has,
        where it does not set them.

        Raises:
            psycopg.ProgrammingError: libpq cannot parse the conninfo.
        """
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        given, libpq = conninfo_to_dict(self._conninfo), self._psycopg.pq.version()
        wanted = {"keepalives": "1"}
        wanted.update((name, value) for _, name, value, since in _TCP_SETTINGS if libpq >= since)
        added = {name: value for name, value in wanted.items() if name not in given}
        return make_conninfo(self._conninfo, **added)

    @contextmanager
    def _transaction(
        self, connection: psycopg.Connection[Any], operation: _Operation
    ) -> Iterator[None]:
        """A transaction whose statements the server ends at the caller's deadline (so
        that it rolls back) when that comes before ``statement_timeout``.

        Its own ``BEGIN``, ``COMMIT`` and ``ROLLBACK``, not psycopg's ``transaction()``:
        that sends its rollback on a socket shut down under it (by a caller that stopped
        waiting, at once when the server ended a statement at the deadline), and logs
        the failure as the server's ("terminated abnormally")."""
        connection.execute("BEGIN")
        try:
            seconds = operation.time_left.seconds()
            if seconds < self._statement_timeout:
                connection.execute(
                    "SELECT set_config('statement_timeout', %s, true)", (_milliseconds(seconds),)
                )
            yield
        except BaseException:
            if not (operation.abandoned or connection.broken):
                try:
                    connection.execute("ROLLBACK")
                except self._psycopg.Error:
                    pass  # lost meanwhile: the server rolls back as it sees the end
            raise
        operation.committing = True
        connection.execute("COMMIT")

    def _guarded(self, work: Callable[[], T]) -> T:
        try:
            return work()
        except self._psycopg.Error as error:
            failed = f"PostgreSQL session store failed: {type(error).__name__}"
            error.args = (_first_line(error),)  # its DETAIL may quote a row: a message
            raise SessionStoreError(f"{failed}: {error.args[0]}") from error

    async def _prepared(self) -> SessionLocks:
        """The lock table of the store's schema, once its tables are checked."""
        if self._locks is None:
            await self._call(lambda connection, operation: None)
        assert self._locks is not None
        return self._locks

    async def _call(self, work: Callable[[psycopg.Connection[Any], _Operation], T]) -> T:
        """``work`` on a pooled connection, given up as at a deadline once the
        ``_patience()`` of a server that answers passed since the call got its thread (a
        wait behind the store's busy threads is no silence of the server's), timed in the
        thread, on the real clock (a test's virtual clock jumps over a thread's work); the
        pool's kept connections are closed then too."""
        patience = self._patience()
        silent = threading.Event()

        def job(operation: _Operation) -> T:
            def give_up() -> None:
                silent.set()
                operation.abandon()

            cancel = alarms.after(patience, give_up)
            try:
                return self._run(operation, work)
            finally:
                cancel()
                if silent.is_set():  # those kept with it may be silent too (a failover)
                    self._pool.close()

        try:
            return await self._dispatch(job, limiter=self._threads())
        except SessionStoreError as error:
            if not silent.is_set():
                raise
            raise SessionStoreError(
                f"{self._where} did not answer within {patience:g} s (twice connect_timeout "
                "and statement_timeout); the call was given up and its connection closed (a "
                "write whose commit was already sent may have landed)"
            ) from error

    def _patience(self) -> float:
        """How long a short call may take when the server answers: connecting and its
        statement (``statement_timeout`` bounds it on the server), twice for a retry on a
        fresh connection; past it, a server that stopped answering (a hung backend, a
        network path dropping packets) would hold the call for good."""
        return 2 * (self._connect_timeout + self._statement_timeout)

    def _threads(self) -> anyio.CapacityLimiter:
        """The store's worker threads for short operations: one per pooled connection."""
        return thread_limiter(self, self._max_connections)

    async def _dispatch(
        self, job: Callable[[_Operation], T], *, limiter: anyio.CapacityLimiter
    ) -> T:
        """Run ``job`` in a worker thread that the caller stops waiting for when it is
        cancelled (its deadline included)."""
        operation = _Operation(TimeLeft.now())
        try:
            return await anyio.to_thread.run_sync(
                self._guarded,
                lambda: job(operation),
                abandon_on_cancel=True,
                limiter=limiter,
            )
        except SessionStoreError:
            await operation.time_left.yield_to_deadline()
            raise
        except BaseException:
            operation.abandon()
            raise

    def _run(
        self,
        operation: _Operation,
        work: Callable[[psycopg.Connection[Any], _Operation], T],
    ) -> T:
        """``work`` on a pooled connection; once more on a new one when a kept connection
        turns out broken before ``work`` sent a commit (nothing of it can have landed)."""
        for fresh in (False, True):
            with self._pool.connection(operation, fresh=fresh) as (connection, reused):
                working = False  # the commit of the tables' check is no write of the caller's
                try:
                    if not self._ready:
                        self._prepare(connection, operation)
                        self._ready = True
                    operation.committing, working = False, True
                    return work(connection, operation)
                except self._psycopg.errors.UndefinedTable:
                    self._ready = False  # dropped: the next call makes them, as a new process
                    raise
                except self._psycopg.OperationalError as error:
                    if working and operation.committing and connection.broken:
                        raise _in_doubt(self._where, error) from error
                    retry = reused and connection.broken and not operation.committing
                    if operation.abandoned or not retry:
                        raise
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _prepare(self, connection: psycopg.Connection[Any], operation: _Operation) -> None:
        """Check the tables are a littleghost store of a known schema; make them if absent
        (unless read-only). Then learn where they are.

        Once more when making them finds them made: another connection made them while
        this one waited for the lock of the check, its transaction begun before that
        (PostgreSQL renews what a connection found missing as its next one begins)."""
        try:
            self._prepare_once(connection, operation)
        except self._psycopg.errors.DuplicateTable:
            if operation.abandoned or connection.broken:
                raise
            self._prepare_once(connection, operation)

    def _prepare_once(self, connection: psycopg.Connection[Any], operation: _Operation) -> None:
        """``_prepare`` in one transaction."""
        with self._transaction(connection, operation):
            self._check_tables(connection)
            found = connection.execute(
                "SELECT n.nspname, current_database()"
                " FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
                " WHERE c.oid = to_regclass(%s)",
                ("littleghost_sessions",),
            ).fetchone()
            assert found is not None
            self._schema, database = found
            self._where = (
                f"PostgreSQL session store (database {database!r}, schema {self._schema!r})"
            )
            server = self._server_identity(connection)
            self._locks = shared_locks(("postgres", server, database, self._schema))

    def _server_identity(self, connection: psycopg.Connection[Any]) -> str:
        """What tells the server apart from others, the same after a restart: its
        cluster's ``system_identifier``, or its start time where the role may not read
        that (a store object made after a restart then keeps a lock table of its own)."""
        try:
            with connection.transaction():  # a savepoint: a refusal leaves the rest
                row = connection.execute(
                    "SELECT system_identifier::text FROM pg_catalog.pg_control_system()"
                ).fetchone()
        except self._psycopg.Error:  # refused, or missing; a lost connection fails again
            row = connection.execute("SELECT pg_postmaster_start_time()::text").fetchone()
        assert row is not None
        return str(row[0])

    def _check_tables(self, connection: psycopg.Connection[Any]) -> None:
        """Check the tables are a littleghost store of a known schema; make them if absent
        (unless read-only)."""
        if not self._read_only:
            connection.execute("SELECT pg_advisory_xact_lock(%s, %s)", _SCHEMA_LOCK)
        found = connection.execute(
            "SELECT to_regclass(%s), to_regclass(%s), to_regclass(%s)", _TABLES
        ).fetchone()
        assert found is not None
        present = [name for name, oid in zip(_TABLES, found, strict=True) if oid is not None]
        if not present and self._read_only:
            raise CorruptSessionStoreError(
                "the PostgreSQL database holds no littleghost session store (no "
                "littleghost tables in its search path)"
            )
        if not present:
            for statement in _SCHEMA:
                connection.execute(statement)
            connection.execute(
                "INSERT INTO littleghost_meta (key, value) VALUES (%s, %s), (%s, %s)",
                ("format", STORE_FORMAT, "schema_version", str(SCHEMA_VERSION)),
            )
            self._stored_at = "stored_at"
            return
        if "littleghost_meta" not in present:
            raise CorruptSessionStoreError(
                "the PostgreSQL schema has littleghost tables but no littleghost_meta table"
            )
        try:
            meta = dict(connection.execute("SELECT key, value FROM littleghost_meta").fetchall())
        except self._psycopg.errors.UndefinedColumn as error:
            raise CorruptSessionStoreError(
                f"the PostgreSQL schema has a foreign littleghost_meta table ({error})"
            ) from error
        check_schema(meta, "the PostgreSQL session store")
        if len(present) < len(_TABLES):
            raise CorruptSessionStoreError(
                "the PostgreSQL session store is missing littleghost tables"
            )
        column = connection.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s)"
            " AND attname = 'stored_at' AND NOT attisdropped",
            ("littleghost_messages",),
        ).fetchone()
        self._stored_at = "NULL" if column is None else "stored_at"
