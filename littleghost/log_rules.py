"""What a conversation log may hold, checked where messages enter it.

A log never holds one id twice, and each tool result answers an open call of the
assistant message its tool message answers (the pairing rule of
``littleghost.context.groups``). A conversation handed to littleghost (a run's
``history=``, the conversations the ad hoc compactions and ``check_retention`` take) is
checked whole (``check_history``), a stored log as a run or compaction loads it too
(``check_stored``); a run's ``Ledger`` checks what is appended to its log at the cost of
what is appended.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import attrgetter

import attrs

from littleghost.context.groups import Layout
from littleghost.context.index import LogIndex
from littleghost.errors import ConfigurationError
from littleghost.messages import Message, Role, stray_part

__all__ = [
    "Ledger",
    "check_history",
    "check_ids",
    "check_pairing",
    "check_parts",
    "check_results",
    "check_stored",
]

_ID = attrgetter("id")


def check_history(
    value: object, name: str, *, keep: bool = True, stored: bool = False
) -> list[Message]:
    """``value`` (named ``name`` in errors) as a list of messages, checked; at the cost of
    a few passes in C and the engine's index of the log, which the engine reuses (kept
    among its recent ones unless not ``keep``: a run's history). With ``stored``, a tool
    message whose results answer no call is let through, as ``check_stored`` lets it.

    Raises:
        TypeError: Not a sequence of ``Message``.
        ConfigurationError: A tool message without a result, a message id used twice, or
            a result that answers no open call of the assistant message its tool message
            answers.
    """
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a sequence of Message, not {type(value).__name__}")
    log = list(value)
    if not all(issubclass(kind, Message) for kind in set(map(type, log))):
        for position, message in enumerate(log):
            if not isinstance(message, Message):
                raise TypeError(
                    f"{name}[{position}] must be a Message, not {type(message).__name__}"
                )
    at = f"{name}[{{}}]".format
    layout = LogIndex.of(log, keep=keep).layout
    for position in layout.orphans:  # a tool message without a result answers nothing
        if not log[position].tool_results:
            raise ConfigurationError(f"{at(position)} is a tool message without a result")
    if layout.stray:  # the first message holding a part its role does not carry
        position = layout.stray[0]
        raise ConfigurationError(f"{at(position)}: {stray_part(log[position])}")
    if len(set(map(_ID, log))) != len(log):
        check_ids(log, at)
    check_results(layout.misplaced_results(orphans=not stored), at)
    return log


def check_stored(log: Sequence[Message], where: str) -> None:
    """``ConfigurationError`` for a stored log (``where``: ``"session 'x'"``) that a run
    of its session refuses: a result the view would show under a call it does not answer.
    A tool message whose results answer no call at all is let through: it is left out of
    the view, and an append-only log could never be rid of it."""

    def at(position: int) -> str:  # ``where`` names a session: braces are its own
        return f"message {position} of {where}"

    check_results(Layout.scanned(log).misplaced_results(orphans=False), at)


def check_parts(log: Sequence[Message], at: Callable[[int], str]) -> None:
    """``ConfigurationError`` if a message of ``log`` holds a part its role does not carry
    (``stray_part``)."""
    for position, message in enumerate(log):
        problem = stray_part(message)
        if problem is not None:
            raise ConfigurationError(f"{at(position)}: {problem}")


def check_ids(log: Sequence[Message], at: Callable[[int], str]) -> None:
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


def check_pairing(messages: Sequence[Message], where: str) -> None:
    """``ConfigurationError`` unless each tool result of ``messages`` (a request's)
    answers a call before it and each call has its result, as providers require;
    ``where`` names the messages (``"the turn's request (as its hooks left it)"``)."""
    layout = Layout.scanned(messages, records=False)
    at = f"{where} message {{}}".format
    if layout.misplaced:
        position, call_id = layout.misplaced[0]
        raise ConfigurationError(
            f"{at(position)} holds a result for call {call_id!r}, which answers no open "
            "call of the assistant message its tool message answers (a provider refuses "
            "such a request: a hook that leaves out a call leaves out its results too)"
        )
    unanswered = layout.unanswered(messages)
    if unanswered:
        position, call_id = unanswered[0]
        raise ConfigurationError(
            f"{at(position)} holds tool call {call_id!r} without its result after it (a "
            "provider refuses such a request: a hook that leaves out a call's results "
            "leaves out the call too)"
        )


class Ledger:
    """What a growing log holds, kept beside it: its ids, and its calls still without a
    result (each assistant message that has some, cut down to them), so that checking
    what is appended costs what is appended and what is open, not the whole log."""

    __slots__ = ("ids", "open", "size")

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.open: tuple[Message, ...] = ()
        self.size = 0
        """How many messages of the log are taken in."""

    def catch_up(self, log: Sequence[Message]) -> None:
        """Take in, unchecked, what ``log`` holds beyond what was taken in (a loaded log)."""
        if self.size < len(log):
            added = log[self.size :]
            self.add(added, _still_open(self.open, added)[1])

    def check(self, messages: Sequence[Message], where: str) -> tuple[Message, ...]:
        """``ConfigurationError`` unless ``messages`` may follow the log taken in: no
        tool message without a result, no id the log (or another of them) holds, no
        result that answers no open call. Returns what ``add`` takes as the calls left
        open after them."""
        at = f"{where} message {{}}".format
        for position, message in enumerate(messages):
            if message.role is Role.TOOL and not message.tool_results:
                raise ConfigurationError(f"{at(position)} is a tool message without a result")
        check_parts(messages, at)
        check_ids(messages, at)
        for position, message in enumerate(messages):
            if message.id in self.ids:
                raise ConfigurationError(
                    f"{at(position)} has the id {message.id!r} of a message already in the "
                    "log; each message of a conversation needs an id of its own"
                )
        misplaced, still_open = _still_open(self.open, messages)
        check_results(misplaced, at)
        return still_open

    def add(self, messages: Sequence[Message], still_open: tuple[Message, ...]) -> None:
        """Take in ``messages``, appended to the log, and the calls ``check`` left open."""
        self.ids.update(message.id for message in messages)
        self.open = still_open
        self.size += len(messages)


def _still_open(
    open_calls: tuple[Message, ...], messages: Sequence[Message]
) -> tuple[list[tuple[int, str]], tuple[Message, ...]]:
    """Pair ``messages`` after the calls ``open_calls`` leaves open: the misplaced results
    of ``messages`` (positions among them, with their call ids), and the calls left open."""
    trial = [*open_calls, *messages]
    layout = Layout()
    layout.scan(trial)
    left: dict[int, Counter[str]] = {}
    for position, call_id in layout.unanswered(trial):
        left.setdefault(position, Counter())[call_id] += 1
    kept = []
    for position, ids in left.items():
        message = trial[position]
        if ids.total() < len(message.tool_calls):
            calls = []
            for call in message.tool_calls:
                if ids[call.id] > 0:
                    ids[call.id] -= 1
                    calls.append(call)
            message = attrs.evolve(message, content=calls)
        kept.append(message)
    offset = len(open_calls)
    return [(position - offset, call_id) for position, call_id in layout.misplaced], tuple(kept)
