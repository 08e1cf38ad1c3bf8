"""``sessions delete``: delete a stored session for good (an erasure request), held as a
run holds it, after the operator confirmed it."""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TextIO

import click

from littleghost.blocking import WAKE
from littleghost.cli.holding import held
from littleghost.cli.output import Output, clock, moment, shell_word
from littleghost.cli.stores import StoreAddress
from littleghost.context.records import is_record
from littleghost.errors import CorruptSessionStoreError, UnknownSessionError
from littleghost.sessions import StoredMessage

__all__ = ["confirm", "delete_document", "described", "print_deletion"]


def _counted(messages: int, records: int) -> str:
    """``17 messages, 1 compaction record among them``."""
    counted = f"{messages} message{'' if messages == 1 else 's'}"
    return f"{counted}, {records} compaction record{'' if records == 1 else 's'} among them"


async def described(address: StoreAddress, session_id: str) -> str:
    """``session ID (N messages, R compaction records among them, last activity ...)``,
    or that its stored log cannot be read (a damaged session is deleted all the same):
    no message content.

    Raises:
        UnknownSessionError: The store has no such session.
    """
    name = f"session {shell_word(session_id, in_prose=True)}"
    log = await _readable(address.log(session_id), session_id)
    if log is None:
        return f"{name} (its stored log cannot be read)"
    last = clock(moment(log[-1].stored_at))
    activity = "unknown" if last == "-" else f"{last} UTC"
    counts = _counted(len(log), sum(is_record(entry.message) for entry in log))
    return f"{name} ({counts}, last activity {activity})"


async def _readable(
    reading: Awaitable[Sequence[StoredMessage]], session_id: str
) -> Sequence[StoredMessage] | None:
    """The session's log, or ``None`` when the store says that log is damaged (its
    ``CorruptSessionStoreError`` names the session; a damaged store fails)."""
    try:
        return await reading
    except CorruptSessionStoreError as error:
        if error.session_id != session_id:
            raise
        return None


def confirm(session: str) -> None:
    """Ask whether to delete ``session`` (``described``) on the terminal: on standard
    error, answered on standard input.

    Raises:
        click.ClickException: Not answered yes, or standard input is no terminal to ask
            on (nothing hangs on a prompt no one sees).
    """
    if sys.stdin is None or not sys.stdin.isatty():
        raise click.ClickException(
            f"not deleted: standard input is not a terminal to ask on; pass --yes to "
            f"delete {session}"
        )
    try:  # a Ctrl-C as the question is being written ends its line too
        click.echo(f"Delete {session}? [y/N]: ", nl=False, err=True)
        answer = _line_read(sys.stdin)
    except KeyboardInterrupt:
        click.echo(err=True)  # "Interrupted" on a line of its own
        raise
    if answer.strip().lower() not in ("y", "yes"):
        raise click.ClickException("not deleted: the answer was not yes")


def _line_read(terminal: TextIO) -> str:
    """A line typed on ``terminal``, waited for ``WAKE`` seconds at a time where the
    system can wait on it: a Ctrl-C landing just before the read begins, or taken by
    another thread, interrupts no read, and its handler runs only at Python's next step
    (a plain read would wait for Enter)."""
    try:
        descriptor = terminal.fileno()
    except (AttributeError, OSError, ValueError):
        descriptor = -1
    if descriptor >= 0 and os.name == "posix":
        while not select.select([descriptor], [], [], WAKE)[0]:
            pass
    return terminal.readline()


async def delete_document(
    address: StoreAddress, session_id: str, begun: Callable[[], None]
) -> dict[str, Any]:
    """Delete the session, holding it as a run does (a run under way ends first, and a
    wait past ``WAIT_NOTICE`` is said), calling ``begun`` as the delete begins (stopped
    from then on, it may be done). The document says how many messages and compaction
    records were deleted (``None`` for a log that could not be read: a damaged session is
    deleted all the same) and, for SQLite, whether the write-ahead log was emptied by the
    delete's checkpoint (``None`` for PostgreSQL).

    Raises:
        UnknownSessionError: The store has no such session (by the time it is held).
    """
    async with address.open(read_only=False) as store, held(store, session_id, notice=True):
        # now that it is held
        log = await _readable(store.load_stored(session_id), session_id)
        if log is not None and not log:
            raise UnknownSessionError(
                f"no session {shell_word(session_id, in_prose=True)} in {address}",
                session_id=session_id,
            )
        begun()
        await store.delete(session_id)
        wal_emptied = _wal_emptied(address)
    return {
        "session": session_id,
        "messages": None if log is None else len(log),
        "records": None if log is None else sum(is_record(entry.message) for entry in log),
        "store": address.kind,
        "wal_emptied": wal_emptied,
    }


def _wal_emptied(address: StoreAddress) -> bool | None:
    """For SQLite, whether the ``-wal`` file is empty (or gone) right after the delete's
    checkpoint: a reader under way in another connection, or a write since, keeps it."""
    if address.kind != "sqlite":
        return None
    try:
        return os.path.getsize(f"{address.target}-wal") == 0
    except FileNotFoundError:
        return True


def print_deletion(output: Output, document: dict[str, Any]) -> None:
    """What was deleted, and where its text may still be; no message content."""
    if document["messages"] is None:
        counts = "its stored log could not be read, so its messages were not counted"
    else:
        counts = _counted(document["messages"], document["records"])
    output.line(f"deleted session {shell_word(document['session'], in_prose=True)}: {counts}")
    if document["store"] == "postgres":
        output.line(
            "PostgreSQL keeps deleted rows in the table's files until VACUUM reuses their "
            "space, and in its write-ahead log, WAL archive and backups until recycled"
        )
    elif document["wal_emptied"]:
        output.line("the text is overwritten in the SQLite file, and its write-ahead log emptied")
    else:
        output.line(
            output.style(
                "the text is overwritten in the SQLite file; its write-ahead log is in use by "
                "another connection and may hold it until the next checkpoint",
                fg="yellow",
            )
        )
