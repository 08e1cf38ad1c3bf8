"""Running a compaction strategy ad hoc, inside a run, or on a stored session: what it
decides becomes records appended to the log (docs/context.md: "Compaction strategies")."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from littleghost import logs, telemetry
from littleghost._validators import TOKENIZER, counts_tokens, wrong_value
from littleghost.cleanup import DEFAULT_GRACE, Grace, holding
from littleghost.context.attempts import ViewChange, requested_compaction, view_change
from littleghost.context.index import LogIndex
from littleghost.context.strategies import (
    CompactionState,
    CompactionStrategy,
    Complete,
    check_strategy,
)
from littleghost.context.tokens import DEFAULT_TOKENIZER, Tokenizer
from littleghost.errors import CompactionError, ConfigurationError, UnknownSessionError
from littleghost.log_rules import check_history, check_stored
from littleghost.messages import Message
from littleghost.sessions.base import SessionStore, check_session_id, check_store, distinct_ids
from littleghost.sessions.locks import hold_session
from littleghost.settings import check_settings

__all__ = [
    "apply_compaction",
    "check_smaller",
    "compact_session",
    "compaction_records",
    "compaction_state",
]


def compaction_state(
    index: LogIndex,
    tokenizer: Tokenizer,
    *,
    complete: Complete | None = None,
    settings: Mapping[str, Any] | None = None,
) -> CompactionState:
    """A fresh compaction state over the view of ``index``'s log."""
    kinds, members = index.layout.slots()
    estimate = index.estimates(tokenizer)
    return CompactionState(
        kinds, members, tokenizer=tokenizer, estimate=estimate, complete=complete, settings=settings
    )


def _checked(
    name: str,
    strategy: CompactionStrategy,
    tokenizer: Tokenizer | None,
    settings: Mapping[str, Any] | None,
) -> tuple[Tokenizer, Mapping[str, Any] | None]:
    """``name``'s strategy, tokenizer (or the default) and settings, checked."""
    check_strategy(f"{name}: strategy", strategy)
    if tokenizer is not None and not counts_tokens(tokenizer):
        raise ConfigurationError(
            f"{name}: tokenizer must be {TOKENIZER} or None, not {wrong_value(tokenizer)}"
        )
    if settings is not None:
        settings = check_settings(f"{name}: settings", settings)
    return DEFAULT_TOKENIZER if tokenizer is None else tokenizer, settings


async def _run(
    messages: Sequence[Message],
    strategy: CompactionStrategy,
    tokenizer: Tokenizer,
    complete: Complete | None,
    settings: Mapping[str, Any] | None,
    *,
    keep: bool = True,
) -> CompactionState:
    """The state ``strategy`` leaves over ``messages`` (their index kept unless not ``keep``)."""
    index = LogIndex.of(messages, keep=keep)
    state = compaction_state(index, tokenizer, complete=complete, settings=settings)
    await strategy.compact(state)
    return state


async def _spanned(
    name: str,
    messages: Sequence[Message],
    strategy: CompactionStrategy,
    tokenizer: Tokenizer | None,
    complete: Complete | None,
    settings: Mapping[str, Any] | None,
) -> CompactionState:
    """``_run`` of ``name``'s arguments, checked, in a compaction's span, named as the run
    it may serve is; without the view's figures, which would take an estimate of every
    message of a view a strategy may size from its newest end alone."""
    counter, settings = _checked(name, strategy, tokenizer, settings)
    log = check_history(messages, "messages")
    with requested_compaction(logs.current()) as found:
        state = await _run(log, strategy, counter, complete, settings)
        found.summary = state.summary_outcome
    return state


async def apply_compaction(
    messages: Sequence[Message], strategy: CompactionStrategy, *, tokenizer: Tokenizer | None = None
) -> tuple[Message, ...]:
    """The view ``strategy`` run once gives of ``messages`` (a log or a view, untouched),
    in a ``littleghost.context.compaction`` span (``compaction_records`` too).

    Args:
        messages: The conversation.
        strategy: What to do; a summarizing one needs ``Summarization(model=...)``.
        tokenizer: Counts tokens; default ``CharacterEstimator()``.

    Raises:
        ConfigurationError: A bad ``strategy`` or ``tokenizer``, or ``messages`` that
            ``run(history=)`` would refuse.
    """
    state = await _spanned("apply_compaction", messages, strategy, tokenizer, None, None)
    return tuple(state.view())


async def compaction_records(
    messages: Sequence[Message],
    strategy: CompactionStrategy,
    *,
    tokenizer: Tokenizer | None,
    complete: Complete | None = None,
    settings: Mapping[str, Any] | None = None,
) -> tuple[Message, ...]:
    """The records that make the view of ``messages`` ``strategy``'s; ``()``: nothing to do.

    Args:
        messages: The conversation (a log or a view, untouched).
        strategy: What to do.
        tokenizer: Counts tokens; ``None`` for ``CharacterEstimator()``.
        complete: Makes a summary call for a ``Summarization`` without a model of its own
            (in a run, ``RunContext.complete``).
        settings: Provider settings the summary call starts from (its output cap and
            tool settings replaced).

    Raises:
        ConfigurationError: As ``apply_compaction``, or bad ``settings``.
    """
    state = await _spanned("compaction_records", messages, strategy, tokenizer, complete, settings)
    return state.records()


async def compact_session(
    store: SessionStore,
    session_id: str,
    strategy: CompactionStrategy,
    *,
    tokenizer: Tokenizer | None = None,
    settings: Mapping[str, Any] | None = None,
) -> tuple[Message, ...]:
    """Append ``strategy``'s records to a stored session's log, holding the session as a run
    does, and return them; a summarizing strategy needs ``Summarization(model=...)``.

    Args:
        store: The session store.
        session_id: The session to compact.
        strategy: What to do.
        tokenizer: Counts tokens; ``None`` for ``CharacterEstimator()``.
        settings: Provider settings the summary call starts from (its output cap and
            tool settings replaced), as a run's ``agent.run_settings()`` gives them.

    It is a ``littleghost.context.compaction`` span, its summary calls' ``chat`` spans
    under it (docs/context.md: "Telemetry").

    Raises:
        ConfigurationError: Not a session store, bad keywords (as
            ``compaction_records``), or a stored log a run of the session refuses
            (``check_stored``).
        TypeError, UnstorableValueError: ``session_id`` is one no session is written to
            (as ``run()`` refuses it), before any summary call.
        SessionBusyError: Called from inside a run of the same session.
        UnknownSessionError: The store has no such session.
        CompactionError: The records would not make the view smaller (``check_smaller``);
            nothing is appended.
        ProviderError: The summary call's, once its retries are spent.
        ProtocolError, OutputLimitError: The summary came back empty, or cut at its cap
            (nothing is appended).
    """
    check_store("compact_session: store", store)
    session_id = check_session_id(session_id)  # written to: before any summary call
    counter, settings = _checked("compact_session", strategy, tokenizer, settings)
    stop = anyio.current_effective_deadline()
    grace = Grace(DEFAULT_GRACE, None if math.isinf(stop) else stop)
    with requested_compaction(telemetry.conversation_attributes(session_id)) as found:
        async with holding(hold_session(store, session_id), grace):  # released as a run's
            where = f"session {session_id!r}"
            log = distinct_ids(await store.load(session_id), where)
            if not log:
                raise UnknownSessionError(
                    f"compact_session: no session {session_id!r} in the store",
                    session_id=session_id,
                )
            check_stored(log, where)  # as a run of the session checks it
            # loaded for this call alone: its index is not kept
            state = await _run(log, strategy, counter, None, settings, keep=False)
            records = state.records()
            found.summary = state.summary_outcome
            found.change = view_change(log, records, counter)
            if records:
                check_smaller(found.change)
                await store.append(session_id, records)
    return records


def check_smaller(change: ViewChange) -> None:
    """``CompactionError`` unless a compaction's records make the view smaller
    (``change``): appended, they could never be taken back."""
    if change.after >= change.before:
        raise CompactionError(
            f"the compaction would not make the view smaller (about {change.before} -> "
            f"{change.after} tokens); nothing was appended"
        )
