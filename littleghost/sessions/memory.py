"""``InMemorySessionStore``: sessions in this process's memory (the default)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timezone

from anyio.lowlevel import checkpoint

from littleghost.context.index import forget_recent_logs
from littleghost.errors import UnknownSessionError
from littleghost.messages import Message
from littleghost.sessions.base import (
    SessionStats,
    StoredMessage,
    StoredPage,
    changed_under_holder,
    check_page,
    check_session_id,
    decoded_off_loop,
)
from littleghost.sessions.codec import SUMMARY_FLAG, message_from_json, messages_to_json
from littleghost.sessions.locks import SessionLocks

__all__ = ["InMemorySessionStore"]

_ON_LOOP = 32_768
"""Characters of stored text a load decodes on the event loop (about a millisecond): a
short log takes no worker thread, which a test's virtual clock would jump over to the
caller's deadline."""


class InMemorySessionStore:
    """Sessions kept in memory, gone when the process ends.

    Messages are stored encoded (as the persistent stores keep them), with the time
    they were appended, so a stored message cannot change afterwards and the same values
    are refused. Each call is a checkpoint, as the persistent stores' calls are: a call in
    a cancelled scope raises the cancellation and changes nothing. Runs of one session are
    serialized by an in-process lock, and an append of a session's holder is refused once
    the session is no longer as the holder last saw it (deleted meanwhile, say).
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._sessions: dict[str, list[tuple[str, datetime]]] = {}
        self._locks = SessionLocks()

    async def load(self, session_id: str) -> tuple[Message, ...]:
        """The session's messages in append order; ``()`` for an unknown session."""
        return tuple(stored.message for stored in await self.load_stored(session_id))

    async def load_stored(self, session_id: str) -> tuple[StoredMessage, ...]:
        """The session's messages in append order, each with the time it was appended;
        ``()`` for an unknown session (a long log decoded in a worker thread, not on the
        event loop)."""
        return await self._decoded(await self._entries(session_id))

    async def load_page(self, session_id: str, start: int, limit: int) -> StoredPage:
        """The messages at positions ``start`` to ``start + limit - 1`` of the session's
        log (fewer at its end), each with the time it was appended, and the log's length
        then (0 for an unknown session)."""
        start, limit = check_page(start, limit)
        session_id = check_session_id(session_id, stored=True)
        await checkpoint()
        with self._guard:
            log = self._sessions.get(session_id, [])
            entries, length = tuple(log[start : start + limit]), len(log)
        return StoredPage(await self._decoded(entries), length)

    @staticmethod
    async def _decoded(entries: Sequence[tuple[str, datetime]]) -> tuple[StoredMessage, ...]:
        """``entries`` decoded: a long run in a worker thread, not on the event loop."""
        # a stored message is 64 characters at least: no longer log is summed on the loop
        if len(entries) <= _ON_LOOP // 64 and sum(len(text) for text, _ in entries) <= _ON_LOOP:
            return tuple(StoredMessage(message_from_json(text), at) for text, at in entries)

        def decode(stopped: threading.Event) -> tuple[StoredMessage, ...]:
            decoded = []
            for text, at in entries:
                if stopped.is_set():  # the caller stopped waiting: nobody reads the rest
                    break
                decoded.append(StoredMessage(message_from_json(text), at))
            return tuple(decoded)

        return await decoded_off_loop(decode)

    async def _entries(self, session_id: str) -> tuple[tuple[str, datetime], ...]:
        session_id = check_session_id(session_id, stored=True)
        await checkpoint()
        with self._guard:
            entries = tuple(self._sessions.get(session_id, ()))
        self._locks.saw(session_id, len(entries), entries[-1][0] if entries else None)
        return entries

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        """Append ``messages`` to the session, all or none.

        Raises:
            UnstorableValueError: A message holds a value that is not JSON-like.
            SessionStoreError: The current task holds the session, which no longer holds
                the messages it last saw; nothing was stored.
        """
        session_id = check_session_id(session_id)
        encoded = messages_to_json(messages, session_id=session_id)
        if not encoded:
            return
        await checkpoint()
        now = datetime.now(timezone.utc)
        hold = self._locks.held(session_id)
        with self._guard:
            log = self._sessions.get(session_id, [])
            if (
                hold is not None
                and hold.seen is not None
                and (hold.seen != len(log) or (log and log[-1][0] != hold.last))
            ):
                raise changed_under_holder(
                    "in-memory session store", session_id, hold.seen, len(log)
                )
            self._sessions[session_id] = log
            log.extend((text, now) for text in encoded)
            length = len(log)
        self._locks.saw(session_id, length, encoded[-1])

    async def list_sessions(self) -> tuple[str, ...]:
        """The ids of the stored sessions, oldest first."""
        await checkpoint()
        with self._guard:
            return tuple(self._sessions)

    async def session_stats(self) -> tuple[SessionStats, ...]:
        """Each session's message and summary counts and last activity, oldest first
        (only a message whose text holds ``SUMMARY_FLAG`` is decoded)."""
        await checkpoint()
        with self._guard:
            sessions = [(session_id, tuple(log)) for session_id, log in self._sessions.items()]
        return tuple(
            SessionStats(
                session_id,
                len(log),
                sum(SUMMARY_FLAG in text and message_from_json(text).is_summary for text, _ in log),
                log[-1][1],
            )
            for session_id, log in sessions
        )

    async def delete(self, session_id: str) -> None:
        """Remove the session; the context engine forgets the logs it was given lately
        (``forget_recent_logs``).

        Raises:
            UnknownSessionError: There is no such session.
        """
        session_id = check_session_id(session_id, stored=True)
        await checkpoint()
        try:
            with self._guard:
                if self._sessions.pop(session_id, None) is None:
                    raise UnknownSessionError(
                        f"no session {session_id!r} to delete", session_id=session_id
                    )
        finally:
            forget_recent_logs()

    def lock(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """Hold the session exclusively (in this process) while the context is open."""
        session_id = check_session_id(session_id, stored=True)
        return self._locks.hold(session_id)

    async def __aenter__(self) -> InMemorySessionStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """``aclose()``."""
        await self.aclose()

    async def aclose(self) -> None:
        """Nothing to close (it holds no connection): its sessions stay. For code that
        closes whichever store it was given (``async with store, agent:``)."""
