"""``SQLiteSessionStore``: sessions in one SQLite file (standard-library ``sqlite3``)."""

from __future__ import annotations

import math
import os
import re
import sqlite3
import stat
import threading
import time
import urllib.parse
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from datetime import datetime, timezone
from functools import partial
from types import TracebackType
from typing import TypeVar

import anyio

from littleghost import logs
from littleghost._validators import is_number, safe_repr
from littleghost.cleanup import close_leaving
from littleghost.context.index import forget_recent_logs
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
    unmet_constraint,
)
from littleghost.sessions.codec import (
    SUMMARY_FLAG,
    SUMMARY_PATHS,
    messages_to_json,
)
from littleghost.sessions.filelock import LockFile, file_at, lock_file
from littleghost.sessions.locks import SessionLocks, TimeLeft, shared_locks
from littleghost.sessions.notices import waiting_for_database
from littleghost.sessions.schemes import is_postgres

logger = logs.logger(__name__)

__all__ = ["SQLiteSessionStore"]

_NOW = "(julianday('now') - 2440587.5) * 86400.0"
"""SQLite's clock as Unix seconds."""
_SCHEMA = (
    "CREATE TABLE littleghost_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE littleghost_sessions (id TEXT PRIMARY KEY, length INTEGER NOT NULL)",
    "CREATE TABLE littleghost_messages (session_id TEXT NOT NULL, position INTEGER NOT NULL,"
    f" body TEXT NOT NULL, stored_at REAL DEFAULT ({_NOW}),"
    " PRIMARY KEY (session_id, position)) WITHOUT ROWID",
)
"""The tables of a new store. ``stored_at`` (Unix seconds by SQLite's clock, one time for
all the messages of an append) is optional: tables made before it existed are read
without times."""
_SUMMARY_PATHS = tuple("$" + "".join(f'."{key}"' for key in path) for path in SUMMARY_PATHS)
"""``SUMMARY_PATHS`` as SQLite JSON paths."""
_TABLES = {"littleghost_meta", "littleghost_sessions", "littleghost_messages"}
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_READONLY = 8
_SQLITE_CORRUPT = 11
_SQLITE_CANTOPEN = 14
_SQLITE_NOTADB = 26
_SHORTEST_WAIT = 0.005
"""Seconds a call waits for a lock at least, even at or past its deadline."""
_SLICE = 0.05
"""Seconds a worker thread waits for a lock at a time, between checks that its caller
still waits."""
_BUSY_TIMEOUTS = (round(_SLICE * 1000), 20, 10, round(_SHORTEST_WAIT * 1000))
"""The milliseconds a statement may wait for a lock (``_SLICE``, then shorter slices
near the end of a call): a few fixed ``PRAGMA busy_timeout`` texts, so that the
connection's statement cache keeps the store's own statements."""
_PAUSE = 0.005
"""Seconds between attempts that found the database busy."""
_CHECKPOINT_WAIT = 1.0
"""Seconds a delete waits at most for other connections' reads to end, to checkpoint and
truncate the ``-wal`` (the delete is done: a longer wait would only hold up the store)."""

T = TypeVar("T")

_LOCK_FILE_SUFFIX = "-lock"
"""The lock file of a database is its path with this suffix (``sessions.db-lock``)."""


_STORES: weakref.WeakSet[SQLiteSessionStore] = weakref.WeakSet()
"""The stores of database files in this process, for the ``fork()`` hooks."""
_STORES_GUARD = threading.Lock()
"""Held across a ``fork()``, so that the child's copy of ``_STORES`` is whole."""


def _before_fork() -> None:
    """Close every connection, once the call using it (in another thread) is done, and
    take each store's turn until the fork is made: SQLite forbids using a connection
    across ``fork()``, even closing it, and a child that inherited one, used or not, would
    hold none of the file locks SQLite believes its process holds, for that connection and
    every later one of the file, so another process could take itself for the file's last
    user and remove the ``-wal`` the child writes to. A fork waits for a call under way
    (its wait for a busy database ends at the store's timeout or its caller's deadline);
    each store opens the file anew at its next call."""
    _STORES_GUARD.acquire()
    for store in _STORES:
        store._close_for_fork()


def _after_fork() -> None:
    for store in _STORES:
        store._guard.release()
    _STORES_GUARD.release()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork
    )


def _locks_for(path: str) -> tuple[SessionLocks, LockFile | None]:
    """The locks of a database file, shared by every store of the file in this process
    (while any uses it): a FIFO lock table for this process, and the file lock for other
    processes (none for a private database)."""
    if _private(path):
        return SessionLocks(), None
    key = os.path.realpath(path)
    return shared_locks(("sqlite", key)), lock_file(key + _LOCK_FILE_SUFFIX, key)


_URL = re.compile(r"(?i)sqlite:|[a-z][a-z0-9+.-]+:(?:[a-z][a-z0-9+.-]*:)*//")
"""How a URL given for a file begins: ``sqlite:``, or a scheme (two or more characters:
``C:`` is a drive), a JDBC one's inner schemes after it (``jdbc:postgresql:``), and
``//``."""


def _check_not_a_url(path: str) -> None:
    """Refuse a URL given as the path: ``sqlite:///app.db`` (the command line's
    ``--store``) would name a file in a directory ``sqlite:`` there is not.

    Raises:
        ConfigurationError: ``path`` begins as a URL does.
    """
    if _URL.match(path) is None:
        return
    if path[:7].lower() != "sqlite:":  # its scheme alone: a URL may hold a password
        scheme = path.split("://", 1)[0]
        raise ConfigurationError(
            f"SQLiteSessionStore: path must be a file's path, not a {scheme}:// URL"
            + (" (a PostgreSQL URL goes to PostgresSessionStore)" if is_postgres(scheme) else "")
        )
    rest = path[7:]
    file = rest[3:] if rest.startswith("///") else rest.lstrip("/")
    instead = f": SQLiteSessionStore({file!r})" if file else ""
    if file == ":memory:":  # the command line refuses it: its database would be empty
        instead += ", a private in-memory database, gone with the store's connection"
    raise ConfigurationError(
        f"SQLiteSessionStore: path must be a file's path, not the URL {path!r} (sqlite:/// is "
        f"the command line's --store form){instead}"
    )


def _check_named(path: str) -> None:
    """Refuse an empty or blank ``path``: SQLite makes a private temporary database of
    ``""`` (every session gone with the store), a file in the current directory of
    ``"  "``; an environment variable left unset or blank gives either.

    Raises:
        ConfigurationError: ``path`` is empty or only whitespace.
    """
    if path.strip():
        return
    if not path:
        made = "a private temporary database, every session lost when the store closes"
    else:
        made = f"a file named {path!r} in the current directory"
    raise ConfigurationError(
        f"SQLiteSessionStore: path is {'blank' if path else 'empty'}, of which SQLite would "
        f"make {made} (an environment variable unset or blank?); name the database file, or "
        "':memory:' for a private in-memory database"
    )


def _private(path: str) -> bool:
    """``path`` names a private in-memory database, gone with its connection."""
    return path == ":memory:"


_Identity = tuple[int, int] | None
_Files = tuple[_Identity, _Identity, _Identity]


def _files_at(path: str) -> _Files:
    """The device and inode of the database file at ``path``, of its ``-wal`` and of its
    ``-shm`` (``None`` for one there is not): beside the file a symbolic link leads to,
    where SQLite makes them."""
    path = os.path.realpath(path)
    return file_at(path), file_at(path + "-wal"), file_at(path + "-shm")


def _close_connection(connection: sqlite3.Connection, file: str, opened: _Files | None) -> None:
    """Close ``connection`` to ``file``, which opened the files ``opened``. When its
    ``-shm`` was removed or replaced since, a read-only connection of the file holds it
    open meanwhile: closing the last connection, SQLite would write the log into the file
    through the index it kept, over newer pages other processes wrote (and remove the
    log), which a connection of this process holding the file prevents; a read-only one
    writes nothing as it closes. The log stays for the next to open the file. (SQLite
    writes nothing into a database file moved or removed since it was opened.)"""
    database, _, index = _files_at(file)
    if opened is None or opened[2] in (None, index) or database != opened[0]:
        connection.close()
        return
    holding = None
    try:
        holding = sqlite3.connect(
            f"file:{urllib.parse.quote(os.fsencode(file))}?mode=ro",
            uri=True,
            timeout=_SLICE,
            isolation_level=None,
            check_same_thread=False,
        )
        holding.execute("SELECT count(*) FROM sqlite_master").fetchall()
    except sqlite3.Error as error:  # closed all the same: nothing else would be safer
        logger.warning(
            "SQLite session store %r: its -shm file was removed or replaced, and it could not "
            "be held open while closing (%s): SQLite may write over other processes' writes",
            file,
            type(error).__name__,
        )
    try:
        connection.close()
    finally:
        if holding is not None:
            holding.close()


def _on_read_only_file_system(file: str) -> bool:
    """Whether ``file`` (or, for none there, its directory) is on a read-only file
    system (``False`` where there is no ``statvfs``: Windows)."""
    if not hasattr(os, "statvfs"):
        return False
    try:
        flags = os.statvfs(file if os.path.exists(file) else os.path.dirname(file)).f_flag
    except OSError:
        return False
    return bool(flags & os.ST_RDONLY)


_NOT_FILES = (
    (stat.S_ISDIR, "a directory"),  # SQLite says "disk I/O error", or "unable to open"
    (stat.S_ISFIFO, "a named pipe (FIFO)"),  # SQLite's open waits for a writer, for ever
    (stat.S_ISCHR, "a character device"),  # /dev/null reads as an empty database
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_a_file(path: str) -> str | None:
    """What ``path`` is when it is there and not a regular file (a directory, a named
    pipe, a device), else ``None``."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # not there (SQLite says why it cannot open it)
        return None
    return next((kind for test, kind in _NOT_FILES if test(mode)), None)


def _can_write(path: str) -> bool:
    """Whether this process may write ``path`` (a directory: make files in it)."""
    wanted = os.W_OK | os.X_OK if os.path.isdir(path) else os.W_OK
    return os.access(path, wanted, effective_ids=os.access in os.supports_effective_ids)


def _unwritable(file: str) -> str | None:
    """Why this process cannot write the database at ``file`` (an absolute path, without
    symbolic links: SQLite makes its files beside the file a link leads to) and the files
    SQLite makes beside it (``-wal``, ``-shm``, ``-journal``, and the lock file), else
    ``None``."""
    folder = os.path.dirname(file)
    if not os.path.isdir(folder):
        return f"its directory {folder!r} does not exist"
    if _on_read_only_file_system(file):
        return "it is on a read-only file system"
    if os.path.exists(file) and not _can_write(file):
        return "this process has no write permission on the file"
    if not _can_write(folder):
        return (
            f"this process has no write permission on its directory {folder!r}, where SQLite "
            "makes the -wal, -shm and -journal files beside it"
        )
    return None


def _is_busy(error: sqlite3.Error) -> bool:
    """The statement failed because another connection held a lock it needed."""
    code = getattr(error, "sqlite_errorcode", None)
    text = str(error)
    busy = code is not None and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    return busy or "database is locked" in text or "database table is locked" in text


def _store_error(error: sqlite3.Error, path: str, waited: str) -> SessionStoreError:
    code = getattr(error, "sqlite_errorcode", None)
    text = str(error)
    damaged = code is not None and code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    if damaged or "not a database" in text or "malformed" in text:
        return CorruptSessionStoreError(
            f"{path!r} is not a littleghost session store or is damaged ({text})"
        )
    if _is_busy(error):
        return SessionStoreError(
            f"SQLite session store {path!r} is busy: the database stayed locked by another "
            f"connection {waited} ({text}); nothing was changed"
        )
    return SessionStoreError(f"SQLite session store {path!r} failed: {text}")


class _Call:
    """One call of a store: its caller's deadline, and the token the caller sets when it
    stops waiting (its worker thread then ends every wait within a slice and commits
    nothing more)."""

    def __init__(self, time_left: TimeLeft) -> None:
        self.time_left = time_left
        self.stop = threading.Event()
        self.give_up = math.inf
        """When (``time.monotonic()``) the call stops waiting for the database."""
        self.waiting: Callable[[], SessionStoreError] | None = None
        """The error of the call's last wait for a lock, for a caller whose deadline comes
        before the thread reports it (the thread's last slice ran over)."""


def _stored_time(seconds: object) -> datetime | None:
    """A stored ``stored_at`` (seconds since the epoch) as a UTC time.

    Raises:
        CorruptSessionStoreError: The value is not a time.
    """
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, timezone.utc)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError, OSError):
        raise CorruptSessionStoreError(
            f"a stored time cannot be read: {type(seconds).__name__} {str(seconds)[:40]!r}"
        ) from None


class SQLiteSessionStore:
    """Sessions in an SQLite file, for one machine.

    The file is created with its schema on first use and opened in WAL mode; each
    ``append`` is one transaction, so a process killed mid-run leaves every message
    appended before the kill. A file removed or replaced while the store is open is
    noticed at the next call, which opens the file then at the path.

    Runs of one session are serialized across every process on the machine: runs of
    this process queue for the session in FIFO order (every store of the same file in
    the process shares the queue), and the run at the head then takes an ``fcntl``
    byte-range lock on the lock file beside the database (its path plus ``-lock``,
    created on first use), waiting while another process holds the session. The kernel
    frees the lock when its process ends, even by SIGKILL. Across processes the order
    is not FIFO, but a process running the session back to back lets a waiting one in
    after its current run. The lock needs POSIX file locks (not on Windows), which
    network file systems may not provide. An append of a session's holder is refused,
    with nothing written, once the session no longer holds the messages the holder last
    saw (its lock file was removed and another process ran the session, or it was
    deleted meanwhile).

    Args:
        path: The database file (``":memory:"`` for a private in-memory database), not
            a URL: ``sqlite:///app.db``, the command line's ``--store``, is an error, as
            is an empty or blank path (SQLite's private temporary database, or a file
            named with spaces: an environment variable left unset, say).
        timeout: Seconds to wait for another connection's write to finish (> 0); a call
            waits at most until the caller's deadline
            (``anyio.current_effective_deadline()``) when that comes sooner. A cancelled
            caller stops waiting at once; the call's worker thread then stops within a
            few hundredths of a second and starts no commit (a write not yet committed
            rolls back).
        read_only: Open an existing store for reading only (SQLite's ``mode=ro``): a
            missing, empty or foreign file is an error, and ``append``, ``delete`` and
            ``lock`` raise ``SessionStoreError``. SQLite may still create the ``-wal``
            and ``-shm`` files a reader of a WAL database needs.

    Raises:
        CorruptSessionStoreError: (on use) The file is not an SQLite database, is damaged,
            or belongs to another application; it is left untouched.
        SchemaVersionError: (on use) The file was written by a newer littleghost.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, timeout: float = 30.0, read_only: bool = False
    ) -> None:
        if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str):
            raise ConfigurationError(
                f"SQLiteSessionStore: path must be a str or a path, not {safe_repr(path)}"
            )
        if "\x00" in os.fspath(path):
            raise ConfigurationError(
                f"SQLiteSessionStore: path must not hold a NUL character, not {os.fspath(path)!r}"
            )
        _check_named(os.fspath(path))
        _check_not_a_url(os.fspath(path))
        if not isinstance(read_only, bool):
            raise ConfigurationError(
                f"SQLiteSessionStore: read_only must be True or False, not {safe_repr(read_only)}"
            )
        if read_only and _private(os.fspath(path)):
            raise ConfigurationError(
                "SQLiteSessionStore: read_only needs a database file, not a private in-memory one"
            )
        if not (is_number(timeout) and timeout > 0):
            raise ConfigurationError(
                f"SQLiteSessionStore: timeout must be finite seconds > 0, not {safe_repr(timeout)}"
            )
        self._path: str = os.fspath(path)
        self._file = self._path if _private(self._path) else os.path.abspath(self._path)
        """The database file as opened: made absolute now, as its lock file is, so that a
        later change of directory moves neither."""
        self._timeout = float(timeout)
        self._read_only = read_only
        self._guard = threading.Lock()
        self._connection: sqlite3.Connection | None = None
        self._closing: weakref.finalize[[], SQLiteSessionStore] | None = None
        """Closes ``_connection``: called by ``_let_go``, or when the store is collected
        or the interpreter exits (Python 3.13 reports a connection left unclosed)."""
        self._opened: _Files | None = None
        """The files the connection opened (``None``: private)."""
        self._closed = False
        self._close_wanted = False
        """An ``aclose()`` asked to close the connection, and no call has closed it since."""
        self._current = _Call(TimeLeft(math.inf, math.inf))
        """The call that holds ``_guard``."""
        self._busy_timeout = 0
        """The milliseconds the open connection's statements wait for a lock."""
        self._locks, self._lock_file = _locks_for(self._file)
        if self._lock_file is not None:
            with _STORES_GUARD:
                _STORES.add(self)
        self._stored_at = "NULL"
        """What a query selects for a message's time: ``stored_at``, or ``NULL`` in tables
        made before it existed (known once the database is open)."""

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    def __repr__(self) -> str:
        if self._read_only:
            return f"SQLiteSessionStore({self._path!r}, read_only=True)"
        return f"SQLiteSessionStore({self._path!r})"

    async def __aenter__(self) -> SQLiteSessionStore:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """``aclose()``; when the block is leaving by an exception, a close failure is
        logged and that exception goes on."""
        await close_leaving(self.aclose, "closing the SQLite store", error)

    async def aclose(self) -> None:
        """Close the database connection (a later call opens it again; not for a private
        in-memory database, which is gone with it: its later calls raise
        ``SessionStoreError``). A call under way in another task (waiting for a busy
        database, say) keeps the connection until it ends, then closes it: the caller
        stops waiting for it at its deadline or cancellation, as for any call."""
        self._closed = self._closed or _private(self._path)
        self._close_wanted = True
        with anyio.CancelScope(shield=True):  # no call under way: closed whatever comes
            closed = await anyio.to_thread.run_sync(
                self._close, False, limiter=anyio.CapacityLimiter(1)
            )
        if not closed:
            await anyio.to_thread.run_sync(
                self._close, True, abandon_on_cancel=True, limiter=anyio.CapacityLimiter(1)
            )

    async def load(self, session_id: str) -> tuple[Message, ...]:
        """The session's messages in append order; ``()`` for an unknown session."""
        return tuple(stored.message for stored in (await self._read(session_id, None))[0])

    async def load_stored(self, session_id: str) -> tuple[StoredMessage, ...]:
        """The session's messages in append order, each with the time it was stored
        (``None`` in tables made before stores recorded times); ``()`` for an unknown
        session."""
        return tuple((await self._read(session_id, _stored_time))[0])

    async def load_page(self, session_id: str, start: int, limit: int) -> StoredPage:
        """The messages at positions ``start`` to ``start + limit - 1`` of the session's
        log (fewer at its end), each with the time it was stored, and the log's length
        then (0 for an unknown session), in one statement."""
        page = check_page(start, limit)
        log, length = await self._read(session_id, _stored_time, page)
        return StoredPage(tuple(log), length)

    async def _read(
        self,
        session_id: str,
        when: Callable[[object], datetime | None] | None,
        page: tuple[int, int] | None = None,
    ) -> tuple[list[StoredMessage], int]:
        """The session's log (or its ``page``: ``start``, ``limit``) and its length, its
        times read by ``when``, in one statement (one snapshot)."""
        session_id = check_session_id(session_id, stored=True)
        start, stop = page_bounds(page)
        async with self._locks.writing(session_id):  # a holder's read is not older than its writes
            rows = await self._call(
                lambda connection: connection.execute(
                    f"SELECT s.length, position, body, {self._stored_at}"
                    " FROM (SELECT ? AS id) AS k"
                    " LEFT JOIN littleghost_sessions AS s ON s.id = k.id"
                    " LEFT JOIN littleghost_messages ON session_id = k.id"
                    " AND position >= ? AND position < ? ORDER BY position",
                    (session_id, start, stop),
                ).fetchall()
            )
            # decoded in a worker thread (not on the event loop), and not in the store's
            # turn on its connection, which other sessions' calls would wait for meanwhile
            log = await decoded_off_loop(
                lambda stopped: read_log(rows, session_id, self._where, when, stopped, page)
            )
            if page is None:  # what a holder saw: the whole log
                self._locks.saw(session_id, len(log), str(rows[-1][2]) if log else None)
        return log, int(rows[0][0] or 0)

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        """Append ``messages`` to the session in one transaction.

        Raises:
            UnstorableValueError: A message holds a value that is not JSON-like; nothing
                was stored.
            SessionStoreError: The current task holds the session, which no longer holds
                the messages it last saw; nothing was stored.
        """
        session_id = check_session_id(session_id)
        self._check_writable()
        bodies = messages_to_json(messages, session_id=session_id)
        if not bodies:
            return
        async with self._locks.writing(session_id) as hold:
            seen, last = (None, None) if hold is None else (hold.seen, hold.last)

            def write(connection: sqlite3.Connection) -> int:
                row = connection.execute(
                    "SELECT s.length, m.body FROM littleghost_sessions AS s"
                    " LEFT JOIN littleghost_messages AS m"
                    " ON m.session_id = s.id AND m.position = s.length - 1 WHERE s.id = ?",
                    (session_id,),
                ).fetchone()
                start = 0 if row is None else int(row[0])
                if seen is not None and (start != seen or (start and row[1] != last)):
                    raise changed_under_holder(self._where, session_id, seen, start)
                rows = [(session_id, start + index, body) for index, body in enumerate(bodies)]
                try:
                    if row is None:
                        connection.execute(
                            "INSERT INTO littleghost_sessions (id, length) VALUES (?, ?)",
                            (session_id, len(bodies)),
                        )
                    else:
                        connection.execute(
                            "UPDATE littleghost_sessions SET length = ? WHERE id = ?",
                            (start + len(bodies), session_id),
                        )
                    if self._stored_at == "NULL":  # a table made before messages had times
                        connection.executemany(
                            "INSERT INTO littleghost_messages (session_id, position, body)"
                            " VALUES (?, ?, ?)",
                            rows,
                        )
                    else:
                        (now,) = connection.execute(f"SELECT {_NOW}").fetchone()  # one per append
                        connection.executemany(
                            "INSERT INTO littleghost_messages (session_id, position, body,"
                            " stored_at) VALUES (?, ?, ?, ?)",
                            [(*row, now) for row in rows],
                        )
                except sqlite3.IntegrityError as error:
                    past = connection.execute(
                        "SELECT 1 FROM littleghost_messages WHERE session_id = ?"
                        " AND position >= ? LIMIT 1",
                        (session_id, start),
                    ).fetchone()
                    if past is not None:
                        raise length_error(self._where, session_id, start) from error
                    raise unmet_constraint(self._where, session_id, str(error)) from None
                return start + len(bodies)

            length = await self._call(
                lambda connection: self._transaction(connection, lambda: write(connection))
            )
            self._locks.saw(session_id, length, bodies[-1])

    async def list_sessions(self) -> tuple[str, ...]:
        """The ids of the stored sessions, oldest first."""
        rows = await self._call(
            lambda connection: connection.execute(
                "SELECT id FROM littleghost_sessions ORDER BY rowid"
            ).fetchall()
        )
        return tuple(session_id for (session_id,) in rows)

    async def session_stats(self) -> tuple[SessionStats, ...]:
        """Each session's message and summary counts and last activity, oldest first
        (one query; the logs stay in the database)."""
        rows = await self._call(
            lambda connection: connection.execute(
                "SELECT s.id, coalesce(m.messages, 0), coalesce(m.summaries, 0), m.last"
                " FROM littleghost_sessions AS s LEFT JOIN (SELECT session_id,"
                " count(*) AS messages, count(CASE WHEN instr(body, ?) = 0 THEN NULL"
                " WHEN json_type(body, ?) = 'true' OR json_type(body, ?) = 'true' THEN 1 END)"
                f" AS summaries, max({self._stored_at}) AS last"
                " FROM littleghost_messages GROUP BY session_id) AS m ON m.session_id = s.id"
                " ORDER BY s.rowid",
                (SUMMARY_FLAG, *_SUMMARY_PATHS),
            ).fetchall()
        )
        return tuple(
            SessionStats(
                session_id,
                messages,
                summaries,
                _stored_time(seconds),
            )
            for session_id, messages, summaries, seconds in rows
        )

    async def delete(self, session_id: str) -> None:
        """Remove the session and its messages in one transaction, their text
        overwritten in the file (``secure_delete``); then checkpoint the write-ahead log
        and truncate it, so the frames that held them leave the ``-wal`` file too (the
        checkpoint waits ``_CHECKPOINT_WAIT`` at most for reads under way in other
        connections; a read still under way then leaves them there until the next delete).
        The context engine forgets the logs it was given lately (``forget_recent_logs``).

        Raises:
            UnknownSessionError: There is no such session.
        """
        session_id = check_session_id(session_id, stored=True)
        self._check_writable()

        def remove(connection: sqlite3.Connection) -> None:
            cursor = connection.execute(
                "DELETE FROM littleghost_sessions WHERE id = ?", (session_id,)
            )
            if cursor.rowcount == 0:
                raise UnknownSessionError(
                    f"no session {session_id!r} to delete", session_id=session_id
                )
            connection.execute(
                "DELETE FROM littleghost_messages WHERE session_id = ?", (session_id,)
            )

        def erase(connection: sqlite3.Connection) -> None:
            self._transaction(connection, lambda: remove(connection))
            until = time.monotonic() + _CHECKPOINT_WAIT
            while (
                connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
                and time.monotonic() < until
                and self._again()
            ):
                pass

        try:
            await self._call(erase)
        finally:
            forget_recent_logs()

    def lock(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """Hold the session exclusively, across processes, while the context is open.

        Waiting is cancellable and counts against the caller's deadline.

        Raises:
            SessionBusyError: The current task already holds the session.
            SessionStoreError: The store cannot be written (saying why, as its other calls
                do), or the lock file cannot be opened or locked.
        """
        session_id = check_session_id(session_id, stored=True)
        self._check_writable()
        return self._hold(session_id)

    @property
    def _where(self) -> str:
        return f"SQLite session store {self._path!r}"

    def _check_writable(self) -> None:
        if self._read_only:
            raise SessionStoreError(
                f"SQLite session store {self._path!r} is open read-only; nothing was changed"
            )

    def _check_can_write(self) -> None:
        """Raise, before SQLite's bare "unable to open database file" or "attempt to write
        a readonly database", when this process cannot write the database file or make the
        files SQLite makes beside it (beside the file a symbolic link leads to, as SQLite
        does)."""
        if _private(self._file):
            return
        file = os.path.realpath(self._file)
        why = _unwritable(file)
        if why is not None:
            readable = os.path.isfile(file) and not _on_read_only_file_system(file)
            readable = readable and _can_write(os.path.dirname(file))
            advice = "; open it with read_only=True to read it" if readable else ""
            raise SessionStoreError(
                f"SQLite session store {self._path!r} cannot be written: {why}{advice}; "
                "nothing was read or changed"
            )

    @asynccontextmanager
    async def _hold(self, session_id: str) -> AsyncIterator[None]:
        """Hold ``session_id``; a lock file that cannot be opened fails naming the store and
        why, when the store cannot be written (``_check_can_write``), as its calls do."""
        async with self._locks.hold(session_id):
            if self._lock_file is None:
                yield
                return
            async with AsyncExitStack() as stack:
                try:
                    await stack.enter_async_context(self._lock_file.hold(session_id))
                except SessionStoreError:
                    self._check_can_write()
                    raise
                await self._settled()
                yield

    async def _settled(self) -> None:
        """Wait for a write under way to end: a holder that stopped waiting for its write
        let the session go, but a COMMIT already sent may still land (every write holds
        the database's write lock from its start, so taking it once is enough)."""
        await self._call(lambda connection: self._transaction(connection, lambda: None))

    async def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        # The caller may stop waiting at any time: ``stop`` then ends the thread's waits,
        # and a write not yet committing rolls back (a COMMIT under way may finish; the
        # run counts a write it was cut off from as uncertain). The calls of a store take
        # turns on its connection, so one thread (of its own) at a time serves them.
        call = _Call(TimeLeft.now())
        try:
            return await anyio.to_thread.run_sync(
                self._run, work, call, abandon_on_cancel=True, limiter=thread_limiter(self, 1)
            )
        except SessionStoreError:
            await call.time_left.yield_to_deadline()
            raise
        except anyio.get_cancelled_exc_class() as stopped:
            if call.waiting and call.time_left.is_due() and stopped.__context__ is None:
                stopped.__context__ = call.waiting()
            raise
        finally:
            call.stop.set()

    def _run(self, work: Callable[[sqlite3.Connection], T], call: _Call) -> T:
        self._enter(call)
        try:
            self._current = call
            call.give_up = self._give_up(call.time_left)
            if self._closed:
                raise SessionStoreError(
                    f"SQLite session store {self._path!r} was closed, and its private "
                    "in-memory database with it; use a new store"
                )
            while True:
                try:
                    connection = self._kept() or self._open()
                    self._slice(connection)
                    return work(connection)
                except sqlite3.Error as error:
                    call.waiting = partial(self._failed, error, call) if _is_busy(error) else None
                    if not (_is_busy(error) and self._again()):
                        raise self._failed(error, call) from error
                    waiting_for_database()
        finally:
            try:
                self._close_if_wanted()  # an aclose() that came meanwhile
            finally:
                self._guard.release()

    def _enter(self, call: _Call) -> None:
        """Take ``_guard``, waiting until the store's timeout or the caller's deadline at
        most, a slice at a time."""
        give_up = self._give_up(call.time_left)
        while not self._guard.acquire(timeout=min(_SLICE, max(give_up - time.monotonic(), 0))):
            call.waiting = partial(self._guard_busy, call)
            if call.stop.is_set() or time.monotonic() >= give_up:
                raise self._guard_busy(call)
        call.waiting = None

    def _guard_busy(self, call: _Call) -> SessionStoreError:
        return SessionStoreError(
            f"SQLite session store {self._path!r} is busy: another call of this "
            f"store did not finish {self._waited(call.time_left)}; nothing was changed"
        )

    def _failed(self, error: sqlite3.Error, call: _Call) -> SessionStoreError:
        return _store_error(error, self._path, self._waited(call.time_left))

    def _give_up(self, time_left: TimeLeft) -> float:
        """When (``time.monotonic()``) a wait starting now ends: after the store's timeout,
        or as the caller's deadline becomes due, but not before ``_SHORTEST_WAIT``."""
        seconds = max(min(self._timeout, time_left.until_due()), _SHORTEST_WAIT)
        return time.monotonic() + seconds

    def _waited(self, time_left: TimeLeft) -> str:
        """How long a failed call waited, for its error message."""
        if time_left.is_due():
            return "until the caller's deadline"
        return f"for the store's timeout of {self._timeout:g} s"

    def _slice(self, connection: sqlite3.Connection) -> None:
        """Let each statement wait for other connections' locks for a slice at most (less
        when the call's time is nearly up); ``_run`` tries again while the call waits."""
        left = (self._current.give_up - time.monotonic()) * 1000
        milliseconds = next((ms for ms in _BUSY_TIMEOUTS if ms <= left), _BUSY_TIMEOUTS[-1])
        if milliseconds != self._busy_timeout:  # set only when it changes
            connection.execute(f"PRAGMA busy_timeout = {milliseconds}")
            self._busy_timeout = milliseconds

    def _again(self) -> bool:
        """After a pause, whether to try again what found the database busy: not once the
        call's time is up or its caller stopped waiting."""
        call = self._current
        return time.monotonic() < call.give_up and not call.stop.wait(_PAUSE)

    def _transaction(self, connection: sqlite3.Connection, work: Callable[[], T]) -> T:
        connection.execute("BEGIN IMMEDIATE")
        self._current.waiting = None  # the lock is held: a later failure is not "busy"
        try:
            result = work()
            if self._current.stop.is_set():
                raise SessionStoreError(
                    f"SQLite session store {self._path!r}: the caller stopped waiting; "
                    "nothing was changed"
                )
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        return result

    def _kept(self) -> sqlite3.Connection | None:
        """The open connection, while its files are still the ones at the path: closed
        once the database file was removed or replaced (its writes would reach no later
        reader), and replaced by a new one once its ``-wal`` was (its writes would go to
        a log no later reader finds, lost with the process).

        Raises:
            SessionStoreError: The ``-shm`` was removed or replaced: SQLite keeps the old
                one for every connection of the file in this process.
        """
        connection = self._connection
        if connection is None or self._opened is None:
            return connection
        found = _files_at(self._file)
        if found == self._opened:
            return connection
        database, log, index = found
        opened_database, opened_log, opened_index = self._opened
        if database != opened_database:
            self._let_go()  # SQLite leaves the -wal at the path alone: its file moved
            return None
        if opened_index is not None and index != opened_index:
            raise SessionStoreError(
                f"SQLite session store {self._path!r}: its -shm file was removed or replaced "
                "while open, and SQLite keeps using the old one in this process (its reads "
                "and writes would miss other processes'); nothing was read or changed: "
                "restart the process"
            )
        if opened_log is None or log == opened_log:  # one made since (by a writer) is no loss
            return connection
        # The messages in the removed log go into the database file (the index all
        # connections share tells which), then a new connection starts a new log.
        connection.execute("PRAGMA wal_checkpoint(PASSIVE)")
        replaced, self._closing, self._connection = self._closing, None, None
        try:
            return self._open()
        finally:  # once the new connection holds the file: it removes no log at the path
            if replaced is not None:
                replaced()

    def _close_for_fork(self) -> None:
        """Take the store's turn (``_after_fork`` gives it back) and close its connection."""
        self._guard.acquire()
        self._let_go()

    def _close(self, wait: bool) -> bool:
        """Close the connection in the store's turn, waiting for it if ``wait`` (a call that
        held it since ``aclose`` asked closed it as it ended); whether it was taken."""
        if not self._guard.acquire(blocking=wait):
            return False
        try:
            self._close_if_wanted()
        finally:
            self._guard.release()
        return True

    def _close_if_wanted(self) -> None:
        """Close the connection if ``aclose`` asked since it was last closed (in the store's
        turn)."""
        if self._close_wanted:
            self._close_wanted = False
            self._let_go()

    def _let_go(self) -> None:
        """Close the connection, if one is open."""
        closing, self._closing, self._connection = self._closing, None, None
        if closing is not None:
            closing()

    def _open(self) -> sqlite3.Connection:
        target, uri = self._file, False
        kind = _not_a_file(self._file)
        if kind is not None:
            raise SessionStoreError(
                f"{self._path!r} is {kind}, not an SQLite session store: name a file"
            )
        if self._read_only:
            if not os.path.exists(self._file):
                raise SessionStoreError(f"there is no SQLite session store at {self._path!r}")
            target = f"file:{urllib.parse.quote(os.fsencode(self._file))}?mode=ro"
            uri = True
        else:
            self._check_can_write()
        try:
            connection = sqlite3.connect(
                target, timeout=_SLICE, isolation_level=None, check_same_thread=False, uri=uri
            )
        except sqlite3.Error as error:
            unopened = self._unopened(error)
            if unopened is None:
                raise
            raise unopened from error
        self._busy_timeout = _BUSY_TIMEOUTS[0]  # its timeout=
        try:
            self._slice(connection)
            connection.execute("PRAGMA secure_delete = ON")  # a build's default may be off
            self._prepare(connection)
        except sqlite3.Error as error:
            connection.close()
            unopened = self._unopened(error)
            if unopened is None:
                raise
            raise unopened from error
        except BaseException:
            connection.close()
            raise
        self._connection = connection
        self._opened = None if _private(self._path) else _files_at(self._file)
        closing = partial(_close_connection, connection, self._file, self._opened)
        self._closing = weakref.finalize(self, closing)
        return connection

    def _unopened(self, error: sqlite3.Error) -> SessionStoreError | None:
        """The error of a read-only store's open that failed with ``error`` because a file
        could not be opened or written (the WAL index, ``-shm``, which SQLite can neither
        find nor make), saying why; ``None`` for another failure."""
        if not self._read_only:
            return None
        code = getattr(error, "sqlite_errorcode", None)  # Python 3.11+; before, its text
        if code is not None:
            unopened = code & 0xFF in (_SQLITE_READONLY, _SQLITE_CANTOPEN)
        else:
            unopened = "unable to open" in str(error) or "readonly database" in str(error)
        why = _unwritable(os.path.realpath(self._file)) if unopened else None
        if why is None:
            return None
        return SessionStoreError(
            f"SQLite session store {self._path!r} cannot be read: {why} (SQLite reads a WAL "
            "database through a -shm file it makes beside it); nothing was read"
        )

    def _prepare(self, connection: sqlite3.Connection) -> None:
        """Check the file is a littleghost store of a known schema; make one if empty
        (unless read-only).

        Nothing is written to a file that holds anything but a littleghost store.
        """
        if not _entries(connection):
            if self._read_only:
                raise CorruptSessionStoreError(
                    f"{self._path!r} is an empty database, not a littleghost session store"
                )
            connection.execute("PRAGMA journal_mode=WAL")
            self._transaction(connection, lambda: _create(connection))
        tables = {name for name, kind in _entries(connection) if kind == "table"}
        if "littleghost_meta" not in tables:
            raise CorruptSessionStoreError(
                f"{self._path!r} is an SQLite database of another application, not a "
                "littleghost session store; it was left untouched"
            )
        try:
            meta = dict(connection.execute("SELECT key, value FROM littleghost_meta").fetchall())
        except sqlite3.OperationalError as error:
            if "no such column" not in str(error):
                raise
            raise CorruptSessionStoreError(
                f"{self._path!r} has a foreign littleghost_meta table ({error})"
            ) from error
        check_schema(meta, repr(self._path))
        if not _TABLES.issubset(tables):
            raise CorruptSessionStoreError(f"{self._path!r} is missing littleghost tables")
        columns = connection.execute("PRAGMA table_info(littleghost_messages)").fetchall()
        times = any(column[1] == "stored_at" for column in columns)
        self._stored_at = "stored_at" if times else "NULL"


def _entries(connection: sqlite3.Connection) -> list[tuple[str, str]]:
    rows = connection.execute("SELECT name, type FROM sqlite_master").fetchall()
    return [(str(name), str(kind)) for name, kind in rows]


def _create(connection: sqlite3.Connection) -> None:
    if _entries(connection):
        return
    for statement in _SCHEMA:
        connection.execute(statement)
    connection.executemany(
        "INSERT INTO littleghost_meta (key, value) VALUES (?, ?)",
        [("format", STORE_FORMAT), ("schema_version", str(SCHEMA_VERSION))],
    )
