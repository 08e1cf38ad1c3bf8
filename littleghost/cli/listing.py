"""``sessions list``: every session with its message count, summaries and last activity."""

from __future__ import annotations

from typing import Any

from littleghost.cli.output import Output, clock, moment
from littleghost.cli.stores import Inspectable

__all__ = ["print_sessions", "sessions_document"]


async def sessions_document(store: Inspectable) -> list[dict[str, Any]]:
    """One entry per session, oldest first: ``id``, ``messages``, ``summaries`` and
    ``last_activity`` (when its last message was stored; ``None`` if not recorded)."""
    document = []
    for session_id in await store.list_sessions():
        log = await store.load_stored(session_id)
        times = [entry.stored_at for entry in log if entry.stored_at is not None]
        document.append(
            {
                "id": session_id,
                "messages": len(log),
                "summaries": sum(entry.message.is_summary for entry in log),
                "last_activity": moment(max(times, default=None)),
            }
        )
    return document


def print_sessions(output: Output, document: list[dict[str, Any]]) -> None:
    """The sessions as a table (or plain lines)."""
    if not document and output.terminal:
        output.line("no sessions")
        return
    rows = [
        [
            str(session["messages"]),
            str(session["summaries"]),
            clock(session["last_activity"]),
            session["id"],
        ]
        for session in document
    ]
    output.table(["MESSAGES", "SUMMARIES", "LAST ACTIVITY (UTC)", "SESSION"], rows)
