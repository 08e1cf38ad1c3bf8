"""The ids a request's tool calls and results go out under.

A log may repeat a call's id (a server that sends no ids gets ``call_0`` in every
answer, parallel calls may share one); the context engine pairs each result with its
call all the same (:func:`littleghost.context.groups.result_calls`). Providers refuse a
request whose call ids repeat, so each call goes out under an id of its own and each
result under its call's. An id hangs on what comes before it alone: a request's earlier
messages go out the same as the conversation grows (a cached prefix stays valid).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from littleghost.context.groups import result_calls
from littleghost.messages import Message, ToolCall, ToolResult

__all__ = ["with_unique_call_ids"]


def with_unique_call_ids(
    messages: Sequence[Message], refused: re.Pattern[str] | None = None
) -> Sequence[Message]:
    """``messages``, each call under an id of its own and each result under its call's.

    A call keeps its id unless an earlier call went out under it, or it holds a
    character ``refused`` matches (each made ``_``; an id of nothing is ``call``); a
    repeated id is followed by ``_2``, ``_3``, ... ``messages`` itself when no id changes.
    """
    taken: set[str] = set()
    sent: dict[tuple[int, int], str] = {}
    for position, message in enumerate(messages):
        for index, call in enumerate(message.tool_calls):
            base = call.id if refused is None else refused.sub("_", call.id) or "call"
            name, count = base, 1
            while name in taken:
                count += 1
                name = f"{base}_{count}"
            taken.add(name)
            if name != call.id:
                sent[position, index] = name
    if not sent:
        return messages
    answered = {at: sent[call] for at, call in result_calls(messages).items() if call in sent}
    return [
        _renamed(message, position, sent, answered) for position, message in enumerate(messages)
    ]


def _renamed(
    message: Message,
    position: int,
    calls: dict[tuple[int, int], str],
    results: dict[tuple[int, int], str],
) -> Message:
    """``message`` with the new ids of its calls and results (itself when none changes)."""
    content: list[object] = []
    call_index = result_index = 0
    changed = False
    for part in message.content:
        name = None
        if isinstance(part, ToolCall):
            name = calls.get((position, call_index))
            call_index += 1
            if name is not None:
                part = attrs.evolve(part, id=name)
        elif isinstance(part, ToolResult):
            name = results.get((position, result_index))
            result_index += 1
            if name is not None:
                part = attrs.evolve(part, call_id=name)
        changed = changed or name is not None
        content.append(part)
    return attrs.evolve(message, content=tuple(content)) if changed else message
