"""``LogIndex``: a log's layout and what the engine learns about its messages (estimates,
cut-down copies), keyed by id (checked by identity) and carried over as the log grows."""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from attrs import define, field

from littleghost.context.groups import Layout
from littleghost.context.tokens import Estimates, Tokenizer
from littleghost.messages import Message

__all__ = ["RECENT_LOGS", "LogIndex", "forget_recent_logs", "starts_with"]

RECENT_LOGS = 8
"""How many indexes of logs seen lately ``LogIndex.of`` keeps (it holds their messages,
until ``forget_recent_logs``)."""
_LOOKBACK = 64  # how far back from the end ``LogIndex.of`` looks for a log this one extends

_recent: OrderedDict[int, LogIndex] = OrderedDict()
_recent_lock = threading.Lock()  # runs in several threads (run_sync) share it


@define(eq=False, repr=False)
class LogIndex:
    """The layout of one log and the figures the engine keeps about its messages."""

    log: tuple[Message, ...]
    layout: Layout
    _estimates: dict[Any, Estimates] = field(factory=dict)
    _derived: dict[tuple[Any, ...], tuple[Message, Message]] = field(factory=dict)

    @classmethod
    def of(cls, messages: Sequence[Message], *, keep: bool = True) -> LogIndex:
        """The index of ``messages``, reusing a recent one of a log it extends; kept among
        the recent ones unless not ``keep``."""
        log = tuple(messages)
        earlier = None
        with _recent_lock:
            for position in range(len(log) - 1, max(-1, len(log) - 1 - _LOOKBACK), -1):
                known = _recent.get(id(log[position]))
                if (
                    known is not None
                    and len(known.log) == position + 1
                    and known.log == log[: position + 1]  # by identity first, in C
                ):
                    earlier = _recent.pop(id(log[position])) if keep else known
                    break
        found = cls(log, Layout.build(log)) if earlier is None else earlier.grown(log)
        if log and keep:
            with _recent_lock:
                _recent[id(log[-1])] = found
                _recent.move_to_end(id(log[-1]))
                while len(_recent) > RECENT_LOGS:
                    _recent.popitem(last=False)
        return found

    def grown(self, log: Sequence[Message]) -> LogIndex:
        """The index of ``log``, which starts with this index's log; figures carry over."""
        if len(log) == len(self.log):
            return self
        log = tuple(log)
        layout = self.layout.extend(log) or Layout.build(log)
        return LogIndex(log, layout, self._estimates, self._derived)

    def over(self, messages: Sequence[Message]) -> LogIndex:
        """An index of ``messages`` (a request made from this log) sharing this one's figures."""
        log = tuple(messages)
        return LogIndex(log, Layout.build(log), self._estimates, self._derived)

    def estimates(self, tokenizer: Tokenizer) -> Estimates:
        """The estimates by ``tokenizer`` (an unhashable one keyed by id: they hold it)."""
        key: Any = tokenizer
        try:
            hash(tokenizer)
        except TypeError:
            key = id(tokenizer)
        estimates = self._estimates.get(key)
        if estimates is None:
            estimates = self._estimates[key] = Estimates(tokenizer)
        return estimates

    def derived(
        self, message: Message, key: tuple[Any, ...], make: Callable[[], Message]
    ) -> Message:
        """The copy of ``message`` (same id) that ``make`` builds, made once per key."""
        slot = (message.id, *key)
        known = self._derived.get(slot)
        if known is not None and known[0] is message:
            return known[1]
        copy = make()
        self._derived[slot] = (message, copy)
        return copy


def forget_recent_logs() -> None:
    """Forget the logs the context engine was given lately (the indexes ``LogIndex.of``
    keeps: their messages, estimates and cut-down copies), so that no copy of their content
    stays in its memory; the next call on a log starts cold. A built-in store's ``delete``
    calls it; call it after erasing a conversation kept anywhere else."""
    with _recent_lock:
        forgotten = list(_recent.values())
        _recent.clear()
    forgotten.clear()  # their messages freed outside the lock


def starts_with(messages: Sequence[Message], prefix: Sequence[Message]) -> bool:
    """Whether ``messages`` starts with the very objects of ``prefix`` (by identity, not
    value: what the engine figured for a message object holds for that object only)."""
    return len(prefix) <= len(messages) and all(map(operator.is_, prefix, messages))
