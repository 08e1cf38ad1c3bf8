"""Changed copies of log messages for views, cached so later turns reuse the same objects.

A view never changes the log: it shows copies (same id) with text cut down. Each copy is
cached on the original message, so the per-message token estimates stay cached too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from littleghost.messages import Message, Role, ToolResult
from littleghost.text import truncate_middle

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

    The decision is cached on each message, so a later turn costs a lookup per message.
    """
    limit = max_tokens * 4
    key = ("derived", "clip", max_tokens)

    def clip(message: Message) -> Message:
        if message.role is not Role.TOOL:
            return message
        cached = message._cache.get(key)
        if cached is None:
            if any(len(r.content) > limit for r in message.tool_results):
                parts = [
                    ToolResult(p.call_id, truncate_middle(p.content, max_tokens), p.is_error)
                    if isinstance(p, ToolResult)
                    else p
                    for p in message.content
                ]
                cached = Message(message.role, parts, message.id, message.metadata)
            else:
                cached = message
            message._cache[key] = cached
        assert isinstance(cached, Message)
        return cached

    return tuple(clip(message) for message in messages)
