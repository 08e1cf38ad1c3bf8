"""Session stores: append-only conversation logs that outlive a run.

``agent.run(..., session_id=...)`` holds the session for the whole run (a second run of
the same session waits for it, and the wait counts against its own deadline), loads the
session's log, and appends every new message as it enters the log. Stores:
``InMemorySessionStore`` (the default, one per agent class; runs wait within the process),
``SQLiteSessionStore`` (one file, one machine; runs wait across its processes) and
``PostgresSessionStore`` (many workers on many machines; runs wait across all of them).
A custom store needs ``load``, ``append``, ``list_sessions`` and ``delete``; without a
``lock`` method of its own, its runs wait only within the process. The built-in stores
also have ``load_stored``: the log with the time each message was stored, and
``session_stats``: each session's message and summary counts and last activity, and
``load_page``: a page of a log (``StoredPage``), to go through a long one in little memory.

Stored messages round-trip exactly; metadata values must be JSON-like (str, int, float,
bool, None, list, tuple, dict with str keys) and come back with the same types.
"""

from littleghost.sessions.base import SessionStats, SessionStore, StoredMessage, StoredPage
from littleghost.sessions.codec import (
    decode_message,
    encode_message,
    message_from_json,
    message_to_json,
)
from littleghost.sessions.locks import SessionLocks
from littleghost.sessions.memory import InMemorySessionStore
from littleghost.sessions.postgres import PostgresSessionStore
from littleghost.sessions.sqlite import SQLiteSessionStore

__all__ = [
    "InMemorySessionStore",
    "PostgresSessionStore",
    "SQLiteSessionStore",
    "SessionLocks",
    "SessionStats",
    "SessionStore",
    "StoredMessage",
    "StoredPage",
    "decode_message",
    "encode_message",
    "message_from_json",
    "message_to_json",
]
