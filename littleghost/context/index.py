"""``LogIndex``: a log's layout and what the engine learns about its messages (estimates,
cut-down copies), keyed by id (checked by identity) and carried over as the log grows.

Between calls the engine keeps what it learnt of the last ``RECENT_LOGS`` logs given to
``LogIndex.of``, holding none of their messages (``_Kept``): weak references to them, the
layout with weak references in their place, the estimates (which hold messages weakly),
whether the log was found sound. A log given again, or grown, finds it while all its
messages live; a log whose last message is gone is forgotten at once. Cut-down copies
last for the call that made them.
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from attrs import define, field

from littleghost.context.groups import KeptLayout, Layout
from littleghost.context.tokens import Estimates, Tokenizer
from littleghost.messages import Message

__all__ = ["RECENT_LOGS", "LogIndex", "starts_with"]

RECENT_LOGS = 8
"""How many logs ``LogIndex.of`` keeps what it learnt of (none of their messages)."""
_LOOKBACK = 64  # how far back from the end ``LogIndex.of`` looks for a log this one extends

_recent: OrderedDict[int, _Kept] = OrderedDict()
_recent_lock = threading.RLock()  # runs in several threads (run_sync) share it; reentrant:
# a log freed while it is held (by the collector, say) calls ``_forget`` in that thread


@define(eq=False, repr=False)
class LogIndex:
    """The layout of one log and the figures the engine keeps about its messages."""

    log: tuple[Message, ...]
    layout: Layout
    _estimates: dict[Any, Estimates] = field(factory=dict)
    _derived: dict[tuple[Any, ...], tuple[Message, Message]] = field(factory=dict)
    checked: int = 0
    """How many of the first messages of ``log`` a caller found sound (``found_sound``)."""
    _kept: _Kept | None = None

    @classmethod
    def of(cls, messages: Sequence[Message], *, keep: bool = True) -> LogIndex:
        """The index of ``messages``, from what was kept of a log it extends; kept (without
        its messages) unless not ``keep``."""
        log = tuple(messages)
        earlier = None
        with _recent_lock:
            for position in range(len(log) - 1, max(-1, len(log) - 1 - _LOOKBACK), -1):
                known = _recent.get(id(log[position]))
                if known is not None and len(known.refs) == position + 1 and known.holds(log):
                    earlier = _recent.pop(id(log[position])) if keep else known
                    break
        if earlier is None:
            found = cls(log, Layout.build(log))
        else:
            found = earlier.index(log[: len(earlier.refs)]).grown(log)
        kept = earlier
        if log and keep:
            if kept is None or len(kept.refs) < len(log):
                kept = _Kept.of(found, earlier)
            found._kept = kept
            with _recent_lock:
                _recent[id(log[-1])] = kept
                _recent.move_to_end(id(log[-1]))
                while len(_recent) > RECENT_LOGS:
                    _recent.popitem(last=False)
        return found

    def found_sound(self) -> None:
        """Note that a caller found the whole log sound (``log_rules.checked_index``): a
        check of a message object holds for good, as it is frozen."""
        self.checked = len(self.log)
        if self._kept is not None:
            self._kept.checked = True

    def grown(self, log: Sequence[Message]) -> LogIndex:
        """The index of ``log``, which starts with this index's log; figures carry over."""
        if len(log) == len(self.log):
            return self
        log = tuple(log)
        layout = self.layout.extend(log) or Layout.build(log)
        return LogIndex(log, layout, self._estimates, self._derived, self.checked)

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


@define(eq=False)
class _Kept:
    """What the engine keeps of a log between calls: none of its messages."""

    refs: tuple[weakref.ref[Message], ...]
    layout: KeptLayout
    estimates: dict[Any, Estimates]
    last: weakref.ref[Message]  # its callback forgets this when the last message is gone
    checked: bool = False  # the log was found sound (``LogIndex.found_sound``)

    @classmethod
    def of(cls, index: LogIndex, earlier: _Kept | None) -> _Kept:
        """What to keep of ``index`` (``earlier``: what was kept of a log it extends)."""
        log = index.log
        refs = () if earlier is None else earlier.refs
        refs += tuple(map(weakref.ref, log[len(refs) :]))
        last = weakref.ref(log[-1], _forget(id(log[-1])))
        return cls(refs, index.layout.kept(), index._estimates, last)

    def holds(self, log: Sequence[Message]) -> bool:
        """Whether ``log`` starts with the very messages kept (all alive, then)."""
        return all(map(operator.is_, map(weakref.ref.__call__, self.refs), log))

    def index(self, log: tuple[Message, ...]) -> LogIndex:
        """The index of ``log``, the messages kept."""
        checked = len(log) if self.checked else 0
        return LogIndex(log, self.layout.layout(), self.estimates, checked=checked)


def _forget(key: int) -> Callable[[weakref.ref[Message]], None]:
    """What forgets the log kept under ``key`` once its last message is gone."""

    recent, lock = _recent, _recent_lock  # bound here: a log may go at interpreter exit

    def forget(last: weakref.ref[Message]) -> None:
        with lock:
            known = recent.get(key)
            if known is not None and known.last is last:
                del recent[key]

    return forget


def starts_with(messages: Sequence[Message], prefix: Sequence[Message]) -> bool:
    """Whether ``messages`` starts with the very objects of ``prefix`` (by identity, not
    value: what the engine figured for a message object holds for that object only)."""
    return len(prefix) <= len(messages) and all(map(operator.is_, prefix, messages))
