"""The ids a request's tool calls and results go out under.

A log may repeat a call's id (a server that sends no ids gets ``call_0`` in every
answer, parallel calls may share one), and a result answers the nearest earlier
unanswered call with its id, parallel calls sharing one in call order
(:mod:`littleghost.context.groups` pairs them so). Providers refuse a request whose call
ids repeat, so each call goes out under an id of its own and each result under its
call's. An id hangs on what comes before it alone: a request's earlier messages go out
the same as the conversation grows (a cached prefix stays valid).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["SentCallIds"]


class SentCallIds:
    """The ids of one request's calls and results, read in the order they are sent.

    A call keeps its id unless an earlier call of the request went out under it, or it
    holds a character ``refused`` matches (each made ``_``; an id of nothing is
    ``call``); a repeated id is followed by ``_2``, ``_3``, ...
    """

    def __init__(self, refused: re.Pattern[str] | None = None) -> None:
        self.refused = refused
        self.sent: set[str] = set()
        self.open: dict[str, list[list[str]]] = {}
        """By the log's id, the sent ids of the unanswered calls of each message that
        holds some (the nearest last), in call order."""

    def calls(self, given: Sequence[str]) -> list[str]:
        """The ids the calls of one message, with the ids ``given``, go out under."""
        sent_ids: list[str] = []
        made: dict[str, list[str]] = {}
        for call_id in given:
            base = call_id
            if self.refused is not None:
                base = self.refused.sub("_", call_id) or "call"
            sent, count = base, 1
            while sent in self.sent:
                count += 1
                sent = f"{base}_{count}"
            self.sent.add(sent)
            made.setdefault(call_id, []).append(sent)
            sent_ids.append(sent)
        for call_id, ids in made.items():
            self.open.setdefault(call_id, []).append(ids)
        return sent_ids

    def result(self, call_id: str) -> str:
        """The id a result for the call ``call_id`` goes out under: its call's (``call_id``
        when it answers none: a view leaves such results out)."""
        stack = self.open.get(call_id)
        if not stack:
            return call_id
        sent = stack[-1].pop(0)
        if not stack[-1]:
            stack.pop()
        return sent
