"""Running a compaction strategy: ad hoc, inside a run, or on a stored session.

The strategy works on the groups of the view of a log. What it decides becomes records
appended to the log — collapses, one exclusion and at most one summary, each listing
the ids it covers — so the view changes while the stored originals stay. Building the
groups, estimating and deciding are linear in the number of messages; estimates are
cached on the messages, so the same log again costs a fraction of the first time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from littleghost.context.groups import GroupIndex
from littleghost.context.strategies import CompactionState, CompactionStrategy, Complete
from littleghost.context.tokens import DEFAULT_TOKENIZER, Tokenizer, cache_key
from littleghost.context.view import ViewIndex
from littleghost.errors import ConfigurationError
from littleghost.messages import Message

__all__ = ["SessionLog", "apply_compaction", "compact_session", "compaction_records"]


class SessionLog(Protocol):
    """The part of a session store that ``compact_session`` uses."""

    async def load(self, session_id: str) -> tuple[Message, ...]:
        """The session's messages in append order."""
        ...

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        """Append messages to the session."""
        ...

    def lock(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """Hold the session exclusively."""
        ...


def _check_strategy(strategy: object) -> None:
    if not callable(getattr(strategy, "compact", None)):
        raise ConfigurationError(
            f"strategy must be a compaction strategy (with async compact(state)), not {strategy!r}"
        )


_LOOKBACK = 64
"""How many messages back from the end a reusable index of an earlier log is looked for."""


class _Snapshot:
    """The indexes of one log, kept on its last message for the next compaction."""

    __slots__ = ("groups", "log", "view")

    def __init__(self, log: tuple[Message, ...], view: ViewIndex, groups: GroupIndex) -> None:
        self.log = log
        self.view = view
        self.groups = groups


def _same(first: Sequence[Message], second: Sequence[Message]) -> bool:
    """The same messages, object for object (messages are immutable values)."""
    return len(first) == len(second) and all(a is b for a, b in zip(first, second, strict=True))


def _indexes(messages: Sequence[Message], tokenizer: Tokenizer) -> tuple[ViewIndex, GroupIndex]:
    """The view and groups of ``messages``, reusing those of the same log or of a log it
    extends with plain messages (the previous turn), found on one of its last messages."""
    log = tuple(messages)
    if not log:
        view = ViewIndex.build(log)
        return view, GroupIndex.build(view, tokenizer)
    key = ("littleghost.compaction.index", cache_key(tokenizer))
    last = log[-1]._cache
    snapshot: _Snapshot | None = last.get(key)
    if snapshot is not None and _same(snapshot.log, log):
        return snapshot.view, snapshot.groups
    for position in range(len(log) - 2, max(-1, len(log) - 2 - _LOOKBACK), -1):
        cache = log[position]._cache
        snapshot = cache.get(key)
        if snapshot is None:
            continue
        if len(snapshot.log) == position + 1 and _same(snapshot.log, log[: position + 1]):
            extended = snapshot.view.extend(log)
            if extended is not None:
                groups = snapshot.groups.extend(extended, tokenizer)
                cache.pop(key, None)
                last[key] = _Snapshot(log, extended, groups)
                return extended, groups
        break
    view = ViewIndex.build(log)
    groups = GroupIndex.build(view, tokenizer)
    last[key] = _Snapshot(log, view, groups)
    return view, groups


async def _run(
    messages: Sequence[Message],
    strategy: CompactionStrategy,
    tokenizer: Tokenizer | None,
    complete: Complete | None,
    settings: Mapping[str, Any] | None,
) -> tuple[tuple[Message, ...], list[Message]]:
    """The records ``strategy`` makes for ``messages``, and the view they give."""
    _check_strategy(strategy)
    tokenizer = DEFAULT_TOKENIZER if tokenizer is None else tokenizer
    view, groups = _indexes(messages, tokenizer)
    state = CompactionState(groups, tokenizer=tokenizer, complete=complete, settings=settings)
    await strategy.compact(state)
    records = state.records()
    if not records:
        return (), view.messages()
    return records, state.view()


async def apply_compaction(
    messages: Sequence[Message],
    strategy: CompactionStrategy,
    *,
    tokenizer: Tokenizer | None = None,
) -> tuple[Message, ...]:
    """Run ``strategy`` once on ``messages`` (a log or a view) and return the view it
    gives; ``messages`` are left as they are.

    A summarizing strategy needs its own model here: ``Summarization(model=...)``.

    Args:
        messages: The conversation.
        strategy: What to do (``Truncation()``, ``Pipeline(...)``, ...).
        tokenizer: Counts tokens; default characters ÷ 4.
    """
    _, view = await _run(messages, strategy, tokenizer, None, None)
    return tuple(view)


async def compaction_records(
    messages: Sequence[Message],
    strategy: CompactionStrategy,
    *,
    tokenizer: Tokenizer | None,
    complete: Complete | None = None,
    settings: Mapping[str, Any] | None = None,
) -> tuple[Message, ...]:
    """The records to append to the log so its view is ``strategy`` applied to it.

    ``build_view((*messages, *records))`` is then the compacted view; ``()`` means
    nothing to do.

    Args:
        messages: The log (or a view of it: records read the same either way).
        strategy: What to do.
        tokenizer: Counts tokens; ``None`` for characters ÷ 4.
        complete: Makes a summary call when the ``Summarization`` has no model of its
            own (inside a run, ``RunContext.complete``: its span, usage and deadline).
        settings: Provider settings the summary call starts from (its output cap and
            tool settings are replaced).
    """
    records, _ = await _run(messages, strategy, tokenizer, complete, settings)
    return records


async def compact_session(
    store: SessionLog,
    session_id: str,
    strategy: CompactionStrategy,
    *,
    tokenizer: Tokenizer | None = None,
    settings: Mapping[str, Any] | None = None,
) -> tuple[Message, ...]:
    """Apply ``strategy`` to a stored session after a run: append its records to the
    session's log, holding the session's lock; return them.

    The next run of the session sees the compacted view; nothing stored is removed. A
    summarizing strategy needs its own model here: ``Summarization(model=...)``.

    Raises:
        SessionBusyError: Called from inside a run of the same session.
    """
    async with store.lock(session_id):
        log = await store.load(session_id)
        records, _ = await _run(log, strategy, tokenizer, None, settings)
        if records:
            await store.append(session_id, records)
    return records
