"""``sessions list``: every session with its message count, summaries and last activity."""

from __future__ import annotations

from typing import Any

from littleghost.cli.output import Output, clock, moment, shell_word
from littleghost.cli.stores import Inspectable

__all__ = ["print_sessions", "sessions_document"]


async def sessions_document(store: Inspectable) -> list[dict[str, Any]]:
    """One entry per session, oldest first: ``id``, ``messages``, ``summaries`` and
    ``last_activity`` (when its last message was stored; ``None`` if not recorded),
    counted by the store without loading the logs."""
    return [
        {
            "id": stats.id,
            "messages": stats.messages,
            "summaries": stats.summaries,
            "last_activity": moment(stats.last_activity),
        }
        for stats in await store.session_stats()
    ]


def print_sessions(output: Output, document: list[dict[str, Any]]) -> None:
    """The sessions as a table (or plain lines), each id whole as a shell word
    (``shell_word``): pasted into a command, it names the session."""
    if not document and output.terminal:
        output.line("no sessions")
        return
    rows = [
        [
            str(session["messages"]),
            str(session["summaries"]),
            clock(session["last_activity"]),
            shell_word(session["id"]),
        ]
        for session in document
    ]
    headers = ["MESSAGES", "SUMMARIES", "LAST ACTIVITY (UTC)", "SESSION"]
    output.table(headers, rows, cut_last=False)  # an id cut short names no session
