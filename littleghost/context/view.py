"""The view: what the model sees of an append-only log (records stand for what they cover,
results follow their call, a result that answers no call is left out), and its questions."""

from __future__ import annotations

from collections.abc import Sequence

from littleghost._validators import tuple_of
from littleghost.context.groups import Layout
from littleghost.messages import Message

__all__ = ["build_view", "interrupted_results", "misplaced_results", "unanswered_calls"]

INTERRUPTED_TEXT = (
    "The run was interrupted before this tool call finished; it has no result, and what "
    "it does may have happened or may still happen: check before calling it again."
)


def build_view(log: Sequence[Message]) -> tuple[Message, ...]:
    """The messages the model sees of ``log``, in order.

    Raises:
        TypeError: ``log`` is not a sequence of ``Message``.
    """
    log = tuple_of(log, "build_view: log", Message, "Message")
    return tuple(Layout.build(log).messages())


def unanswered_calls(log: Sequence[Message]) -> list[tuple[int, str]]:
    """``(position, call_id)`` of every tool call in ``log`` that has no result."""
    return Layout.scanned(log).unanswered(log)


def misplaced_results(log: Sequence[Message]) -> list[tuple[int, str]]:
    """``(position, call_id)`` of every result in ``log`` that answers no open call of its
    tool message's assistant message."""
    return Layout.scanned(log).misplaced


def interrupted_results(
    log: Sequence[Message], text: str = INTERRUPTED_TEXT
) -> tuple[Message, ...]:
    """Error results to append for every call in ``log`` left without one."""
    return tuple(Message.tool(call_id, text, is_error=True) for _, call_id in unanswered_calls(log))
