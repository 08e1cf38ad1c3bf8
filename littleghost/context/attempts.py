"""What a compaction reports: a run's attempt its stream events, its span event and its
log line; one outside runs its own span and log line (no content)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import anyio
from attrs import define, field, frozen
from opentelemetry import trace

from littleghost import logs, telemetry
from littleghost.cleanup import cancellation_turned_into, cancelled_here, run_deadline
from littleghost.context.index import LogIndex
from littleghost.context.tokens import Tokenizer
from littleghost.context.view import build_view
from littleghost.errors import CompactionError
from littleghost.events import CompactionFinished, CompactionStarted
from littleghost.messages import Message
from littleghost.models.base import Usage

if TYPE_CHECKING:
    from littleghost.run import RunContext

__all__ = [
    "REQUESTED",
    "Requested",
    "ViewChange",
    "attempt",
    "compaction_event",
    "requested_compaction",
    "view_change",
]

logger = logs.logger("littleghost.context")


@define(eq=False)
class Outcome:
    """What a compaction attempt achieved, set by its body."""

    after: int | None = None
    removed: int = 0
    summary: str | None = None  # how the summary made came back (``SUMMARY_COMPLETE``, ...)
    cut_to: int | None = None  # the tokens the request's tool results were cut to, if they were
    before: int | None = None
    """The size before, in the units of ``after`` when a summary call changed the scale."""
    usage: Usage = field(factory=Usage)
    """What the attempt's own model calls used."""


@asynccontextmanager
async def attempt(
    context: RunContext, reason: str, estimated: int, window: int, fallback: bool
) -> AsyncIterator[Outcome]:
    """One compaction attempt: its stream events, span event and log line, and on success
    the compacted mark on the next chat span."""

    async def finish(result: str, done: Outcome, error: Exception | None) -> None:
        kind = None if error is None else telemetry.error_type(error)
        why = str(error) if isinstance(error, CompactionError) else None  # figures only
        extra = {
            telemetry.COMPACTION_REMOVED: done.removed,
            telemetry.COMPACTION_ESTIMATED_AFTER: done.after,
            telemetry.ERROR_TYPE: kind,
            telemetry.COMPACTION_ERROR: why,
            telemetry.COMPACTION_FALLBACK: fallback or None,
            telemetry.COMPACTION_SUMMARY: done.summary,
            telemetry.COMPACTION_CUT_TO: done.cut_to,
        }
        size = estimated if done.before is None else done.before
        compaction_event(context, reason, result, size, window, extra)
        await context.emit(
            CompactionFinished(
                reason,
                result,
                done.removed,
                done.after,
                kind,
                done.usage,
                done.summary,
                fallback,
                done.cut_to,
                why,
                size,
            )
        )

    def stopped(error: BaseException) -> None:
        # the caller's cancellation (cancelled), the run's deadline (an error, as the spans
        # it cuts: DeadlineExceededError), else a stray one (an error); no stream event: a
        # cancelled run can await nothing
        kind = (
            telemetry.failure_type(error, context.grace.earliest_deadline())
            if cancelled_here()
            else telemetry.error_type(error)
        )
        extra = {telemetry.COMPACTION_FALLBACK: fallback or None, telemetry.ERROR_TYPE: kind}
        compaction_event(
            context, reason, "cancelled" if kind is None else "error", estimated, window, extra
        )

    await context.emit(CompactionStarted(reason, estimated, window))
    outcome = Outcome()
    try:
        yield outcome
    except anyio.get_cancelled_exc_class() as error:
        stopped(error)
        raise
    except Exception as error:  # a DeadlineExceededError (no time to retry) too
        if cancellation_turned_into(error):  # a client's "connection closed": stopped
            stopped(error)
            await anyio.lowlevel.checkpoint()  # the cancellation goes on, which no
            # compaction's failure handling swallows (the run went on to its next wait)
        failed = Outcome(before=outcome.before, usage=outcome.usage)
        await finish("error", failed, error)
        raise
    assert outcome.after is not None
    context.mark_compacted()
    await finish("completed", outcome, None)


def compaction_event(
    context: RunContext,
    reason: str,
    outcome: str,
    estimated: int,
    window: int,
    extra: Mapping[str, Any],
) -> None:
    """The ``littleghost.context.compaction`` span event, ``extra`` attributes left out
    when None, and its log line (no content), naming the run's agent and session, with
    the event's attributes as the record's ``littleghost`` extra (beside those names)."""
    attributes = {
        telemetry.COMPACTION_REASON: reason,
        telemetry.COMPACTION_OUTCOME: outcome,
        telemetry.COMPACTION_ESTIMATED: estimated,
        telemetry.COMPACTION_WINDOW: window,
        **{key: value for key, value in extra.items() if value is not None},
    }
    trace.get_current_span().add_event(telemetry.COMPACTION_EVENT, attributes)
    _log(attributes, telemetry.run_names(context.agent.name, context.session_id))


def _log(attributes: Mapping[str, Any], names: Mapping[str, str]) -> None:
    """A compaction's log line: its outcome, the agent and session ``names`` name, and
    the figures of its span event's (or span's) ``attributes``, also the record's
    ``littleghost`` extra (beside those names)."""
    agent, session = names.get(telemetry.AGENT_NAME), names.get(telemetry.CONVERSATION_ID)
    window = attributes.get(telemetry.COMPACTION_WINDOW)
    before = attributes.get(telemetry.COMPACTION_ESTIMATED)
    after = attributes.get(telemetry.COMPACTION_ESTIMATED_AFTER)
    error = attributes.get(telemetry.ERROR_TYPE)
    skipped = attributes.get(telemetry.COMPACTION_SKIPPED)
    logger.info(
        "context compaction %s%s%s (reason=%s%s%s%s%s%s%s)%s",
        attributes[telemetry.COMPACTION_OUTCOME],
        "" if agent is None else f" for {agent}",
        "" if session is None else f" in session {session!r}",
        attributes[telemetry.COMPACTION_REASON],
        "" if before is None else f", tokens {before} -> {after}",
        "" if window is None else f", window {window}",
        "" if error is None else f", error={error}",
        "" if (why := attributes.get(telemetry.COMPACTION_ERROR)) is None else f": {why}",
        ", without a model" if telemetry.COMPACTION_FALLBACK in attributes else "",
        ""
        if (cut := attributes.get(telemetry.COMPACTION_CUT_TO)) is None
        else f", tool results cut to {cut} tokens",
        "" if skipped is None else f": {skipped}",
        extra={"littleghost": attributes},
    )


REQUESTED = "requested"
"""The ``littleghost.compaction.reason`` of a compaction outside runs: asked for, whatever
the threshold."""


@frozen
class ViewChange:
    """What records do to the view of a log: its estimate before and after them, how
    many of its messages they leave out (summarized, collapsed or dropped), and how many
    messages it shows before and after them."""

    before: int
    after: int
    removed: int
    shown_before: int
    shown_after: int


def view_change(
    log: Sequence[Message], records: Sequence[Message], tokenizer: Tokenizer
) -> ViewChange:
    """What ``records``, appended, do to the view of ``log`` (estimated with the figures
    the engine keeps of ``log``: the compaction that made them estimated most already)."""
    index = LogIndex.of(log, keep=False)
    estimates = index.estimates(tokenizer)
    before, after = index.layout.messages(), build_view([*log, *records])
    kept = {message.id for message in after}
    removed = sum(message.id not in kept for message in before)
    return ViewChange(
        estimates.total(before), estimates.total(after), removed, len(before), len(after)
    )


@define(eq=False)
class Requested:
    """What a compaction outside runs found, set by its body: the ``window`` it compacted
    in (when it knows one), what its records do to the view (``change``) and how a
    summary it made came back (``summary``)."""

    window: int | None = None
    change: ViewChange | None = None
    summary: str | None = None


@contextmanager
def requested_compaction(names: Mapping[str, str]) -> Iterator[Requested]:
    """A compaction outside runs (``compact_session``, ``compact_log``, ``sessions
    compact``; ``apply_compaction`` and ``compaction_records``, in a run too): its
    ``littleghost.context.compaction`` span, named by ``names`` (the agent, the session)
    as its summary calls' ``chat`` spans under it and its log lines are, with the
    attributes a run's compaction event has (reason ``requested``), ERROR with
    ``error.type`` when it fails (outcome ``error``, ``DeadlineExceededError`` when the
    deadline of a run it is part of cuts it; ``cancelled`` when cancelled), and its log
    line."""
    started = {**names, telemetry.COMPACTION_REASON: REQUESTED}
    with (
        logs.naming(names),
        telemetry.open_span(
            telemetry.COMPACTION_SPAN, attributes=started, deadline=run_deadline
        ) as span,
    ):
        found = Requested()
        try:
            yield found
        except BaseException as error:
            kind = telemetry.failure_type(error, run_deadline())
            why = str(error) if isinstance(error, CompactionError) else None  # figures only
            done = {telemetry.ERROR_TYPE: kind, telemetry.COMPACTION_ERROR: why}
            _end(span, names, "cancelled" if kind is None else "error", found, done)
            raise
        _end(span, names, "completed", found, {})


def _end(
    span: trace.Span,
    names: Mapping[str, str],
    outcome: str,
    found: Requested,
    extra: Mapping[str, Any],
) -> None:
    """Set a compaction's outcome and figures on its own ``span`` (those not known left
    out; a failed one removed nothing), and log it."""
    change = found.change
    completed = outcome == "completed"
    figures = {
        telemetry.COMPACTION_OUTCOME: outcome,
        telemetry.COMPACTION_ESTIMATED: None if change is None else change.before,
        telemetry.COMPACTION_ESTIMATED_AFTER: change.after if completed and change else None,
        telemetry.COMPACTION_REMOVED: (None if change is None else change.removed)
        if completed
        else 0,
        telemetry.COMPACTION_WINDOW: found.window,
        telemetry.COMPACTION_SUMMARY: found.summary,
        **extra,
    }
    attributes = {key: value for key, value in figures.items() if value is not None}
    span.set_attributes(attributes)
    _log({telemetry.COMPACTION_REASON: REQUESTED, **attributes}, names)
