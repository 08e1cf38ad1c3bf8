"""The session store protocol: an append-only conversation log per session id."""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar, runtime_checkable

import anyio
import attrs
from anyio.lowlevel import RunVar
from attrs import field, frozen

from littleghost import logs
from littleghost._validators import (
    Validator,
    instance_of,
    int_at_least,
    is_int,
    safe_repr,
    type_check,
    wrong_value,
)
from littleghost.errors import (
    ConfigurationError,
    CorruptSessionStoreError,
    SchemaVersionError,
    SessionStoreError,
    UnstorableValueError,
)
from littleghost.messages import Message
from littleghost.sessions.codec import message_from_json
from littleghost.text import brief

__all__ = [
    "MAX_SESSION_ID_LENGTH",
    "SCHEMA_VERSION",
    "STORE_FORMAT",
    "SessionStats",
    "SessionStore",
    "StoredMessage",
    "StoredPage",
    "changed_under_holder",
    "check_page",
    "check_schema",
    "check_session_id",
    "check_store",
    "decoded_off_loop",
    "distinct_ids",
    "length_error",
    "page_bounds",
    "read_log",
    "thread_limiter",
    "unmet_constraint",
]

logger = logs.logger("littleghost.sessions")

STORE_FORMAT = "littleghost.sessions"
"""The ``format`` row of a store's meta table: marks the tables as a littleghost store."""
SCHEMA_VERSION = 1
"""The schema this littleghost writes and reads (the meta table's ``schema_version``)."""
MAX_SESSION_ID_LENGTH = 256
"""The longest session id, in characters."""


def _moment(name: str) -> Validator:
    """A value-type validator: a datetime with its UTC offset (an aware one), or None. A
    naive one could not be compared with the times of the built-in stores (``TypeError:
    can't compare offset-naive and offset-aware datetimes``)."""

    def validate(instance: object, attribute: object, value: Any) -> None:
        if value is None or (isinstance(value, datetime) and value.utcoffset() is not None):
            return
        shown = "a naive datetime" if isinstance(value, datetime) else type(value).__name__
        raise TypeError(f"{name} must be a timezone-aware datetime or None, not {shown}")

    return validate


@frozen
class StoredMessage:
    """A message of a session's log as its store keeps it.

    Attributes:
        message: The message.
        stored_at: When the store took it (UTC); ``None`` when the store did not record
            it (its tables were made before stores recorded times).
    """

    message: Message = field(validator=instance_of("StoredMessage.message", Message, "a Message"))
    stored_at: datetime | None = field(validator=_moment("StoredMessage.stored_at"))


@frozen
class StoredPage:
    """A run of a session's log as its store keeps it (``load_page``).

    Attributes:
        messages: The messages from the position asked for on, at most as many as asked.
        length: How many messages the whole log held as the page was read (0: the store
            has no such session).
    """

    messages: tuple[StoredMessage, ...] = field(
        validator=type_check(
            "StoredPage.messages",
            lambda v: isinstance(v, tuple) and all(isinstance(m, StoredMessage) for m in v),
            "a tuple of StoredMessage",
        )
    )
    length: int = field(validator=type_check("StoredPage.length", int_at_least(0), "an int >= 0"))


def check_page(start: object, limit: object) -> tuple[int, int]:
    """``start`` and ``limit`` of a ``load_page`` call, if they are ints >= 0 and >= 1.

    Raises:
        TypeError: Either is not.
    """
    if not int_at_least(0)(start):
        raise TypeError(f"start must be an int >= 0, not {safe_repr(start)}")
    if not int_at_least(1)(limit):
        raise TypeError(f"limit must be an int >= 1, not {safe_repr(limit)}")
    return int(start), int(limit)  # type: ignore[call-overload]


_LAST_POSITION = 2**63 - 1
"""The largest position a database column of the stores can hold (SQLite's and
PostgreSQL's 64-bit integers)."""


def page_bounds(page: tuple[int, int] | None) -> tuple[int, int]:
    """The positions ``page`` (``start``, ``limit``; ``None``: the whole log) reads: from
    the first, up to but not including the second."""
    if page is None:
        return 0, _LAST_POSITION
    start, limit = page
    return min(start, _LAST_POSITION), min(start + limit, _LAST_POSITION)


def _summaries(instance: SessionStats, attribute: object, value: Any) -> None:
    if not (is_int(value) and 0 <= value <= instance.messages):
        raise TypeError(
            "SessionStats.summaries must be an int from 0 to messages "
            f"({instance.messages}), not {safe_repr(value)}"
        )


@frozen
class SessionStats:
    """What a store tells of one session without loading its log.

    Attributes:
        id: The session id.
        messages: How many messages its log holds.
        summaries: How many of them are compaction summaries (``Message.is_summary``).
        last_activity: When its last message was stored (UTC); ``None`` when the store
            did not record it.
    """

    id: str = field(
        validator=type_check(
            "SessionStats.id", lambda v: isinstance(v, str) and v != "", "a non-empty str"
        )
    )
    messages: int = field(
        validator=type_check("SessionStats.messages", int_at_least(0), "an int >= 0")
    )
    summaries: int = field(validator=_summaries)
    last_activity: datetime | None = field(validator=_moment("SessionStats.last_activity"))


@runtime_checkable
class SessionStore(Protocol):
    """Where conversations live between runs: one append-only message log per session.

    A store never rewrites or drops a stored message (only ``delete`` removes a whole
    session); a compaction is an appended summary message that covers earlier ids, so
    the view is derived from the log. A session exists once something was appended to it.

    A store may also have ``lock(session_id)``, returning an async context manager that
    holds the session exclusively while open (one run at a time; waiting must be
    cancellable, and a task that already holds the session gets ``SessionBusyError``).
    The built-in stores have one. A run on a store without it holds the session with a
    lock kept for that store in this process (``SessionLocks``), so runs in other
    processes are not waited for.

    A store may also have ``async load_stored(session_id)``, returning the session's
    log as ``StoredMessage`` values (each message with the time the store took it;
    ``()`` for an unknown session). The built-in stores have it; the ``littleghost``
    command line reads sessions through it. The built-in stores also have
    ``async session_stats()``: a ``SessionStats`` per session, oldest first, which the
    database computes without sending the logs; and ``async load_page(session_id,
    start, limit)``: a ``StoredPage``, the messages at positions ``start`` to ``start +
    limit - 1`` of the log (fewer at its end) and its length then, so that a long log can
    be read a page at a time (``sessions export``) in memory that does not grow with it.
    """

    async def load(self, session_id: str) -> tuple[Message, ...]:
        """The session's messages in append order; ``()`` for an unknown session."""
        ...

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        """Append ``messages`` to the session, all or none (creates the session).

        Raises:
            UnstorableValueError: A message holds a value the store cannot keep;
                nothing was stored.
        """
        ...

    async def list_sessions(self) -> tuple[str, ...]:
        """The ids of the stored sessions, oldest first."""
        ...

    async def delete(self, session_id: str) -> None:
        """Remove the session and all its messages, then call
        ``littleghost.context.forget_recent_logs()`` (whatever the outcome), so that the
        context engine keeps no copy of them.

        Raises:
            UnknownSessionError: There is no such session.
        """
        ...


def check_session_id(session_id: object, *, stored: bool = False) -> str:
    """Return ``session_id`` as a plain ``str`` (a subclass's value, as a database keeps
    it) if a store can keep it; with ``stored``, if it can name a stored session (to read,
    hold or delete it) of any length, as earlier littleghost versions stored some.

    Raises:
        TypeError: It is not a non-empty str.
        UnstorableValueError: It is longer than ``MAX_SESSION_ID_LENGTH`` (unless
            ``stored``), holds a NUL character or cannot be encoded as UTF-8.
    """
    if not isinstance(session_id, str) or not session_id:
        raise TypeError(f"session_id must be a non-empty str, not {safe_repr(session_id)}")
    if not stored and len(session_id) > MAX_SESSION_ID_LENGTH:
        raise UnstorableValueError(
            f"session_id is {len(session_id)} characters long; the longest written to is "
            f"{MAX_SESSION_ID_LENGTH} (a session an earlier littleghost stored under a "
            "longer id can be read, exported and deleted, not continued)"
        )
    if "\x00" in session_id:
        raise UnstorableValueError("session_id must not contain NUL characters")
    try:
        session_id.encode("utf-8")
    except UnicodeEncodeError:
        raise UnstorableValueError("session_id must be encodable as UTF-8") from None
    return str.__str__(session_id)


_VERSION_DIGITS = 9
"""The most digits a readable ``schema_version`` has (one of more is no version, and
Python reads none of more than 4300 as an int)."""


def check_schema(meta: Mapping[str, object], where: str) -> None:
    """Check a store's meta rows (``format``, ``schema_version``) before using it.

    Raises:
        CorruptSessionStoreError: The rows are not a littleghost store's.
        SchemaVersionError: The store was written by a newer littleghost.
    """
    if meta.get("format") != STORE_FORMAT:
        raise CorruptSessionStoreError(
            f"{where} is not a littleghost session store (its meta table is foreign)"
        )
    version = meta.get("schema_version")
    if not isinstance(version, str) or not (
        version.isascii() and version.isdigit() and len(version) <= _VERSION_DIGITS
    ):
        raise CorruptSessionStoreError(f"{where} has an unreadable schema_version {brief(version)}")
    if int(version) > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where} holds session store schema {version}, written by a newer littleghost; "
            f"this one reads schema {SCHEMA_VERSION}. Upgrade littleghost."
        )
    if int(version) < 1:
        raise CorruptSessionStoreError(f"{where} has an unreadable schema_version {version!r}")


T = TypeVar("T")
_DECODERS = 4
"""Worker threads (per event loop) that may decode loaded logs at once, besides the
stores' turns on their connections."""

_LIMITERS: RunVar[weakref.WeakKeyDictionary[object, anyio.CapacityLimiter]] = RunVar(
    "littleghost_thread_limiters"
)


def thread_limiter(owner: object, tokens: int) -> anyio.CapacityLimiter:
    """``owner``'s own limiter of worker threads in the running event loop (a limiter
    belongs to one event loop), made with ``tokens`` on first use, dropped with ``owner``."""
    limiters = _LIMITERS.get(None)
    if limiters is None:
        limiters = weakref.WeakKeyDictionary()
        _LIMITERS.set(limiters)
    limiter = limiters.get(owner)
    if limiter is None:
        limiter = limiters[owner] = anyio.CapacityLimiter(tokens)
    return limiter


async def decoded_off_loop(decode: Callable[[threading.Event], T]) -> T:
    """``decode(stopped)`` in a worker thread, not on the event loop, under the stores'
    own limiter (anyio's default one is the application's: a web framework's sync
    endpoints); ``stopped`` is set once the caller stops waiting, so that a long decode
    nobody will read ends early (callers giving up again and again would pile such
    threads up)."""
    stopped = threading.Event()
    try:
        return await anyio.to_thread.run_sync(
            decode, stopped, abandon_on_cancel=True, limiter=thread_limiter(read_log, _DECODERS)
        )
    finally:
        stopped.set()


def read_log(
    rows: Sequence[Sequence[object]],
    session_id: str,
    where: str,
    when: Callable[[object], datetime | None] | None,
    stopped: threading.Event | None = None,
    page: tuple[int, int] | None = None,
) -> list[StoredMessage]:
    """A session's log from the rows ``(length, position, body, stored_at)`` a store
    read in one statement (one row without a body when it holds no messages), each
    ``stored_at`` read by ``when`` (``None``: no times, so a damaged one stops nothing);
    cut short once ``stopped`` is set (``decoded_off_loop``: nobody reads it). With
    ``page`` (``start``, ``limit``), the rows are that page of the log (``load_page``).

    Raises:
        CorruptSessionStoreError: A message or its time cannot be read, or the session's
            ``length`` disagrees with its messages; the error names ``where``, the
            session and the message's position.
    """
    length = rows[0][0] if rows else None
    start, limit = page or (0, None)
    log: list[StoredMessage] = []
    for _, position, body, stored_at in rows:
        if stopped is not None and stopped.is_set():
            return log
        if body is None:
            continue
        try:
            at = None if when is None else when(stored_at)
            log.append(StoredMessage(message_from_json(str(body)), at))
        except CorruptSessionStoreError as error:
            raise CorruptSessionStoreError(
                f"{where}, session {session_id!r}, message at position {position}: {error}",
                session_id=session_id,
            ) from None
    expected = max(int(length or 0) - start, 0)  # type: ignore[call-overload]
    if (expected if limit is None else min(expected, limit)) != len(log):
        held = f"the {len(log)} messages it holds"
        if page is not None:
            held += f" from position {start} on (at most {limit} read)"
        raise CorruptSessionStoreError(
            f"{where}, session {session_id!r}: its recorded length ({length}) disagrees with "
            + held,
            session_id=session_id,
        )
    return log


def changed_under_holder(where: str, session_id: str, seen: int, found: int) -> SessionStoreError:
    """The error for an append of a session's holder refused because the session no
    longer holds the ``seen`` messages the holder last saw (it holds ``found``: as many,
    when its last one is another), nothing written."""
    if found == 0:
        now = f"no longer exists, not the {seen} messages the run last saw"
    elif found == seen:
        now = f"holds {found} messages, but its last is not the one the run last saw"
    else:
        now = f"holds {found} messages, not the {seen} the run last saw"
    return SessionStoreError(
        f"{where}: session {session_id!r} changed under the run that holds it: it {now} "
        "(the run lost its lock, the session was deleted, or something else wrote to it); "
        "nothing was written",
        session_id=session_id,
    )


def length_error(where: str, session_id: str, length: int) -> CorruptSessionStoreError:
    """The error for an append that found messages stored past the session's recorded
    ``length`` (nothing was written)."""
    return CorruptSessionStoreError(
        f"{where}, session {session_id!r}: its recorded length ({length}) disagrees with its "
        "messages (some are stored past it); nothing was written",
        session_id=session_id,
    )


def unmet_constraint(where: str, session_id: str, constraint: str) -> SessionStoreError:
    """The error for an append refused by a constraint of the store's tables that this
    littleghost's tables do not have (the database's text, ``constraint``, names it and
    its column, never a value), nothing written."""
    return SessionStoreError(
        f"{where}, session {session_id!r}: its tables have a constraint this littleghost's "
        f"writes do not meet ({constraint}): tables of a newer littleghost that kept "
        f"schema_version {SCHEMA_VERSION}, or changed by hand; nothing was written",
        session_id=session_id,
    )


def awaitable(result: object, method: str) -> Awaitable[Any]:
    """``result``, what ``session_store.<method>(...)`` returned, which a run awaits.

    Raises:
        ConfigurationError: It is no awaitable (a plain ``def`` store method).
    """
    if not inspect.isawaitable(result):
        raise ConfigurationError(
            f"session_store.{method}() returned {type(result).__name__}, not an awaitable: "
            "a session store's methods are async def (or return an awaitable)"
        )
    return result


def check_store(name: str, value: object) -> SessionStore:
    """``value`` (named ``name`` in errors) if it is a session store instance."""
    lock = getattr(value, "lock", None)
    if (
        isinstance(value, type)
        or not isinstance(value, SessionStore)
        or not (lock is None or callable(lock))
    ):
        raise ConfigurationError(
            f"{name} must be a session store instance (load, append, list_sessions, delete, "
            f"and optionally lock), such as SQLiteSessionStore(path), not {wrong_value(value)}"
        )
    function = inspect.unwrap(lock) if lock is not None else None  # past @contextmanager
    kinds = (
        (inspect.isgeneratorfunction(function), "a generator function (a sync @contextmanager)"),
        (inspect.iscoroutinefunction(function), "a coroutine function"),
        (
            inspect.isasyncgenfunction(lock),
            "an async generator function without @asynccontextmanager",
        ),
    )
    kind = next((kind for found, kind in kinds if found), None)
    if kind is not None:
        raise ConfigurationError(
            f"{name}.lock must return an async context manager, but it is {kind}: make it "
            "an @asynccontextmanager async generator, or leave it out to have runs wait "
            "within the process"
        )
    return value


def distinct_ids(stored: Sequence[Message], where: str) -> Sequence[Message]:
    """A stored log (of ``where``) as runs and compactions read it: each message whose id
    an earlier one has under ``<id>~<position>`` (the same at every load), so a record
    hides only what it covers. Earlier littleghost versions stored a response a model
    handed back twice under one id; the store itself is left as it is.

    Raises:
        ConfigurationError: ``stored``, what a store's ``load`` returned, is not a
            sequence (a list, a tuple) of ``Message`` values.
    """
    if isinstance(stored, (str, bytes, Mapping)) or not isinstance(stored, Sequence):
        raise ConfigurationError(
            f"session_store.load() returned {type(stored).__name__} for {where}, not a "
            "sequence (a list or tuple) of Message"
        )
    seen: set[str] = set()
    repeated: list[int] = []
    for position, message in enumerate(stored):
        if not isinstance(message, Message):
            raise ConfigurationError(
                f"session_store.load() returned a {type(message).__name__} at position "
                f"{position} of {where}, not a Message"
            )
        if message.id in seen:
            repeated.append(position)
        seen.add(message.id)
    if not repeated:
        return stored
    logger.warning(
        "%s holds %d message(s) whose id an earlier message has; they are read under "
        "distinct ids (<id>~<position>)",
        where,
        len(repeated),
    )
    fixed = list(stored)
    for position in repeated:
        distinct = f"{fixed[position].id}~{position}"
        while distinct in seen:  # a stored id of that form already: never a new repeat
            distinct += "~"
        seen.add(distinct)
        fixed[position] = attrs.evolve(fixed[position], id=distinct)
    return fixed
