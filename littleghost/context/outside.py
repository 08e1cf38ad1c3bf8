"""``@manage_context`` outside a run: what a run's first request would be
(``preview_request``) and the records a compaction would append now (``managed_records``,
``compact_log``), as a run decides them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attrs import evolve, frozen

from littleghost import telemetry
from littleghost._validators import is_number, wrong_value
from littleghost.context.attempts import Requested, requested_compaction, view_change
from littleghost.context.budget import BudgetReport, fit_sized
from littleghost.context.calibration import Calibration, request_size, scale_for
from littleghost.context.config import ContextManagement, context_window
from littleghost.context.index import LogIndex
from littleghost.context.management import (
    clip_results,
    default_compaction,
    kept_hooked,
    managed_state,
    next_summary_at,
    pinned_slots,
    remembered,
    summary_waits,
)
from littleghost.context.strategies import Complete, prepared
from littleghost.context.tokens import DEFAULT_TOKENIZER, schema_estimate
from littleghost.errors import ConfigurationError
from littleghost.log_rules import check_history
from littleghost.messages import Message
from littleghost.models.base import Model, ModelRequest, capped, prepare

if TYPE_CHECKING:
    from littleghost.agent import Agent

__all__ = ["RequestPreview", "compact_log", "managed_records", "preview_request"]


async def compact_log(
    agent: Agent, messages: Sequence[Message], *, share: float = 0.5
) -> tuple[Message, ...]:
    """The records ``agent``'s ``@manage_context`` appends to compact ``messages`` now,
    whatever its threshold (a ``littleghost.context.compaction`` span; the summary call is
    a ``chat`` span under it, in the metrics, with no deadline).

    Raises:
        ConfigurationError: ``share`` is not in (0, 1), no ``@manage_context``, or
            ``messages`` that ``run(history=)`` would refuse, but for a tool message
            whose results answer no call: left out of the view, as a run of a session
            holding it leaves it (``check_stored``).
        ProviderError: The summary call's, once its retries are spent.
        ProtocolError, OutputLimitError: The summary came back empty, or cut at its cap.
    """
    if not (is_number(share) and 0 < share < 1):
        raise ConfigurationError(
            f"compact_log: share must be a number in (0, 1), not {wrong_value(share)}"
        )
    settings = agent.run_settings()  # checked as a run's: context_management's value too
    config = agent.context_management
    if config is None:
        raise ConfigurationError(f"{agent.name} has no @manage_context: nothing to compact with")
    log = check_history(messages, "messages", stored=True)
    with requested_compaction(telemetry.run_names(agent.name)) as found:
        async with agent._models.use(  # closed here if given up
            agent._resolved_model(), agent.cleanup_grace, declared=agent._model_string()
        ) as model:
            if config.summarize and config.context_window_override is None:
                await prepare(model)  # a local model learns its window there; else at its call
            found.window = context_window(model, config)
            records = await managed_records(
                log,
                config,
                window=found.window,
                complete=prepared(
                    model, max_retries=agent.max_retries, capture_content=agent.capture_content
                ),
                settings=settings,
                share=share,
                max_tool_result_tokens=agent.max_tool_result_tokens,
                model=model,
                found=found,
            )
        found.change = view_change(log, records, config.tokenizer)
    return records


async def managed_records(
    messages: Sequence[Message],
    config: ContextManagement,
    *,
    window: int,
    complete: Complete,
    settings: Mapping[str, Any],
    share: float = 0.5,
    max_tool_result_tokens: int | None = None,
    model: Model | None = None,
    found: Requested | None = None,
) -> tuple[Message, ...]:
    """The records ``config`` appends to compact ``messages`` now in ``window`` (its
    ``strategy``, else the default aiming at ``share`` of their estimate) on the view as
    ``preview_request`` shapes it before a question to come (the log's last turn as
    history, as the next run takes it); ``()`` when nothing is to compact. How a summary
    came back is told to ``found``, a compaction's outside runs."""
    if not config.summarize:
        return ()
    index = LogIndex.of(messages)
    view = ModelRequest(index.layout.messages(), (), settings)

    ahead = Message.user("")  # the next run's question: the log's last turn is history
    shaped = preview_request(
        evolve(view, messages=(*view.messages, ahead)),
        messages,
        config,
        window,
        max_tool_result_tokens=max_tool_result_tokens,
        model=model,
    ).request
    shaped = evolve(shaped, messages=[m for m in shaped.messages if m.id != ahead.id])
    if shaped.messages != view.messages:
        index = index.over(shaped.messages)
    state = managed_state(index, config, window, complete, settings)
    state.pinned = pinned_slots(index)
    if config.strategy is not None:
        await config.strategy.compact(state)
    else:
        await default_compaction(state, config, window, int(state.tokens * share))
    if found is not None:
        found.summary = state.summary_outcome
    return state.records()


@frozen
class RequestPreview:
    """What ``preview_request`` found: the request a run's first model call would send
    (before the class's own hooks), and the figures ``@manage_context`` decides on.

    Attributes:
        message_tokens: The estimate of each of the request's messages.
        schema_tokens: The estimate of its tool schemas and prompt settings.
        estimated_tokens: The estimate the threshold is compared with (the conversation
            scaled by the log's calibration), ``max_tokens`` and ``hooked_tokens`` included.
        threshold_tokens: The smallest estimate at which a compaction is due (``None``
            without ``@manage_context`` or with ``summarize=False``).
        waits_until: The size the request must reach before the next summary call, after
            a compaction that left it near the threshold (``next_summary_at``).
        compaction_due: The call would try to compact first (it may still find nothing to
            compact, and record that it failed).
        budget: The bounded view's figures, with a ``PromptBudget``.
        hooked_tokens: What the class's own hooks are taken to add to the next call
            (``kept_hooked``), which the run sizes its first request with.
    """

    request: ModelRequest
    message_tokens: tuple[int, ...]
    schema_tokens: int
    estimated_tokens: int
    threshold_tokens: int | None
    waits_until: int | None
    compaction_due: bool
    budget: BudgetReport | None
    hooked_tokens: int = 0


def preview_request(
    request: ModelRequest,
    log: Sequence[Message],
    config: ContextManagement | None,
    window: int,
    *,
    max_tool_result_tokens: int | None = None,
    model: Model | None = None,
) -> RequestPreview:
    """What ``@manage_context``'s ``before_model`` hook makes of ``request`` (the
    instructions and the view of ``log``) at a run's first model call, without a model
    call: tool results clipped, the view bounded (without memories), sizes by the
    calibration earlier runs left for ``model`` (``None``: any) and with its default
    output cap (``capped``), and whether a compaction is due in ``window``.

    Raises:
        ConfigurationError: The configuration leaves no room to compact in ``window``.
        PromptBudgetError: The budget's mandatory part does not fit.
    """
    if config is not None:
        config.check_window(window)
    if model is not None:  # as a run sets it
        request = evolve(request, settings=capped(request.settings, model))
    index = LogIndex.of(request.messages)
    tokenizer = DEFAULT_TOKENIZER if config is None else config.tokenizer
    report: BudgetReport | None = None
    if config is not None and max_tool_result_tokens is not None:
        request = clip_results(request, index, max_tool_result_tokens)
    estimates = index.estimates(tokenizer)
    learned_for = None if model is None else scale_for(model, tokenizer)
    after, scale = remembered(log, learned_for) if config is not None else (None, 1.0)
    calibrated = Calibration(scale=scale)  # as the next run starts
    hooked = 0 if config is None else kept_hooked(log, window)
    if config is not None and config.budget is not None:
        budget = config.budget

        def size(view: ModelRequest) -> int:
            return request_size(view, estimates, calibrated) - (view.max_tokens or 0) + hooked

        request, report = fit_sized(
            request,
            budget,
            budget.limit(window, request.max_tokens),
            budget.room(window, request.max_tokens),
            size,
            summary_tokens=config.summary_cap(window),
            index=index,
        )
    sizes = tuple(map(estimates, request.messages))
    schemas = schema_estimate(request, tokenizer)
    estimated = request_size(request, estimates, calibrated) + hooked
    if config is None or not config.summarize:
        return RequestPreview(request, sizes, schemas, estimated, None, None, False, report, hooked)
    threshold = config.threshold(window)
    waits = None if after is None else next_summary_at(after, config, window)
    due = estimated >= threshold and not summary_waits(estimated, waits, request, window)
    return RequestPreview(request, sizes, schemas, estimated, threshold, waits, due, report, hooked)
