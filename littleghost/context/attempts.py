"""What a compaction attempt reports: its stream events, its span event and its log line
(no content)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
from attrs import define, field
from opentelemetry import trace

from littleghost import logs, telemetry
from littleghost.cleanup import cancelled_here
from littleghost.errors import CompactionError
from littleghost.events import CompactionFinished, CompactionStarted
from littleghost.models.base import Usage

if TYPE_CHECKING:
    from littleghost.run import RunContext

__all__ = ["attempt", "compaction_event"]

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
            )
        )

    await context.emit(CompactionStarted(reason, estimated, window))
    outcome = Outcome()
    try:
        yield outcome
    except anyio.get_cancelled_exc_class() as error:
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
        raise
    except Exception as error:  # a DeadlineExceededError (no time to retry) too
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
    error = attributes.get(telemetry.ERROR_TYPE)
    session = context.session_id
    skipped = attributes.get(telemetry.COMPACTION_SKIPPED)
    logger.info(
        "context compaction %s for %s%s (reason=%s, tokens %d -> %s, window %d%s%s%s%s)%s",
        outcome,
        context.agent.name,
        "" if session is None else f" in session {session!r}",
        reason,
        estimated,
        attributes.get(telemetry.COMPACTION_ESTIMATED_AFTER),
        window,
        "" if error is None else f", error={error}",
        "" if (why := attributes.get(telemetry.COMPACTION_ERROR)) is None else f": {why}",
        ", without a model" if telemetry.COMPACTION_FALLBACK in attributes else "",
        ""
        if (cut := attributes.get(telemetry.COMPACTION_CUT_TO)) is None
        else f", tool results cut to {cut} tokens",
        "" if skipped is None else f": {skipped}",
        extra={"littleghost": attributes},
    )
