"""Cross-process session locks: byte-range locks on a lock file beside a database.

A session is held by an exclusive POSIX record lock (``fcntl``) on one byte of the lock
file, at an offset derived from the session id. The kernel drops a process's locks when
the process ends, even by SIGKILL, so a dead process never blocks a session. Record
locks belong to the whole process, and closing any descriptor of the file drops them
all, so the process opens each lock file once (while any of its sessions is wanted;
again when it was removed or replaced, as other processes then lock the new one) and
keeps its own holders apart itself. A wait repeats non-blocking attempts between
short sleeps, so a cancel scope or deadline ends it at once, under asyncio and trio.

Each session has a second byte, its gate: a process takes the gate before the session's
byte and lets it go once it holds the session, so a waiter holds the gate while it waits.
A holder that lets the session go and takes it again at once (runs back to back) then
waits at the gate until the waiter has taken the session: an attempt now and then would
seldom find the session free.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import threading
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from littleghost.errors import SessionStoreError
from littleghost.sessions.forks import reset_in_child

if sys.platform != "win32":
    import fcntl

__all__ = ["LockFile", "file_at", "lock_file"]

_FIRST_POLL = 0.002
"""Seconds before the second attempt; the pause doubles up to ``_LAST_POLL``."""
_LAST_POLL = 0.05
_OFFSETS = 1 << 62
"""Session offsets are below this, and the gate of each is this much further: every
locked byte is below ``2**63``, so it fits a signed 64-bit ``off_t``."""


def _offset(session_id: str) -> int:
    digest = hashlib.blake2b(
        session_id.encode("utf-8"), digest_size=8, person=b"littleghost"
    ).digest()
    return int.from_bytes(digest, "big") % _OFFSETS


def file_at(path: str) -> tuple[int, int] | None:
    """The device and inode of the file at ``path`` (``None`` when there is none): a
    file removed or replaced since it was opened is another."""
    try:
        found = os.stat(path)
    except OSError:  # gone, or out of reach: opening it again tells which
        return None
    return found.st_dev, found.st_ino


class LockFile:
    """The sessions of one database, held across processes through the file ``path``."""

    def __init__(self, path: str, database: str) -> None:
        self._path = path
        self._database = database
        self._guard = threading.Lock()
        self._fd: int | None = None
        """The lock file at the path, as this process last opened it."""
        self._users = 0
        self._held: dict[int, int] = {}
        """The offsets this process holds, each with the descriptor its lock is on."""
        _LOCK_FILES.add(self)

    def _forget_in_child(self) -> None:
        """In a process ``fork()`` made: record locks are not inherited, so it holds none."""
        self._guard = threading.Lock()
        self._held = {}

    @asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        """Hold ``session_id`` against every process while the context is open.

        Raises:
            SessionStoreError: The lock file cannot be opened or locked.
        """
        offset = _offset(session_id)
        with self._guard:
            self._users += 1
            opened = self._fd is not None
        try:
            if not opened:
                self._open()  # a local file: no worker thread (none to wait for either)
            gate = offset + _OFFSETS
            await self._take(gate)
            try:
                await self._take(offset)
            finally:
                self._release(gate)  # held or not: the next waiter's turn at the gate
            try:
                yield
            finally:
                self._release(offset)
        finally:
            self._leave()

    async def _take(self, offset: int) -> None:
        """Take the byte at ``offset``, waiting while any holder has it."""
        pause = _FIRST_POLL
        while not self._attempt(offset):
            await anyio.sleep(pause)
            pause = min(2 * pause, _LAST_POLL)

    def _open(self) -> None:
        if sys.platform == "win32":
            raise SessionStoreError(
                f"cannot lock sessions through {self._path!r}: session lock files need "
                "POSIX file locks (fcntl), which this platform lacks"
            )
        with self._guard:
            if self._fd is not None:
                return
            try:
                self._fd = self._open_file()
            except OSError as error:
                raise self._error("open", error) from error

    def _open_file(self) -> int:
        """The lock file, opened; made with the database file's permissions (and owner,
        for root), as SQLite makes its ``-wal`` and ``-shm`` files: whoever may write the
        database may hold its sessions (the umask made it writable by its maker alone)."""
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            try:
                return os.open(self._path, os.O_RDWR)
            except FileNotFoundError:  # removed meanwhile, or a symlink to nothing
                return os.open(self._path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            found = os.stat(self._database)
            os.fchmod(fd, stat.S_IMODE(found.st_mode) & 0o666)
            if os.geteuid() == 0:
                os.fchown(fd, found.st_uid, found.st_gid)
        except FileNotFoundError:  # not made yet: the umask decides for both
            pass
        except OSError:
            os.close(fd)
            raise
        return fd

    def _attempt(self, offset: int) -> bool:
        """Take the byte at ``offset`` of the file now at the path if no holder in this or
        another process has it."""
        with self._guard:
            if offset in self._held:
                return False
            while True:
                fd = self._follow()
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
                except (BlockingIOError, PermissionError):
                    return False
                except OSError as error:
                    raise self._error("lock", error) from error
                if self._at_path(fd):
                    self._held[offset] = fd
                    return True
                fcntl.lockf(fd, fcntl.LOCK_UN, 1, offset)  # removed meanwhile: lock the new one

    def _follow(self) -> int:
        """The descriptor of the file now at the path: once the one opened was removed or
        replaced, the new one, opened (the old one stays open while this process holds a
        lock on it: closing it would drop them)."""
        assert self._fd is not None
        if not self._at_path(self._fd):
            try:
                fd = self._open_file()
            except OSError as error:
                raise self._error("open", error) from error
            old, self._fd = self._fd, fd
            if old not in self._held.values():
                os.close(old)
        return self._fd

    def _at_path(self, fd: int) -> bool:
        """``fd`` is the file at the path (not one removed or replaced since it was opened)."""
        opened = os.fstat(fd)
        return file_at(self._path) == (opened.st_dev, opened.st_ino)

    def _release(self, offset: int) -> None:
        with self._guard:
            fd = self._held.pop(offset, None)
            if fd is None:  # taken before a fork, by the parent: not this process's
                return
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, offset)
            if fd != self._fd and fd not in self._held.values():
                os.close(fd)  # the last lock on a file removed meanwhile

    def _leave(self) -> None:
        with self._guard:
            self._users -= 1
            if self._users == 0 and self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)

    def _error(self, action: str, error: OSError) -> SessionStoreError:
        return SessionStoreError(
            f"cannot {action} the session lock file {self._path!r}: {error.strerror or error}"
        )


_LOCK_FILES = reset_in_child(LockFile._forget_in_child)

_FILES_GUARD = threading.Lock()
_FILES: weakref.WeakValueDictionary[str, LockFile] = weakref.WeakValueDictionary()


def lock_file(path: str, database: str) -> LockFile:
    """This process's one ``LockFile`` for ``path`` (give a resolved, absolute path), the
    lock file of the file ``database``, kept while anything uses it."""
    with _FILES_GUARD:
        return _FILES.setdefault(path, LockFile(path, database))
