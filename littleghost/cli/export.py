"""``sessions export``: a session's log as JSON Lines, read a page at a time, so that
memory does not grow with the log."""

from __future__ import annotations

import attrs

from littleghost.cli.output import Output, echo, shell_word
from littleghost.cli.stores import StoreAddress
from littleghost.errors import SessionStoreError, UnknownSessionError
from littleghost.sessions import message_to_json

__all__ = ["LARGE_LOG", "PAGE", "export_log"]

LARGE_LOG = 1_000
"""From this many messages on, ``export`` shows a progress bar (on a terminal)."""
PAGE = 1_000
"""The messages ``export`` reads from the store at once."""


async def export_log(address: StoreAddress, session_id: str, output: Output) -> None:
    """Write the session's log to standard output, one message a line in the stored form,
    as it was when its first page was read (messages appended since are not written), a
    page (``PAGE`` messages) at a time; a progress bar from ``LARGE_LOG`` messages on.

    Raises:
        UnknownSessionError: The store has no such session.
        SessionStoreError: The session was deleted as it was being written (what was
            written is cut short).
    """
    async with address.open() as store:
        page = await store.load_page(session_id, 0, PAGE)
        length = page.length
        if not length:
            raise UnknownSessionError(
                f"no session {shell_word(session_id, in_prose=True)} in {address}",
                session_id=session_id,
            )
        output = attrs.evolve(output, progress=output.progress and length >= LARGE_LOG)
        written = 0
        with output.progress_bar(length, "exporting") as advance:
            while True:
                entries = page.messages[: length - written]
                echo("\n".join(message_to_json(entry.message) for entry in entries))
                written += len(entries)
                advance(len(entries), "")
                if written >= length:
                    return
                # from the last message written: a log deleted and written anew since (as
                # long) has another there; a log only grows
                page = await store.load_page(session_id, written - 1, PAGE + 1)
                seen, *rest = page.messages or (None,)
                if page.length < length or not rest or seen != entries[-1]:
                    raise SessionStoreError(
                        f"session {shell_word(session_id, in_prose=True)} was deleted as it "
                        "was being exported: "
                        f"{written} of its {length} messages were written",
                        session_id=session_id,
                    )
                page = attrs.evolve(page, messages=tuple(rest))
