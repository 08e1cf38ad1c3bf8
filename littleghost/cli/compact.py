"""``sessions compact``: compact a stored session now with an agent class's context
configuration, or show what that would cover without writing (``--dry-run``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from attrs import asdict

from littleghost import telemetry
from littleghost.agent import Agent
from littleghost.cli.agents import agent_spec
from littleghost.cli.holding import held
from littleghost.cli.log import describe_record, positions
from littleghost.cli.output import Output, shell_word, shown
from littleghost.cli.stores import StoreAddress
from littleghost.cli.window import Window, run_model, window_of
from littleghost.context.attempts import ViewChange, requested_compaction, view_change
from littleghost.context.compaction import check_smaller
from littleghost.context.config import context_config
from littleghost.context.outside import managed_records
from littleghost.context.strategies import prepared
from littleghost.errors import CleanupError, ConfigurationError, UnknownSessionError
from littleghost.log_rules import check_stored
from littleghost.messages import Message
from littleghost.models import Model, ModelRequest, ModelResponse, StopReason, Usage
from littleghost.models.base import prepare
from littleghost.sessions.base import check_session_id, distinct_ids

__all__ = ["DRY_RUN_SUMMARY", "compact_document", "print_compaction"]

DRY_RUN_SUMMARY = "(dry run: no summary was written)"
"""What a dry run's summary says: it calls no model."""

Advance = Callable[[int, str], None]
"""Moves a progress bar on: ``advance(steps_done, what_comes_next)``."""


async def _write_nothing(request: ModelRequest, *, model: object = None) -> ModelResponse:
    """Answers a summary call without a model: a dry run shows what a compaction would
    cover, not what its summary would say."""
    return ModelResponse(Message.assistant(DRY_RUN_SUMMARY), StopReason.END_TURN, Usage(0, 0))


async def compact_document(
    address: StoreAddress,
    session_id: str,
    agent: Agent,
    window: int | None,
    *,
    dry_run: bool,
    advance: Advance,
    notice: bool,
) -> dict[str, Any]:
    """Compact the session now, whatever the threshold, as ``agent``'s class would
    (``compact_log``), holding it as a run does (with ``notice``, a wait past
    ``WAIT_NOTICE`` for a run under way is said); with ``dry_run``, only read it and call
    no model. The model is not made when nothing is to cover in a window known without
    it. The document says what the records cover and what they do to the view. A
    compaction that makes the model is a ``littleghost.context.compaction`` span.

    Raises:
        ConfigurationError: The class has no ``@manage_context``, or the stored log is
            one a run of the session refuses (``check_stored``).
        UnstorableValueError: Not ``dry_run``, and ``session_id`` is one no session is
            written to (an earlier version's longer id), before any summary call.
        UnknownSessionError: The store has no such session.
        CompactionError: The records would not make the view smaller
            (``check_smaller``; nothing is appended).
    """
    config = context_config(agent)
    if config is None:
        raise ConfigurationError(f"{agent.name} has no @manage_context: nothing to compact with")
    if not dry_run:
        check_session_id(session_id)  # written to: refused before a summary is paid for
    advance(0, "reading the session")
    # read-only first: an unknown session fails before the model starts or the store is
    # opened for writing
    where = f"session {shell_word(session_id, in_prose=True)}"
    log = distinct_ids([entry.message for entry in await address.log(session_id)], where)
    check_stored(log, where)  # as a run of the session checks it
    # The model is made only to summarize or to learn its window: with the window known
    # without it, and the view sized as with it (a budget's is by a calibration kept per
    # model), nothing to cover needs none.
    declared = run_model(agent)  # a run's: a class's own resolve_model() is called here
    known = window is not None or config.context_window_override is not None
    sized_alike = config.budget is None or isinstance(declared, Model)
    if dry_run or not config.summarize or (known and sized_alike):
        advance(1 if dry_run else 0, "choosing what to cover")
        used = window_of(agent, window, declared)
        records = await managed_records(
            log,
            config,
            window=used.tokens,
            complete=_write_nothing,
            settings=agent.run_settings(),
            max_tool_result_tokens=agent.max_tool_result_tokens,
            model=declared if isinstance(declared, Model) else None,  # none made here
        )
        if dry_run or not records:  # summarize=False covers nothing
            change = view_change(log, records, config.tokenizer)
            if records:  # even its short placeholder summary would not make the view smaller
                check_smaller(change)
            advance(1, "done")
            return _document(session_id, agent, used, log, records, change, dry_run=dry_run)
    # its span, the parent of its summary calls' spans, named as they and its log lines are
    with requested_compaction(telemetry.run_names(agent.name, session_id)) as found:
        async with agent:
            model = declared if isinstance(declared, Model) else agent._resolved_model()
            # started here only to learn its window; else by the first summary call, if any
            if window is None and config.context_window_override is None:
                advance(1, "starting the model")
                await prepare(model)
            else:
                advance(1, "")
            used = window_of(agent, window, model, started=True)
            found.window = used.tokens
            advance(1, "waiting for the session")  # a run may hold it
            async with (
                address.open(read_only=False) as store,
                held(store, session_id, notice=notice),
            ):
                advance(0, "summarizing")
                log = distinct_ids(await store.load(session_id), where)  # now that it is held
                if not log:
                    raise UnknownSessionError(
                        f"no session {shell_word(session_id, in_prose=True)} in {address}",
                        session_id=session_id,
                    )
                check_stored(log, where)
                records = await managed_records(
                    log,
                    config,
                    window=used.tokens,
                    complete=prepared(
                        model, max_retries=agent.max_retries, capture_content=agent.capture_content
                    ),
                    settings=agent.run_settings(),
                    max_tool_result_tokens=agent.max_tool_result_tokens,
                    model=model,
                    found=found,
                )
                found.change = view_change(log, records, config.tokenizer)
                if records:
                    check_smaller(found.change)
                try:
                    await agent.aclose()  # first: a Ctrl-C while the model closes writes nothing
                except CleanupError as failure:  # the summary is paid for: stored all the same
                    if not records:
                        raise
                    await store.append(session_id, records)
                    raise CleanupError(f"the compaction was appended, but {failure}") from failure
                advance(1, "appending")
                await store.append(session_id, records)
            advance(1, "done")
    return _document(session_id, agent, used, log, records, found.change, dry_run=False)


def _document(
    session_id: str,
    agent: Agent,
    window: Window,
    log: Sequence[Message],
    records: Sequence[Message],
    change: ViewChange,
    *,
    dry_run: bool,
) -> dict[str, Any]:
    where = {message.id: position for position, message in enumerate(log)}
    return {
        "session": session_id,
        "agent": agent_spec(agent),
        "dry_run": dry_run,
        "window": asdict(window),
        "records": [
            {"id": None if dry_run else record.id, **(describe_record(record, where) or {})}
            for record in records
        ],
        "view": {  # the view's messages and estimated tokens before and after the records
            "messages_before": change.shown_before,
            "messages_after": change.shown_after,
            "tokens_before": change.before,
            "tokens_after": change.after,
        },
    }


def print_compaction(output: Output, document: dict[str, Any]) -> None:
    """What was (or would be) appended, and what it does to the view."""
    session, records = shell_word(document["session"], in_prose=True), document["records"]
    window = document["window"]
    context = f"window {window['tokens']} tokens, {shown(window['source'])}"
    if not records:
        output.line(f"nothing to compact in session {session} ({context})")
        return
    verb = "would append" if document["dry_run"] else "appended"
    count = f"{len(records)} record" + ("s" if len(records) > 1 else "")
    output.line(f"{verb} {count} to session {session} ({context}):")
    for record in records:
        name = record["kind"] if record["id"] is None else f"{record['kind']} {record['id']}"
        covered = positions(record["covers_positions"])
        output.line(f"  {name} covering {len(record['covers'])} messages: {covered}")
    view = document["view"]
    output.line(
        f"view: {view['messages_before']} -> {view['messages_after']} messages, about "
        f"{view['tokens_before']} -> {view['tokens_after']} tokens"
    )
    if document["dry_run"]:
        output.line(
            output.style("dry run: nothing was written and no model was called", fg="yellow")
        )
