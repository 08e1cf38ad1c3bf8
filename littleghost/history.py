"""The checks a conversation handed to littleghost gets before any model call: a run's
``history=``, and the conversations the ad hoc compactions and ``check_retention`` take."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from littleghost.context.view import misplaced_results
from littleghost.errors import ConfigurationError
from littleghost.messages import Message, Role

__all__ = ["check_history", "check_results"]


def check_history(value: object, name: str) -> list[Message]:
    """``value`` (named ``name`` in errors) as a list of messages, checked.

    Raises:
        TypeError: Not a sequence of ``Message``.
        ConfigurationError: A tool message without a result, a message id used twice, or
            a result that answers no open call of the assistant message its tool message
            answers.
    """
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a sequence of Message, not {type(value).__name__}")
    log = list(value)
    for position, message in enumerate(log):
        if not isinstance(message, Message):
            raise TypeError(f"{name}[{position}] must be a Message, not {type(message).__name__}")
        if message.role is Role.TOOL and not message.tool_results:
            raise ConfigurationError(f"{name}[{position}] is a tool message without a result")
    at = f"{name}[{{}}]".format
    _check_ids(log, at)
    check_results(misplaced_results(log), at)
    return log


def _check_ids(log: Sequence[Message], at: Callable[[int], str]) -> None:
    """Every message of ``log`` must have an id of its own; ``at`` names a position."""
    seen: dict[str, int] = {}
    for position, message in enumerate(log):
        first = seen.setdefault(message.id, position)
        if first != position:
            raise ConfigurationError(
                f"{at(first)} and {at(position)} have the same id {message.id!r}; each "
                "message of a conversation needs an id of its own"
            )


def check_results(misplaced: list[tuple[int, str]], at: Callable[[int], str]) -> None:
    """Reject a conversation with ``misplaced`` results (``misplaced_results``)."""
    if misplaced:
        position, call_id = misplaced[0]
        raise ConfigurationError(
            f"{at(position)} holds a result for call {call_id!r}, which answers "
            "no open call of the assistant message its tool message answers (a result must "
            "come after its call, answer it once, and share a tool message only with results "
            "for calls of the same assistant message)"
        )
