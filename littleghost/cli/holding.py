"""Holding a session from the command line as a run holds it, and saying so when a run
of it is under way, or the database is busy with another connection's write (the command
would otherwise wait without a word)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import click

from littleghost.cli.output import shell_word
from littleghost.sessions.base import SessionStore
from littleghost.sessions.locks import hold_session
from littleghost.sessions.notices import WaitWatch, watching_waits

__all__ = ["WAIT_NOTICE", "held"]

WAIT_NOTICE = 1.0
"""Seconds of waiting for the session after which the command says it is waiting."""


def _say_waiting(session_id: str, watch: WaitWatch) -> None:
    name = shell_word(session_id, in_prose=True)
    if watch.database_busy:
        what = f"the database, busy with another connection's write, to hold session {name}"
    else:
        what = f"a run of session {name} to end"
    click.echo(f"waiting for {what} (Ctrl-C stops)", err=True)


@asynccontextmanager
async def held(store: SessionStore, session_id: str, *, notice: bool) -> AsyncIterator[None]:
    """Hold ``session_id`` of ``store`` as a run does; with ``notice``, a wait longer than
    ``WAIT_NOTICE`` is said on standard error, naming what it waits for (a run holding the
    session, or the database busy with another connection's write)."""
    with watching_waits() as watch:
        timer = threading.Timer(WAIT_NOTICE, _say_waiting, (session_id, watch))
        if notice:
            timer.start()
        try:
            async with hold_session(store, session_id):
                timer.cancel()
                yield
        finally:
            timer.cancel()
