"""Changed copies of log messages for views, cached so later turns reuse the same objects.

A view never changes the log: it shows copies (same id) with text cut down. Each copy is
cached on the original message, so the per-message token estimates stay cached too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from littleghost.messages import Message, Role, ToolResult
from littleghost.text import CHARS_PER_TOKEN, truncate_middle

__all__ = ["clip_tool_results", "derived"]


def derived(message: Message, key: tuple[Any, ...], make: Callable[[], Message]) -> Message:
    """The copy of ``message`` that ``make`` builds, cached on it under ``key``."""
    cache = message._cache
    cache_key = ("derived", *key)
    copy = cache.get(cache_key)
    if copy is None:
        copy = make()
        cache[cache_key] = copy
    assert isinstance(copy, Message)
    return copy


def clip_tool_results(messages: Sequence[Message], max_tokens: int) -> tuple[Message, ...]:
    """The messages with every tool result over ``max_tokens`` cut in the middle.

    The cut copy is cached on each message, so a later turn costs a lookup per message.
    """
    limit = max_tokens * CHARS_PER_TOKEN

    def clip(message: Message) -> Message:
        if message.role is not Role.TOOL or not any(
            len(result.content) > limit for result in message.tool_results
        ):
            return message

        def make() -> Message:
            parts = [
                ToolResult(p.call_id, truncate_middle(p.content, max_tokens), p.is_error)
                if isinstance(p, ToolResult)
                else p
                for p in message.content
            ]
            return Message(message.role, parts, message.id, message.metadata)

        return derived(message, ("clip", max_tokens), make)

    return tuple(clip(message) for message in messages)
