"""What a store's call is waiting for, for a caller that says so (the command line, a
run's deadline error).

A session's hold waits for a run of the session to end; a store may wait, besides, for
its database, busy with another connection's write. A caller watching a wait opens
``watching_waits`` and reads its ``WaitWatch`` from any thread; the stores call
``waiting_for_database`` (from their worker threads, which run in the caller's context)
while the database is busy.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["WaitWatch", "waiting_for_database", "watching_waits"]


class WaitWatch:
    """Whether the watched call's last wait was for its database (else for the session)."""

    def __init__(self) -> None:
        self.database_busy = False


_WATCH: ContextVar[WaitWatch | None] = ContextVar("littleghost_wait_watch", default=None)


@contextmanager
def watching_waits(watch: WaitWatch | None = None) -> Iterator[WaitWatch]:
    """Watch what the store calls made inside the block wait for (in ``watch``, or in a
    new one)."""
    watch = WaitWatch() if watch is None else watch
    token = _WATCH.set(watch)
    try:
        yield watch
    finally:
        _WATCH.reset(token)


def waiting_for_database() -> None:
    """Note, for a watching caller, that the current call waits for its database, busy
    with another connection's write."""
    watch = _WATCH.get()
    if watch is not None:
        watch.database_busy = True
