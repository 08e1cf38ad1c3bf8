"""``--store URL``: the session store a command reads, and the log of one session in it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal, Protocol

import click
from attrs import field, frozen

from littleghost.cli.output import shell_word
from littleghost.errors import ConfigurationError, UnknownSessionError
from littleghost.sessions import (
    PostgresSessionStore,
    SessionStats,
    SQLiteSessionStore,
    StoredMessage,
    StoredPage,
)
from littleghost.sessions.base import SessionStore
from littleghost.sessions.postgres import check_conninfo
from littleghost.sessions.schemes import is_postgres, lowercase_fault, url_scheme

__all__ = ["SQLITE_PREFIX", "Inspectable", "StoreAddress", "store_address"]

SQLITE_PREFIX = "sqlite:///"
"""``sqlite:///sessions.db`` is a relative path, ``sqlite:////var/lib/app.db`` an
absolute one."""
_POSTGRES_PREFIXES = ("postgresql://", "postgres://")


class Inspectable(SessionStore, Protocol):
    """A store that can give its logs with the time each message was stored, whole or a
    page at a time, and each session's figures without its log."""

    async def load_stored(self, session_id: str) -> tuple[StoredMessage, ...]: ...

    async def load_page(self, session_id: str, start: int, limit: int) -> StoredPage: ...

    async def session_stats(self) -> tuple[SessionStats, ...]: ...


@frozen
class StoreAddress:
    """Where the sessions are: an SQLite file or a PostgreSQL database."""

    kind: Literal["sqlite", "postgres"]
    target: str = field(repr=False)
    """The file's path, or the PostgreSQL connection string (never shown: it may hold a
    password)."""

    def __str__(self) -> str:
        if self.kind == "sqlite":
            return self.target
        return "the PostgreSQL store"

    @asynccontextmanager
    async def open(self, *, read_only: bool = True) -> AsyncIterator[Inspectable]:
        """The store, read-only unless ``read_only`` is False; closed afterwards."""
        store: SQLiteSessionStore | PostgresSessionStore
        if self.kind == "sqlite":
            store = SQLiteSessionStore(self.target, read_only=read_only)
        else:
            store = PostgresSessionStore(self.target, read_only=read_only)
        async with store:
            yield store

    async def log(self, session_id: str) -> tuple[StoredMessage, ...]:
        """The session's log with its stored times, read from the store opened read-only.

        Raises:
            UnknownSessionError: The store has no such session.
        """
        async with self.open() as store:
            log = await store.load_stored(session_id)
        if not log:
            raise UnknownSessionError(
                f"no session {shell_word(session_id, in_prose=True)} in {self}",
                session_id=session_id,
            )
        return log


def _check_absolute_not_meant(path: str) -> None:
    """Refuse a relative ``path`` that is not there when the absolute one is: three
    slashes where an absolute path takes four (``sqlite:///var/app.db``).

    Raises:
        click.BadParameter: ``path`` is such a path.
    """
    absolute = "/" + path
    if not os.path.isabs(path) and not os.path.lexists(path) and os.path.exists(absolute):
        raise click.BadParameter(
            f"there is no {path} in the current directory; for {absolute} write four "
            f"slashes: {SQLITE_PREFIX}{absolute}"
        )


_FORMS = "sqlite:///path.db, a postgresql:// URL or a PostgreSQL conninfo (host=... dbname=...)"


def store_address(text: str) -> StoreAddress:
    """``sqlite:///path.db``, or a PostgreSQL URL (``postgresql://...``) or conninfo
    (``host=... dbname=...``) that libpq can take whole (``check_conninfo``).

    Raises:
        click.BadParameter: It is none of these, saying what is wrong with it.
    """
    text = text.strip()
    scheme = url_scheme(text)  # a conninfo's first word ends with "=": none
    if text.startswith(_POSTGRES_PREFIXES) or ("=" in text and scheme is None):
        try:
            return StoreAddress("postgres", check_conninfo(text))
        except ConfigurationError as error:
            raise click.BadParameter(str(error)) from None
    if scheme is not None and scheme.lower() == "sqlite":
        return StoreAddress("sqlite", _sqlite_path(text, text[len(scheme) + 1 :]))
    if not text:
        raise click.BadParameter(f"it is empty; give {_FORMS}")
    if scheme is not None and is_postgres(scheme):
        begins = f"a PostgreSQL URL begins: {scheme}://..."
        raise click.BadParameter(lowercase_fault(scheme) or begins)
    if url_scheme(text, slashes=True) is not None:
        raise click.BadParameter(f"{scheme}:// is no session store's scheme; give {_FORMS}")
    # a URL (jdbc:postgresql://..., mysql:app:pw@db) is not quoted: it may hold a password
    path = "://" not in text and (scheme is None or len(scheme) == 1)  # C: is a drive
    guess = f" (a SQLite file {text}: sqlite:///{text})" if path else ""
    raise click.BadParameter(f"expected {_FORMS}{guess}")


def _sqlite_path(url: str, rest: str) -> str:
    """The file of ``url``, ``sqlite:`` then ``rest``.

    Raises:
        click.BadParameter: ``rest`` names no file, or not after three slashes, or an
            in-memory database (private to its connection: the command's would be empty).
    """
    path = rest.lstrip("/")
    if not path:
        raise click.BadParameter(f"{url} names no file: sqlite:///path.db")
    slashes = len(rest) - len(path)
    if slashes < 3:
        given = "no slash" if not slashes else f"{slashes} slash" + "es" * (slashes > 1)
        raise click.BadParameter(
            f"{url} has {given} after sqlite:, where a file takes three (four for an "
            f"absolute path): sqlite:///{path}"
        )
    path = rest[3:]
    if path == ":memory:":
        raise click.BadParameter(
            f"{url} is an in-memory database, private to the connection that makes it: the "
            "command's own would be empty; give the file the agent's SQLiteSessionStore "
            "writes (sqlite:///path.db)"
        )
    _check_absolute_not_meant(path)
    return path
