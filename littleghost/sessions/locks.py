"""In-process per-session locks: one run of a session at a time in this process.

A session's lock is held across threads, so runs in different threads and event loops
(``run_sync`` from several threads) exclude each other too. Each run joins the
session's line as it arrives and takes the session in its turn there. Runs of one event
loop also queue in FIFO order on an anyio lock, in the order they joined the line, so
that only the one at the head waits: it takes the session at once when its turn has
come, or waits for its turn in a worker thread. Every wait is cancellable by anyio
cancel scopes.

``hold_session`` holds a session of any store: through the store's own ``lock`` when it
has one, else through a ``SessionLocks`` kept for that store in this process.

A ``Hold`` also fences the holder's writes: a built-in store notes in it how many
messages the holder last saw the session hold, and the last one's stored text, or for
PostgreSQL its digest, sent instead of the text (at its load, then at each of its
appends), and refuses an append of the holder once the session has another length or
another last message. The holder's appends take their turns (``SessionLocks.writing``),
so concurrent ones never read the same length.

A task about to wait for a session is noted in ``waits.WAITS`` until it holds it, and
so is each hold: a wait that would close a cycle of runs waiting for each other raises
``SessionBusyError`` instead.

``TimeLeft`` carries the caller's deadline into the worker threads of the stores.
"""

from __future__ import annotations

import collections
import math
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AsyncExitStack,
    asynccontextmanager,
    contextmanager,
)
from contextvars import ContextVar
from typing import cast

import anyio
from attrs import define, field, frozen

from littleghost.errors import SessionBusyError, naming_session
from littleghost.sessions.base import SessionStore
from littleghost.sessions.forks import reset_in_child
from littleghost.sessions.waits import WAITS, Wait

__all__ = [
    "Hold",
    "SessionLocks",
    "TimeLeft",
    "Waiter",
    "acquire",
    "hold_session",
    "shared_locks",
]

_POLL = 0.05
"""Seconds a worker thread waits for a session between checks that it is still wanted."""
_DUE = 0.05
"""Seconds before its deadline from which a call counts as having run out of time."""


@frozen
class TimeLeft:
    """The deadline of the calling task, read before its work goes to a worker thread.

    Attributes:
        deadline: ``anyio.current_effective_deadline()`` (``inf`` for none, ``-inf``
            when already cancelled), on the event loop's clock.
        give_up: The same instant on the ``time.monotonic()`` clock, for threads.
    """

    deadline: float
    give_up: float

    @classmethod
    def now(cls) -> TimeLeft:
        """The current task's deadline (call it in the task, not in a worker thread)."""
        deadline = anyio.current_effective_deadline()
        if math.isinf(deadline):
            return cls(deadline, deadline)
        return cls(deadline, time.monotonic() + (deadline - anyio.current_time()))

    def seconds(self) -> float:
        """Seconds left before the deadline (``inf`` for none, negative once passed)."""
        return self.give_up - time.monotonic()

    def cap(self, seconds: float) -> float:
        """``seconds``, or the time left when that is shorter (never below 0)."""
        return max(min(seconds, self.seconds()), 0.0)

    def until_due(self) -> float:
        """Seconds before the deadline is due: a wait that ends by then fails before the
        caller's cancellation, which ``yield_to_deadline`` then raises over the failure."""
        return self.seconds() - _DUE

    def is_due(self) -> bool:
        """The deadline is (about) reached: waits capped by it have run out."""
        return self.seconds() <= _DUE

    async def yield_to_deadline(self) -> None:
        """Let the deadline's cancellation go first when it is due.

        A store call that failed because a wait ran into the caller's deadline raises
        the caller's cancellation (the failure is its ``__context__``), so a deadline
        stays a deadline; call this in an ``except`` block, then re-raise.
        """
        if math.isfinite(self.deadline) and self.is_due():
            await anyio.sleep_until(self.deadline)
            await anyio.lowlevel.checkpoint()


@define(eq=False)
class Hold:
    """A task's hold of a session (its child tasks share it).

    Attributes:
        seen: How many messages the holder last saw the session hold (its last load or
            append through a built-in store); ``None`` before it looked.
        last: The stored text of the last of them, or its SHA-256 for PostgreSQL (the
            server compares it, and a message may be 1 GB), ``None`` for none: a log of
            the same length made anew (the session deleted, then written by another)
            has another.
        writing: Held by each append of the holder (``SessionLocks.writing``), so the
            next one reads ``seen`` once the last one has set it.
    """

    owner: int
    session_id: str
    active: bool = True
    seen: int | None = None
    last: str | None = None
    writing: anyio.Lock = field(factory=anyio.Lock, repr=False)


@define(eq=False)
class _Queue:
    """The runs of one event loop (one thread) waiting for a session."""

    lock: anyio.Lock
    users: int = 0


@define(eq=False)
class _Entry:
    """One session: whether a run holds it, the line of its waiters (in arrival order), and
    the queue of each thread."""

    turns: threading.Condition = field(factory=threading.Condition)
    held: bool = False
    line: collections.deque[object] = field(factory=collections.deque)
    queues: dict[int, _Queue] = field(factory=dict)
    users: int = 0

    def join(self) -> object:
        """Join the line: the ticket to take the session with, or to leave the line."""
        ticket = object()
        with self.turns:
            self.line.append(ticket)
        return ticket

    async def take(self, ticket: object) -> None:
        """Hold the session in ``ticket``'s turn: at once when it has come, else waiting
        in a worker thread (cancellable)."""
        with self.turns:
            if not self.held and self.line[0] is ticket:
                self.line.popleft()
                self.held = True
                return
        await _in_worker_thread(_TurnWait(self, ticket))

    def leave(self, ticket: object) -> None:
        """Leave the line, unless ``ticket`` took the session (a waiter that gave up)."""
        with self.turns:
            if ticket in self.line:
                self.line.remove(ticket)
                self.turns.notify_all()

    def give_back(self) -> None:
        """Let the session go: the first in the line takes it."""
        with self.turns:
            self.held = False
            self.turns.notify_all()


class _TurnWait:
    """Waits in a worker thread until ``ticket`` is first in the entry's line and the
    session is free, then holds it; can be given up at any time."""

    def __init__(self, entry: _Entry, ticket: object) -> None:
        self._entry = entry
        self._ticket = ticket
        self._abandoned = False
        self._taken = False

    def run(self) -> None:
        entry = self._entry
        with entry.turns:
            while not self._abandoned:
                if not entry.held and entry.line[0] is self._ticket:
                    entry.line.popleft()
                    entry.held = self._taken = True
                    return
                entry.turns.wait(_POLL)

    def abandon(self) -> None:
        """Stop waiting, and let the session go if the thread took it (the run that
        gave up then leaves the line: ``_Entry.leave``)."""
        entry = self._entry
        with entry.turns:
            self._abandoned = True
            if self._taken:
                self._taken = entry.held = False
                entry.turns.notify_all()


class _SlotWait:
    """Waits for a slot of a ``threading.Semaphore`` in a worker thread; can be given up
    at any time."""

    def __init__(self, slots: threading.Semaphore) -> None:
        self._slots = slots
        self._guard = threading.Lock()
        self._abandoned = False
        self._acquired = False

    def run(self) -> None:
        while True:
            with self._guard:
                if self._abandoned:
                    return
            if self._slots.acquire(timeout=_POLL):
                with self._guard:
                    if self._abandoned:
                        self._slots.release()
                    else:
                        self._acquired = True
                return

    def abandon(self) -> None:
        """Stop waiting; give the slot back if the thread got one after all."""
        with self._guard:
            self._abandoned = True
            if self._acquired:
                self._acquired = False
                self._slots.release()


async def acquire(slots: threading.Semaphore) -> None:
    """Take one of ``slots``, waiting in a worker thread (cancellable) when none is free."""
    if not slots.acquire(blocking=False):
        await _in_worker_thread(_SlotWait(slots))


async def _in_worker_thread(wait: _TurnWait | _SlotWait) -> None:
    """``wait.run()`` in a worker thread of its own; ``wait.abandon()`` when the caller
    stops waiting (cancelled) or it fails."""
    try:
        await anyio.to_thread.run_sync(
            wait.run, abandon_on_cancel=True, limiter=anyio.CapacityLimiter(1)
        )
    except BaseException:
        wait.abandon()
        raise


_HELD: ContextVar[tuple[Hold, ...]] = ContextVar("littleghost_held_sessions", default=())
_WAITED_ON: ContextVar[tuple[list[Hold], ...]] = ContextVar(
    "littleghost_waited_on_holds", default=()
)
"""In a task that waits on a run (a stream's block on the stream's run): that run's hold
of its session, and those of the streams it reads in turn. A run the task starts of one
of those sessions would wait for itself."""
_WAITED_BY: ContextVar[Waiter | None] = ContextVar("littleghost_waited_by", default=None)
"""In the run a task waits on, until it holds its session: the waiting task's record."""
_UNDER: ContextVar[tuple[Waiter, ...]] = ContextVar("littleghost_under_waiters", default=())
"""In a run a task waits on, and in what it starts: the waiters of that run and of the
runs around it (a tool's stream inside a stream's run)."""


class Waiter:
    """A task that waits on a run of ``session_id`` (or of no session) it started in
    another task (a stream's block): that session, held by that run, is busy for the
    waiting task, and so are the sessions of streams that run reads in turn (whose events
    it may pass on); no other session is.

    Made in the waiting task (``end()`` there too); the run is wrapped in ``running()``.
    """

    def __init__(self, session_id: str | None) -> None:
        self.session_id = session_id
        self.holds: list[Hold] = []
        self._outside = _WAITED_ON.get()
        self._token = _WAITED_ON.set((*self._outside, self.holds))

    def end(self) -> None:
        """Stop marking the waiting task."""
        _WAITED_ON.reset(self._token)

    @contextmanager
    def running(self) -> Iterator[None]:
        """Around the run waited on: its hold of the session is recorded, for this waiter
        and the waiters around it (not the holds of other runs it starts, nor of other
        tasks); the run itself does not wait on itself."""
        by = _WAITED_BY.set(self)
        under = _UNDER.set((*_UNDER.get(), self))
        outside = _WAITED_ON.set(self._outside)
        try:
            yield
        finally:
            _WAITED_ON.reset(outside)
            _UNDER.reset(under)
            _WAITED_BY.reset(by)


class SessionLocks:
    """A lock per session id, made when first wanted and dropped when nobody wants it.

    A process ``fork()`` made starts with none held or wanted: the threads of the
    parent's holders and waiters are not in it.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        _TABLES.add(self)

    def _forget_in_child(self) -> None:
        self._guard = threading.Lock()
        self._entries = {}

    @asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        """Hold ``session_id`` while the context is open.

        Raises:
            SessionBusyError: The current task (or the run it belongs to) already holds
                the session, or the session's holder waits for one it holds, so waiting
                would never end.
        """
        _check_not_held(id(self), session_id)
        thread = threading.get_ident()
        with self._guard:
            entry = self._entries.setdefault(session_id, _Entry())
            queue = entry.queues.get(thread)
            if queue is None:
                queue = entry.queues[thread] = _Queue(anyio.Lock())
            queue.users += 1
            entry.users += 1
        ticket = entry.join()  # the thread's queue is in the line's order: no await between
        try:
            wait = _wait_for(id(self), session_id)  # until it holds the session
            try:
                await queue.lock.acquire()
                try:
                    await entry.take(ticket)
                except BaseException:
                    queue.lock.release()
                    raise
            finally:
                WAITS.stop_waiting(wait)
            try:
                with _recorded(id(self), session_id):
                    yield
            finally:
                entry.give_back()
                queue.lock.release()
        finally:
            entry.leave(ticket)
            with self._guard:
                queue.users -= 1
                if queue.users == 0:
                    del entry.queues[thread]
                entry.users -= 1
                if entry.users == 0 and self._entries.get(session_id) is entry:
                    del self._entries[session_id]  # (a fork since may have dropped it)

    def holds_any(self) -> bool:
        """Whether the current task (or the run it belongs to, or a stream it is reading)
        holds a session here."""
        return any(hold.active and hold.owner == id(self) for hold in _seen_holds())

    def held(self, session_id: str) -> Hold | None:
        """The current task's hold of ``session_id`` in this table, if it holds it."""
        for hold in _HELD.get():
            if _holds(hold, id(self), session_id):
                return hold
        return None

    @asynccontextmanager
    async def writing(self, session_id: str) -> AsyncIterator[Hold | None]:
        """Around an append or a read: the current task's hold of ``session_id``, if it
        holds it, with the holder's other appends and reads (of its child tasks, say)
        waiting meanwhile."""
        hold = self.held(session_id)
        if hold is None:
            yield None
            return
        async with hold.writing:
            yield hold

    def saw(self, session_id: str, length: int, last: str | None) -> None:
        """Note that the current task, if it holds ``session_id``, saw it hold ``length``
        messages, the last stored as ``last`` (so that its next append expects them)."""
        hold = self.held(session_id)
        if hold is not None:
            hold.seen, hold.last = length, last


_TABLES = reset_in_child(SessionLocks._forget_in_child)

_SHARED_GUARD = threading.Lock()
_SHARED: weakref.WeakValueDictionary[tuple[str, ...], SessionLocks] = weakref.WeakValueDictionary()


def shared_locks(key: tuple[str, ...]) -> SessionLocks:
    """The one ``SessionLocks`` of the sessions ``key`` names (a database file, a
    PostgreSQL schema), shared by every store of them in this process while any uses it."""
    with _SHARED_GUARD:
        return _SHARED.setdefault(key, SessionLocks())


_STORE_LOCKS_GUARD = threading.RLock()
"""Reentrant: a collection inside ``_table_hold`` may run ``_forget`` in the same thread."""
_STORE_LOCKS: dict[int, SessionLocks] = {}
_COUNTED: dict[int, int] = {}
"""The holds wanted of each table in ``_STORE_LOCKS`` kept for a store that cannot be
weakly referenced, by key."""


def _holds(hold: Hold, owner: int, session_id: str) -> bool:
    return hold.active and hold.owner == owner and hold.session_id == session_id


@contextmanager
def _recorded(owner: int, session_id: str) -> Iterator[None]:
    """Record a hold of ``session_id`` of ``owner`` for the current task while the context
    is open, and for the stream's block waiting on its run when that run is of this
    session (then the runs started inside record nothing for that waiter)."""
    hold = Hold(owner, session_id)
    WAITS.hold((owner, session_id), hold)
    token = _HELD.set((*_HELD.get(), hold))
    waiter = _WAITED_BY.get()
    if waiter is not None and waiter.session_id == session_id:
        for around in _UNDER.get():  # this waiter's and those around it
            around.holds.append(hold)
        waiter = None
    waited = _WAITED_BY.set(waiter)
    try:
        yield
    finally:
        hold.active = False
        _WAITED_BY.reset(waited)
        _HELD.reset(token)
        WAITS.release((owner, session_id), hold)


def _seen_holds() -> Iterator[Hold]:
    """The holds of the current task (or the run it belongs to), then those of the runs
    of the streams it is reading."""
    yield from _HELD.get()
    for holds in _WAITED_ON.get():
        yield from holds


def _wait_for(owner: int, session_id: str) -> Wait:
    """Note that the current task may wait for ``session_id`` of ``owner`` (until
    ``WAITS.stop_waiting``).

    Raises:
        SessionBusyError: The session's holder waits, in turn, for a session the current
            task (or the run it belongs to, or a stream it is reading) holds.
    """
    return WAITS.wait((owner, session_id), _HELD.get(), _WAITED_ON.get())


def _check_not_held(owner: int, session_id: str) -> None:
    """``SessionBusyError`` when the current task (or the run it belongs to, or a stream
    it is reading) holds ``session_id`` of ``owner``: waiting would never end. A task
    started inside is told apart by its context alone, so it is refused as well."""
    if any(_holds(hold, owner, session_id) for hold in _HELD.get()):
        raise SessionBusyError(
            "a run of this session is already in progress in this task, or in a task it was "
            "started from (a tool runs in a task its run started); a run started from inside "
            "it would wait for itself (it is refused from any task started inside it)",
            session_id=session_id,
        )
    if any(_holds(hold, owner, session_id) for holds in _WAITED_ON.get() for hold in holds):
        raise SessionBusyError(
            "a run of this session is in progress in a stream that this task, or a task it "
            "was started from, is reading (the block of agent.stream()); that run waits for "
            "the block to read its events, so a run of the session started from the block, "
            "or from a task the block waits for, would wait for itself (it is refused from "
            "any task started in the block)",
            session_id=session_id,
        )


def hold_session(store: SessionStore, session_id: str) -> AbstractAsyncContextManager[None]:
    """Hold ``session_id`` of ``store`` while the context is open (one run at a time).

    A store with a ``lock`` method holds its sessions itself; a run of the same session
    through the same store object started inside the hold (or from a stream's block
    waiting on it) raises ``SessionBusyError``, as it would wait for itself. For a store
    without one, runs of this process are serialized by a lock table kept for that store
    (one per store object, dropped with it); runs in other processes are not waited for.

    Raises:
        SessionBusyError: The current task already holds the session, or its holder in
            this process waits (through nested runs and streams) for a session the
            current task holds: waiting would never end.
        TypeError: The store's ``lock`` does not return an async context manager.
    """
    lock = getattr(store, "lock", None)
    if lock is None:
        return _table_hold(store, session_id)
    hold = lock(session_id)
    if not (hasattr(hold, "__aenter__") and hasattr(hold, "__aexit__")):
        raise TypeError(
            f"session_store.lock({session_id!r}) returned {type(hold).__name__}, not an async "
            "context manager: define it with @asynccontextmanager (async def) or drop it"
        )
    return _store_hold(cast(AbstractAsyncContextManager[None], hold), id(store), session_id)


@asynccontextmanager
async def _store_hold(
    lock: AbstractAsyncContextManager[None], owner: int, session_id: str
) -> AsyncIterator[None]:
    """A store's own ``lock``, recorded as a hold of ``owner`` (the store object), as
    ``SessionLocks.hold`` records one (a lock of the store's own cannot tell a run that
    would wait for itself, or close a cycle); a store error taking it names the
    session."""
    _check_not_held(owner, session_id)
    async with AsyncExitStack() as stack:
        wait = _wait_for(owner, session_id)
        try:
            with naming_session(session_id):
                await stack.enter_async_context(lock)
        finally:
            WAITS.stop_waiting(wait)
        with _recorded(owner, session_id):
            yield


@asynccontextmanager
async def _table_hold(store: SessionStore, session_id: str) -> AsyncIterator[None]:
    """Hold ``session_id`` in the lock table kept for ``store`` (a store without a
    ``lock``): dropped with the store, or, for one that cannot be weakly referenced
    (``__slots__``), once no hold of it is wanted (one table per such store, made for
    each request, stayed for good)."""
    key = id(store)
    with _STORE_LOCKS_GUARD:
        locks = _STORE_LOCKS.get(key)
        if locks is None:
            locks = _STORE_LOCKS[key] = SessionLocks()
            try:
                weakref.finalize(store, _forget, key)
            except TypeError:
                _COUNTED[key] = 0
        if key in _COUNTED:
            _COUNTED[key] += 1
    try:
        async with locks.hold(session_id):
            yield
    finally:
        with _STORE_LOCKS_GUARD:
            if key in _COUNTED:
                _COUNTED[key] -= 1
                if not _COUNTED[key]:  # nobody holds or waits: a new table is the same
                    del _COUNTED[key], _STORE_LOCKS[key]


def _forget(key: int) -> None:
    with _STORE_LOCKS_GUARD:
        _STORE_LOCKS.pop(key, None)
