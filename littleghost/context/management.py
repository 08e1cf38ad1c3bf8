"""``@manage_context``: keep a conversation inside the model's context window.

This module decides *when* to compact and recovers from overflow errors; *how* is a
strategy (default ``Summarization``). docs/context.md states the rules.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any, TypeVar, overload

import attrs
from attrs import define, frozen

from littleghost import telemetry
from littleghost._validators import is_int
from littleghost.capabilities import (
    Capability,
    CapabilityHook,
    add_capability,
    check_agent_subclass,
)
from littleghost.context.attempts import attempt, compaction_event
from littleghost.context.budget import (
    BudgetReport,
    PromptBudget,
    fit_sized,
    load_memories,
    view_only,
)
from littleghost.context.calibration import (
    asked,
    calibrated_size,
    calibration,
    estimate_tokens,
    excess,
    kept_scale,
    learn_added,
    learn_answer,
    learn_scale,
    learn_turn,
    margin,
    model_count,
    real_size,
    resume,
    scale_for,
    turn_start,
)
from littleghost.context.compaction import compaction_state
from littleghost.context.config import (
    ContextManagement,
    ContextOptions,
    belied_window,
    check_result_cap,
    context_config,
    context_window,
    reported_window,
)
from littleghost.context.groups import SUMMARY, SYSTEM
from littleghost.context.index import LogIndex, starts_with
from littleghost.context.records import is_record, record_covers
from littleghost.context.strategies import (
    CompactionState,
    Complete,
    Summarization,
    ToolResultCompaction,
    TurnExcerpts,
    mask_tool_results,
    started,
)
from littleghost.context.tokens import Tokenizer, schema_estimate
from littleghost.context.triggers import Trigger, messages_exceed, tokens_exceed
from littleghost.errors import (
    UNSWALLOWED,
    CompactionError,
    ConfigurationError,
    ContextWindowOverflowError,
    OutputLimitError,
    PromptBudgetError,
)
from littleghost.messages import Message, Role, ToolResult
from littleghost.models.base import ModelRequest, ModelResponse, billed, relayed
from littleghost.text import CHARS_PER_TOKEN, truncate_middle, weighed_length

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # a runtime name, for what evaluates the signature (typing.get_type_hints)
    from typing_extensions import Unpack

if TYPE_CHECKING:
    from littleghost.agent import Agent
    from littleghost.run import RunContext

__all__ = [
    "AFTER_KEY",
    "HOOKED_KEY",
    "REGROWTH",
    "clip_results",
    "default_compaction",
    "kept_hooked",
    "manage_context",
    "managed_state",
    "next_summary_at",
    "pinned_slots",
    "remembered",
    "summary_waits",
]

C = TypeVar("C", bound="type[Agent]")

REGROWTH = 0.1
"""After a compaction that left the request over the threshold, the share of the window
it must grow by before the next summary call (``next_summary_at``)."""
TARGET_SHARE = 0.8
"""A compaction aims at this share of the threshold, so it is not due again next turn."""
CUT_SHARE = 0.5
"""Overflow recovery cuts tool results until the request takes about this share of the window."""
CUT_FLOOR_TOKENS = 64
"""The shortest such a cut leaves a tool result."""
RECOUNTS = 3
"""How often recovery compacts again, without a model, a request the model counts over
the window, before a last try at the current request alone."""


@overload
def manage_context(cls: C, /) -> C: ...


@overload
def manage_context(cls: None = None, /, **options: Unpack[ContextOptions]) -> Callable[[C], C]: ...


def manage_context(
    cls: C | None = None, /, **options: Unpack[ContextOptions]
) -> C | Callable[[C], C]:
    """Keep an agent's conversations inside the model's context window.

    Use bare (``@manage_context``) or with the keywords of ``ContextManagement``
    (``ContextOptions`` types them). Invalid values, and unknown keywords, raise
    ``ConfigurationError`` when the class is defined.
    """
    accepted = sorted(field.name for field in attrs.fields(ContextManagement))
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ConfigurationError(
            f"manage_context got an unexpected keyword argument {unknown[0]!r}; it takes "
            f"{', '.join(accepted)}"
        )
    config = ContextManagement(**options)

    def decorate(target: C) -> C:
        check_agent_subclass(target, "@manage_context decorates")
        if "context_management" in vars(target):  # one would silently undo the other
            raise ConfigurationError(
                f"{target.__name__} is decorated with @manage_context twice: give all the "
                "options to one (a subclass may declare its own)"
            )
        check_result_cap(target, config.declared_window)
        setattr(target, "context_management", config)  # noqa: B010 - any Agent subclass
        hooks = (
            CapabilityHook("before_model", _compact_before_model),
            CapabilityHook("after_model", _calibrate_after_model),
            CapabilityHook("after_model_error", _compact_after_overflow),
        )
        add_capability(target, Capability("manage_context", hooks))
        return target

    return decorate(cls) if cls is not None else decorate


@define(eq=False)
class _Run:
    """What manage_context knows during one run (besides ``Calibration``)."""

    window: int = 0  # 0 until the run's first call
    overflow: tuple[int, ContextWindowOverflowError] | None = None
    tighter: tuple[int, int] | None = None  # (turn, limit): after an overflow without summaries
    bare: int | None = None  # the turn whose retry goes without memories (as a last resort)
    quiet_until: int | None = None  # no summary call until the estimate reaches this
    last_after: int = 0  # the size the last completed compaction left the request at
    last_compacted: ModelRequest | None = None  # and the request it left
    failed_at: int | None = None  # the size a compaction failed at (``AFTER_KEY``)
    cut_to: int | None = None  # what tool results are cut to for the rest of the run
    clipped: _Clipped | None = None  # the last request's ``clip_results``, to carry over
    passed: ModelRequest | None = None  # the request the hook passed on to the later hooks
    hooked: int = 0  # what the later hooks (the class's own) are taken to add (kept_hooked)
    last_hooked: int = 0  # what they added to the last call
    spent: bool = False  # the last compaction failed with nothing left to remove without a
    # model (the current request alone, its tool results cut as far as they go)


AFTER_KEY = "littleghost.compaction.tokens_after"
"""Metadata: the size a compaction left the request at (on its records) or failed at (on
the next answer), so a later run of the conversation knows if the next summary must wait."""


HOOKED_KEY = "littleghost.context.hooked"
"""Metadata of a model's answer: what the hooks after ``@manage_context``'s added to the
request it answered, in the model's tokens, which the next run starts from."""


def kept_hooked(log: Sequence[Message], window: int) -> int:
    """What the class's own hooks are taken to add to the next call: the least of what they
    added to the calls of ``log``'s two newest answers (``HOOKED_KEY``), so that a hook
    adding to one call alone (a retrieval on a run's first call) does not size the next;
    at most ``window``, 0 without."""
    return min(_hooked_lately(log, window))


def _hooked_lately(log: Sequence[Message], window: int) -> tuple[int, int]:
    """The ``HOOKED_KEY`` of ``log``'s newest answer and of the one before, each at most
    ``window`` (0 without one)."""
    answers = (m for m in reversed(log) if m.role is Role.ASSISTANT and not is_record(m))
    found = [m.metadata.get(HOOKED_KEY) for m in islice(answers, 2)]
    newest, before = (min(n, window) if is_int(n) and n > 0 else 0 for n in [*found, 0, 0][:2])
    return newest, before


def _run(context: RunContext, config: ContextManagement) -> _Run:
    state = context.state_for(_Run, _Run)
    if not state.window:
        state.window = context_window(context.model, config)
        config.check_window(state.window)
        check_result_cap(context.agent, state.window)
        learned_for = scale_for(context.model, config.tokenizer)
        after, scale = remembered(context.messages, learned_for)  # what earlier runs learned
        resume(context, scale)
        state.last_hooked, before = _hooked_lately(context.messages, state.window)
        state.hooked = min(state.last_hooked, before)
        state.quiet_until = None if after is None else next_summary_at(after, config, state.window)
    return state


def remembered(log: Sequence[Message], learned_for: str | None) -> tuple[int | None, float]:
    """What earlier runs left in ``log``: the newest ``AFTER_KEY``, if any, and the newest
    scale kept for ``learned_for`` (1.0 without one)."""
    after: int | None = None
    scale: float | None = None
    for message in reversed(log):
        if not message.metadata:  # most messages: a long log is walked whole without a record
            continue
        if after is None and is_int(message.metadata.get(AFTER_KEY)):
            after = message.metadata[AFTER_KEY]
        if scale is None:
            scale = kept_scale(message.metadata, learned_for)
        if after is not None and scale is not None:
            break
    return after, 1.0 if scale is None else scale


def clip_results(request: ModelRequest, index: LogIndex, max_tokens: int) -> ModelRequest:
    """The request with every tool result over ``max_tokens`` cut in the middle (the log
    keeps it whole)."""
    return _clip(request, index, max_tokens, None)[0]


@frozen(eq=False)
class _Clipped:
    """``clip_results`` of a request's ``messages`` to ``max_tokens``: the copies cut, by
    position, which the next request starting with the same message objects carries over."""

    messages: tuple[Message, ...]
    max_tokens: int
    cut: Mapping[int, Message]


def _clip(
    request: ModelRequest, index: LogIndex, max_tokens: int, carried: _Clipped | None
) -> tuple[ModelRequest, _Clipped]:
    """``clip_results``, what ``carried`` clipped carried over, and what to carry next."""
    limit = max_tokens * CHARS_PER_TOKEN
    messages, start, cut = request.messages, 0, {}
    if (
        carried is not None
        and carried.max_tokens == max_tokens
        and starts_with(messages, carried.messages)
    ):
        start, cut = len(carried.messages), dict(carried.cut)
    for position in range(start, len(messages)):
        message = messages[position]
        if message.role is not Role.TOOL:
            continue

        def make(message: Message = message) -> Message:
            if all(weighed_length(result.content) <= limit for result in message.tool_results):
                return message
            parts = [
                ToolResult(p.call_id, truncate_middle(p.content, max_tokens), p.is_error)
                if isinstance(p, ToolResult)
                else p
                for p in message.content
            ]
            return Message(message.role, parts, message.id, message.metadata)

        copy = index.derived(message, ("clip", max_tokens), make)
        if copy is not message:
            cut[position] = copy
    clipped = _Clipped(messages, max_tokens, cut)
    if not cut:
        return request, clipped
    shown = list(messages)
    for position, copy in cut.items():
        shown[position] = copy
    return attrs.evolve(request, messages=tuple(shown)), clipped


async def _calibrate_after_model(
    agent: object, response: ModelResponse, *, context: RunContext
) -> ModelResponse | None:
    """Calibrate by the turn's count; keep what it learned and a failed compaction's size
    in the answer's metadata."""
    config = context_config(agent)
    if config is None:  # ``context_management`` set to None on the agent: not managed
        return None
    state, hooked = _run(context, config), None
    if state.passed is not None:  # what the later hooks added, before the scale moves
        assert context.last_exchange is not None  # set by the call the hook follows
        hooked = _added(state.passed, context.last_exchange[0], context, config.tokenizer)
        state.hooked, state.last_hooked = min(hooked, state.last_hooked), hooked
        state.passed = None
    kept = learn_answer(response, context, config.tokenizer, state.window)
    if hooked:  # kept while they add something: the next run starts from it
        kept[HOOKED_KEY] = hooked
    if state.failed_at is not None:
        kept[AFTER_KEY], state.failed_at = state.failed_at, None
    if not kept:
        return None
    metadata = {**response.message.metadata, **kept}
    return attrs.evolve(response, message=attrs.evolve(response.message, metadata=metadata))


def _added(
    given: ModelRequest, sent: ModelRequest, context: RunContext, tokenizer: Tokenizer
) -> int:
    """How much larger (as calibrated, at least 0) ``sent`` is than ``given``, sized by the
    messages one holds and the other does not (message objects: most hooks append)."""
    if sent is given:
        return 0
    less: tuple[Message, ...] = ()
    more = sent.messages[len(given.messages) :]
    if not starts_with(sent.messages, given.messages):
        old, new = set(map(id, given.messages)), set(map(id, sent.messages))
        more = tuple(m for m in sent.messages if id(m) not in old)
        less = tuple(m for m in given.messages if id(m) not in new)
    larger = calibrated_size(attrs.evolve(sent, messages=more), context, tokenizer)
    return max(larger - calibrated_size(attrs.evolve(given, messages=less), context, tokenizer), 0)


async def _compact_before_model(
    agent: object, request: ModelRequest, *, context: RunContext
) -> ModelRequest | None:
    config = context_config(agent)
    if config is None:
        return None
    state = _run(context, config)
    original = request
    cuts = (getattr(agent, "max_tool_result_tokens", None), state.cut_to)
    if limits := [cut for cut in cuts if isinstance(cut, int)]:
        request, state.clipped = _clip(request, context.log_index, min(limits), state.clipped)
    report: BudgetReport | None = None
    if config.budget is not None:
        request, report = await _bounded(request, context, config, config.budget, state.hooked)
    elif _answer_room(request) >= state.window:
        raise ConfigurationError(_cap_fills(request, context, state.window))
    bounded = request
    if config.summarize:  # with what the later hooks added to the last call
        estimated = estimate_tokens(request, context, config.tokenizer) + state.hooked
        if estimated >= config.threshold(state.window):
            request = await _proactive(request, context, config, estimated)
    if report is not None and config.budget is not None:  # the figures of the request sent
        if request is not bounded:  # compacted since: the report's are of the bounded view
            tokenizer = config.budget.tokenizer
            estimates = context.log_index.estimates(tokenizer)
            sent = estimates.total(request.messages) + schema_estimate(request, tokenizer)
            report = attrs.evolve(
                report, messages_kept=len(request.messages), estimated_prompt_tokens=sent
            )
        context.annotate_next_call(report.span_attributes())
    state.passed = request
    return None if request is original else request


async def _proactive(
    request: ModelRequest, context: RunContext, config: ContextManagement, estimated: int
) -> ModelRequest:
    """Compact a request over the threshold, unless it has not regrown enough since the
    last attempt (``next_summary_at``; the skip is recorded); when that leaves it over
    the window (or no summary was made) by the model's count, or by an estimate a count
    of this run calibrated, go on as overflow recovery would, without the call the
    provider would refuse."""
    state = _run(context, config)
    window = state.window
    if summary_waits(estimated, state.quiet_until, request, window):
        why = (
            "the last compaction left the request near the threshold, or over it; the next "
            f"waits until it has grown to {state.quiet_until} tokens"
        )
        compaction_event(
            context, "threshold", "skipped", estimated, window, {telemetry.COMPACTION_SKIPPED: why}
        )
        return request
    target = _target(config, window)
    compacted, after, again = request, estimated, True
    state.last_compacted = None
    try:
        try:
            compacted = await _compact(request, context, config, "threshold", estimated, target)
            after = state.last_after
        except UNSWALLOWED:
            raise
        except Exception as error:  # no summary; over the window all the same, recovery's
            state.failed_at = estimated  # steps; recorded, unless those compact it
            # a summary cut twice, or none to make, would come out the same: not asked again
            again = not isinstance(error, (OutputLimitError, CompactionError))
        if over_window(after, compacted, window):  # a summary could not bring it under
            counted, calibrated = await model_count(compacted, context), calibration(context)
            over = calibrated.last is not None and calibrated.distrusted is None  # estimated
            safe: int | None = None
            # the model's count decides, when it counts, and teaches as an overflow's would
            room = _answer_room(compacted) + state.hooked
            if counted is not None and (over := counted + room > window):
                learned, added = await _learned(compacted, counted, context, config, window)
                after = counted + (compacted.max_tokens or 0) + state.hooked if learned else after
                safe = window if added else None
            if over:
                compacted = await _recover(
                    compacted,
                    context,
                    config,
                    after,
                    window,
                    safe,
                    counted is None,
                    "threshold",
                    summarize=again,
                )
                after = state.last_after
    except UNSWALLOWED:
        raise
    except Exception:
        state.failed_at = estimated  # recorded
        if state.last_compacted is not None:  # the request goes as the records stored left it
            compacted, after = state.last_compacted, state.last_after
    state.quiet_until = next_summary_at(after, config, window)
    return compacted


async def _bounded(
    request: ModelRequest,
    context: RunContext,
    config: ContextManagement,
    budget: PromptBudget,
    later: int = 0,
) -> tuple[ModelRequest, BudgetReport]:
    """The request bounded to the budget (tighter after an overflow this turn), sized with
    what ``later`` hooks add. After a measured overflow, a current turn over the limit goes
    on the safety reserve when it fits the window less the answer's reserve, as recovery
    would send it."""
    state = _run(context, config)
    window = state.window
    limit = budget.limit(window, request.max_tokens)
    if limit <= 0:
        raise PromptBudgetError(
            f"the model's {window}-token window leaves no room for a prompt after "
            f"max(response_reserve_tokens, max_tokens) and safety_reserve_tokens",
            limit=limit,
        )
    tighter = state.tighter[1] if state.tighter and state.tighter[0] == context.turn else None
    if tighter is not None:  # sized by ``_shrink`` in this turn
        limit = min(budget.prompt_budget_tokens, tighter)  # > 0: it sets no other
    memories = [] if state.bare == context.turn else await load_memories(budget, context)

    def size(view: ModelRequest) -> int:
        return estimate_tokens(view, context, config.tokenizer) - (view.max_tokens or 0) + later

    fit = partial(
        fit_sized,
        request,
        budget,
        room=budget.room(window, request.max_tokens),
        size=size,
        memories=memories,
        summary_tokens=config.summary_cap(window),
        index=context.log_index,
        turn_summaries=_turn_summaries(context.log_index.log, context.question),
        question=asked(request.messages, context),
    )
    try:
        return fit(limit=limit)
    except PromptBudgetError as error:  # the current turn alone is over the limit
        measured = state.overflow is not None and (
            state.overflow[1].prompt_tokens or calibration(context).uncounted is False
        )
        alone = error.required or 0
        if not measured or tighter is not None or alone > budget.prompt_budget_tokens:
            raise  # nothing measured the estimate, ``_shrink`` decides, or over the budget
        answer = budget.answer(request.max_tokens)
        view, report = fit(limit=max(alone, min(budget.prompt_budget_tokens, window - answer)))
        counted = await model_count(view, context)  # on the safety reserve, as recovery
        if (size(view) if counted is None else counted + later) > window - answer:
            raise
        return view, report


def _turn_summaries(log: Sequence[Message], question: Message | None) -> set[str]:
    """The ids of ``log``'s summaries that cover part of its current turn."""
    turn = log[turn_start(log, question) + 1 :]
    summaries = [m for m in turn if m.metadata and m.is_summary]  # most: no metadata
    if not summaries:
        return set()
    ids = {message.id for message in turn}
    return {m.id for m in summaries if not ids.isdisjoint(record_covers(m))}


async def _compact_after_overflow(
    agent: object, request: ModelRequest, error: Exception, *, context: RunContext
) -> ModelRequest | None:
    config = context_config(agent)
    if config is None or not isinstance(error, ContextWindowOverflowError) or relayed(error):
        return None  # a sub-agent's overflow (out of a model that runs one) is not this one
    state = _run(context, config)
    if state.overflow is not None and state.overflow[0] == context.turn:
        raise error from _leading_to_sdk_error(state.overflow[1], error)
    state.overflow = (context.turn, error)
    window = state.window = reported_window(context.model, state.window, error.context_window)
    calibrated = calibration(context)
    calibrated.uncounted = None  # asked again for this overflow
    # what overflowed: the request an earlier ``after_model_error`` hook replaced, if one did
    sent = context.last_sent or request
    reported = error.prompt_tokens or await model_count(sent, context) or 0
    # a figure or count within the window belies it, unless the model counts the figure over
    answer = _answer_room(sent)
    overflowed = reported + answer
    belied = bool(reported) and not error.context_window and overflowed <= window
    if belied and error.prompt_tokens:
        counted = await model_count(sent, context)
        belied = counted is None or counted + answer <= window
    if belied:
        window = state.window = belied_window(context.model, window, overflowed)
    learned, added = await _learned(sent, reported, context, config, window)
    if learned and sent is request:
        estimated = reported + (request.max_tokens or 0)
    else:
        estimated = estimate_tokens(request, context, config.tokenizer)
    known = reported and not belied  # how far over the window it was
    fits = window if known else min(window, max(estimated // 2, 1))  # else halve at least
    safe = None if known and not added else fits  # None: to be measured (``_recover``)
    try:
        if config.summarize:
            if reported and calibrated.uncounted is None:  # whether the model counts at all
                await model_count(request, context)
            uncounted = bool(reported) and bool(calibrated.uncounted)  # a figure, not a count
            recovered = await _recover(request, context, config, estimated, fits, safe, uncounted)
            state.quiet_until = next_summary_at(state.last_after, config, window)
            return recovered
        return await _shrink(request, context, config, estimated, fits)
    except UNSWALLOWED:
        raise
    except CompactionError as failure:
        raise error from _leading_to_sdk_error(failure, error)
    except Exception as failure:
        cause = CompactionError(f"overflow recovery failed: {type(failure).__name__}")
        cause.__cause__ = failure
        raise error from _leading_to_sdk_error(cause, error)


async def _learned(
    request: ModelRequest,
    reported: int,
    context: RunContext,
    config: ContextManagement,
    window: int,
) -> tuple[bool, bool]:
    """Learn from the model's ``reported`` count of ``request``, over the window: the
    current turn's or the added part's density, then the history's scale; whether it
    learned anything, and whether the added part's."""
    if not reported:
        return False, False
    tokenizer = config.tokenizer
    added = await learn_turn(request, context, tokenizer) or learn_added(
        request, reported, context, tokenizer
    )
    return learn_scale(request, reported, context, tokenizer, window) or added, added


def _leading_to_sdk_error(cause: BaseException, error: Exception) -> BaseException:
    """``cause``, made to lead on to the exception the provider's SDK raised (``error``'s
    ``__cause__`` so far), which ``raise error from cause`` replaces: the last exception
    its chain shows (which would lead back to ``error``, or to nothing: an SDK raises its
    errors ``from None``) gets it as its context, so a traceback still shows the
    provider's answer."""
    original, seen = error.__cause__, set()
    link = cause
    while original is not None and link is not original and id(link) not in seen:
        seen.add(id(link))
        if link.__cause__ is not None:
            link = link.__cause__
        elif link.__suppress_context__ or link.__context__ is None or link.__context__ is error:
            link.__context__, link.__suppress_context__ = original, False
            break
        else:
            link = link.__context__
    return cause


async def _recover(
    request: ModelRequest,
    context: RunContext,
    config: ContextManagement,
    estimated: int,
    fits: int,
    safe: int | None,
    uncounted: bool,
    reason: str = "overflow",
    *,
    summarize: bool = True,
) -> ModelRequest:
    """Compact for an overflow until the request is under ``fits`` tokens, aiming under
    ``safe``: a summary if one can be made (not ``summarize``: the attempt before could
    not make one of this very request, nor would it now), then (over ``safe``, or without
    one) the model-free steps. ``safe`` ``None`` (the overflow's figure is the only
    calibration): the summary call's measure gives the margin, else 20 % under ``fits``;
    20 % under at most when the model gave a figure but cannot count. A model that counts
    decides.
    The attempts' ``reason``: ``threshold`` when one goes on as recovery before the call.

    Raises:
        CompactionError: Even the current request alone does not fit.
    """
    state, calibrated = _run(context, config), calibration(context)
    target = int(TARGET_SHARE * min(config.compression_threshold * state.window, fits))
    compact = partial(_compact, context=context, config=config, reason=reason, target=target)

    async def tighten(view: ModelRequest, counted: int, last: bool) -> ModelRequest:
        """The model-free steps, calibrated by the count of ``view``, aiming as far under
        its estimate as the count was over ``fits`` (``last``: the current request alone)."""
        learn_scale(view, counted, context, config.tokenizer, state.window)
        size = counted + _answer_room(view)
        believed = calibrated_size(view, context, config.tokenizer)
        aim = 1 if last else max(min(believed, fits) - (size - fits), 1)
        return await compact(view, estimated=size, limit=fits, fallback=aim)

    compacted, failure = request, None
    try:
        if summarize:
            compacted = await compact(request, estimated=estimated)
    except UNSWALLOWED:
        raise
    except Exception as error:
        failure = error  # recorded; fall back to a compaction without a model
    summarized = compacted is not request
    if summarized and (fitted := await _counted_fit(compacted, context, fits, tighten)):
        return fitted
    if safe is None and summarized and calibrated.measured is not None:
        safe = fits - margin(request, context, config.tokenizer, calibrated.measured)
    elif safe is None:
        safe = int(TARGET_SHARE * fits)
    if uncounted:
        safe = min(safe, int(TARGET_SHARE * fits))  # what it removes and adds is estimated
    if summarized:
        estimated = state.last_after
        if estimated <= safe:
            return compacted
    try:
        recovered = await compact(compacted, estimated=estimated, limit=fits, fallback=safe)
    except CompactionError as error:
        if summarized and estimated <= fits:
            return compacted  # it fits: the margin under ``fits`` was only an aim
        if failure is not None and error.__cause__ is None:
            error.__cause__ = failure  # why no summary was made either
        if calibrated.uncounted or state.spent:  # no aim by the count removes more
            raise
        # the estimate said it fits, the count did not: aimed by the count
        fitted = await _counted_fit(compacted, context, fits, tighten)
        if fitted is None or fitted.messages == request.messages:  # ``request`` overflowed
            raise
        return fitted
    if not summarized and (fitted := await _counted_fit(recovered, context, fits, tighten)):
        return fitted
    return recovered


async def _counted_fit(
    request: ModelRequest,
    context: RunContext,
    fits: int,
    tighten: Callable[[ModelRequest, int, bool], Awaitable[ModelRequest]],
) -> ModelRequest | None:
    """``request`` once the model counts it (with its answer's room) within ``fits``, after
    at most ``RECOUNTS`` + 1 ``tighten``s; ``None`` if the model cannot count.

    Raises:
        CompactionError: The model still counts it over ``fits``.
    """
    for recount in range(RECOUNTS + 2):
        counted = await model_count(request, context)
        if counted is None:  # or no longer, after a ``tighten``: the estimate says it fits
            return None if recount == 0 else request
        if counted + _answer_room(request) <= fits:
            context.annotate_next_call({telemetry.COMPACTION_COUNTED: counted})
            return request
        if recount <= RECOUNTS:
            request = await tighten(request, counted, recount == RECOUNTS)
    raise CompactionError(
        f"the model counts {counted} prompt tokens for the compacted request; with its "
        f"answer's room that is over {_limit_named(fits, context)}"
    )


def _limit_named(fits: int, context: RunContext) -> str:
    """How an error names the limit recovery fits a request under: the context window,
    or the half of the overflowed request it aims under when the provider did not say by
    how much the request was over (no size, or one within the window)."""
    window = context.state_for(_Run, _Run).window
    if fits >= window:
        return f"the {fits}-token context window"
    return (
        f"the {fits} tokens recovery aims under (half the request that overflowed, as the "
        f"provider did not say by how much it was over; the context window is {window})"
    )


def _cap_fills(request: ModelRequest, context: RunContext, window: int) -> str:
    """The error of a request whose output cap alone fills ``window``, naming where the
    cap came from: the run's settings, the model's default, or a ``before_model`` hook
    that ran before this one (a base class's)."""
    cap = request.max_tokens
    given = attrs.evolve(request, settings=context.settings).max_tokens
    fix = "set a smaller max_tokens in the agent's settings"
    if cap != given:  # the run's settings hold the model's default cap, if any
        whose = "the output cap a before_model hook set"
        fix = f"have the hook set a smaller one (the run's settings give {given})"
    elif cap == getattr(context.model, "default_max_tokens", None):
        whose = "the model's default output cap"
    else:
        whose = "the request's output cap"
    return (
        f"{whose} (max_tokens {cap}) is not under the {window}-token context window: no "
        f"prompt fits beside its answer; {fix}"
    )


def _answer_room(request: ModelRequest) -> int:
    """The room a counted request's answer needs: its ``max_tokens``, and at least one
    token (a server needs one to answer: llama.cpp refuses a prompt of its whole window)."""
    return max(request.max_tokens or 0, 1)


def next_summary_at(after: int, config: ContextManagement, window: int) -> int | None:
    """The size a request left at ``after`` must reach before the next summary call:
    ``REGROWTH`` of the window more when ``after`` is at the threshold; under it, the room
    a compaction aims to leave more, when that passes the threshold (a summary left just
    under it must not make the next turn compact again); else None."""
    threshold, growth = config.threshold(window), max(1, int(REGROWTH * window))
    if after >= threshold:
        return after + growth
    room = max(1, min(growth, threshold - _target(config, window)))
    return after + room if after + room > threshold else None


def summary_waits(
    estimated: int, waits_until: int | None, request: ModelRequest, window: int
) -> bool:
    """Whether a compaction due at ``estimated`` tokens (``max_tokens`` included) waits
    until the request has grown to ``waits_until`` (no thrash): not once it is over the
    window with its answer's room, as the provider would refuse it (and recovery compact
    it after a wasted call)."""
    if waits_until is None or estimated >= waits_until:
        return False
    return not over_window(estimated, request, window)


def over_window(estimated: int, request: ModelRequest, window: int) -> bool:
    """Whether a request of ``estimated`` tokens (``max_tokens`` included) is over the
    window with its answer's room: the provider would refuse it."""
    return estimated - (request.max_tokens or 0) + _answer_room(request) > window


def _target(config: ContextManagement, window: int) -> int:
    """What a threshold compaction aims the request under."""
    return int(TARGET_SHARE * config.compression_threshold * window)


def managed_state(
    index: LogIndex,
    config: ContextManagement,
    window: int,
    complete: Complete,
    settings: Mapping[str, Any],
) -> CompactionState:
    """A compaction state over ``index``'s view: the groups of the newest
    ``preserve_recent_messages`` protected, a summary request fitted to ``window``."""
    state = compaction_state(index, config.tokenizer, complete=complete, settings=settings)
    state.fit_window(window)
    kinds, members = index.layout.slots()
    count, state.protected = 0, 0
    for slot in range(len(kinds) - 1, -1, -1):
        if kinds[slot] != SYSTEM:
            count += len(members[slot])
            if count >= config.preserve_recent_messages:
                state.protected = slot
                break
    return state


def pinned_slots(
    index: LogIndex, logged: Callable[[str], bool] | None = None, current: int | None = None
) -> frozenset[int]:
    """The slots of ``index``'s view a compaction keeps: view-only messages, messages not
    ``logged`` (a hook's injected material) and the ``current`` slot."""

    def kept(message: Message) -> bool:
        return view_only(message) or (logged is not None and not logged(message.id))

    kinds, members = index.layout.slots()
    pinned = {slot for slot in range(len(kinds)) if any(map(kept, members[slot]))}
    return frozenset(pinned if current is None else {*pinned, current})


def _current_slot(index: LogIndex, question: Message | None) -> int | None:
    """The slot of ``index``'s view where the current turn starts (``turn_start``)."""
    members = index.layout.slots()[1]
    start = turn_start([group[0] for group in members], question)
    return start if start < len(members) else None


async def _compact(
    request: ModelRequest,
    context: RunContext,
    config: ContextManagement,
    reason: str,
    estimated: int,
    target: int,
    *,
    limit: int | None = None,
    fallback: int | None = None,
) -> ModelRequest:
    """Compact ``request`` toward ``target`` (the model's tokens) with the configured
    strategy or the default one, or without a model aiming under ``fallback`` (a view's
    memories and excerpts left out, tool results cut while over ``limit``); append the
    records to the log.

    Raises:
        CompactionError: Nothing was compacted, the result is no smaller, or (fallback)
            even the current request alone is over ``limit``.
    """
    run, calibrated = _run(context, config), calibration(context)
    window, run.spent = run.window, False
    shown = request.messages
    if fallback is not None:  # never logged: left out without a record
        shown = tuple(message for message in shown if not view_only(message))
    async with attempt(context, reason, estimated, window, fallback is not None) as outcome:

        async def complete(summary: ModelRequest, **options: Any) -> ModelResponse:
            try:
                response = await context.complete(summary, report=False, **options)
            except BaseException as error:  # a summary stopped at the window, or a
                # strategy's own scope cut it (the compaction goes on): billed all the same
                outcome.usage += billed(error)
                raise
            outcome.usage += response.usage  # the attempt's own: its event reports it
            return response

        index = context.log_index.over(shown)
        state = managed_state(index, config, window, complete, request.settings)
        turn = _current_slot(index, asked(shown, context))
        state.pinned = pinned_slots(index, context.has_message, turn)
        state.scale = calibrated.scale
        outside = (request.max_tokens or 0) + schema_estimate(request, config.tokenizer)
        outside += excess(request.messages, context, config.tokenizer)  # known sizes
        outside += run.hooked if reason == "threshold" else 0  # the later hooks will add it
        goal = _goal(state, target, outside)
        everything = state.slots if turn is None else turn  # the preserved too
        if fallback is not None or (reason == "overflow" and config.strategy is None):
            state.protected = everything
        try:
            if fallback is not None:
                await _model_free_compaction(state, goal, _goal(state, fallback, outside), window)
            elif config.strategy is not None:
                await config.strategy.compact(state)
            else:
                threshold = int(config.compression_threshold * window)
                enough = None if reason == "overflow" else _goal(state, threshold, outside)
                refused = reason == "threshold" and over_window(estimated, request, window)
                reach = everything if refused else None  # as recovery would, but first
                await default_compaction(state, config, window, goal, enough, reach)
        finally:
            scale, calibrated.scale = calibrated.scale, state.scale  # a summary call may teach it
        calibrated.measured = state.measured
        outcome.summary = state.summary_outcome
        records = state.records()
        calibrated.real = {**calibrated.real, **state.real}  # a new mapping (``_Split``)
        compacted = attrs.evolve(request, messages=state.view())
        before, kept = {m.id for m in request.messages}, {m.id for m in compacted.messages}
        added = [m for m in compacted.messages if m.id not in before]
        removed = [m for m in request.messages if m.id not in kept]
        change = real_size(added, context, config.tokenizer)
        change -= real_size(removed, context, config.tokenizer)
        if calibrated.scale != scale:  # ``estimated`` is in the old units: in the new
            estimated = outcome.before = calibrated_size(request, context, config.tokenizer)
        after = max(estimated + change, 0)  # the units of ``estimated``, as far as known
        if limit is not None and after > limit:
            alone = fallback is not None and not state.candidates(state.protected)
            compacted, after, outcome.cut_to = await _cut_results(
                compacted, after, limit, context, config, alone=alone
            )
        if not records and outcome.cut_to is None and len(shown) == len(request.messages):
            strategy = config.strategy
            if fallback is None and strategy is not None and not started(strategy, state):
                raise CompactionError(
                    f"nothing to compact: the strategy does not start at about {estimated} "
                    f"tokens (a {window}-token window): its trigger does not hold, or its "
                    "token budget is not exceeded"
                )
            raise CompactionError(
                "nothing to compact: the preserved messages and the current request are all "
                "that is left, or what is older is only earlier summaries or shorter than a "
                "summary's framing"
            )
        if after >= estimated:
            raise CompactionError(
                f"the compaction would not make the request smaller ({estimated} -> {after} tokens)"
            )
        marked = {r.id: attrs.evolve(r, metadata={**r.metadata, AFTER_KEY: after}) for r in records}
        await context.append(*marked.values())
        outcome.after, outcome.removed = after, _left_out(request, compacted)
        run.last_after, run.failed_at = after, None  # the records say where it is now
        run.cut_to = outcome.cut_to or run.cut_to
        if len(shown) < len(request.messages):  # the view's own, left out: not for the retry
            run.bare = context.turn
    compacted = attrs.evolve(compacted, messages=[marked.get(m.id, m) for m in compacted.messages])
    run.last_compacted = compacted
    return compacted


def _left_out(request: ModelRequest, compacted: ModelRequest) -> int:
    """How many of ``request``'s messages (a view's own not counted) ``compacted`` left
    out: ``removed_messages``."""
    kept = {message.id for message in compacted.messages}
    return sum(m.id not in kept and not view_only(m) for m in request.messages)


async def _model_free_compaction(
    state: CompactionState, goal: int, limit: int, window: int
) -> None:
    """Toward ``goal``: the oldest turns become excerpts, then are left out; while over
    ``limit``, earlier summaries are left out, then the current turn's older results collapsed."""
    summaries = {s for s in range(state.slots) if state.kind(s) == SUMMARY} - state.pinned
    state.pinned |= summaries
    await TurnExcerpts(target=~tokens_exceed(goal), minimum_preserved=0).compact(state)
    state.pinned -= summaries
    fits = ~tokens_exceed(limit)
    state.exclude_oldest(state.protected, fits)
    await _collapse_results(state, fits, window)


async def _cut_results(
    request: ModelRequest,
    size: int,
    window: int,
    context: RunContext,
    config: ContextManagement,
    *,
    alone: bool,
) -> tuple[ModelRequest, int, int | None]:
    """``request`` (``size`` tokens) with its tool results cut until it takes ``CUT_SHARE``
    of ``window``; the request, its size (the model's count when over) and the cut, if any.

    Raises:
        CompactionError: The request still does not fit ``window`` (``spent`` when it is
            the current request ``alone`` and its results are cut as far as they go).
    """
    tokenizer, index = config.tokenizer, context.log_index
    whole = real_size(request.messages, context, tokenizer)
    results = [r.content for message in request.messages for r in message.tool_results]
    limit = int(max(map(weighed_length, results), default=0)) // CHARS_PER_TOKEN
    cut, after = request, size
    while limit > CUT_FLOOR_TOKENS and after > CUT_SHARE * window:
        limit = max(limit * 3 // 4, CUT_FLOOR_TOKENS)
        cut = clip_results(request, index, limit)
        after = size - whole + real_size(cut.messages, context, tokenizer)
    if after > window and (counted := await model_count(cut, context)) is not None:
        after = counted + _answer_room(cut)
    if after > window:
        _run(context, config).spent = alone and limit <= CUT_FLOOR_TOKENS
        cut_note = f", its tool results cut to {limit} tokens each" if cut is not request else ""
        raise CompactionError(
            f"the current request alone (about {after} tokens{cut_note}) does not fit "
            f"{_limit_named(window, context)}"
        )
    return cut, after, limit if cut is not request else None


async def _collapse_results(state: CompactionState, target: Trigger, window: int) -> None:
    """Collapse older tool results, the protected groups' too, to one line each (a 25th
    of the window in characters, 16 to 400) until ``target`` holds."""
    protected, state.protected = state.protected, state.slots
    chars = min(max(window // 25, 16), 400)
    await ToolResultCompaction(target=target, max_result_chars=chars).compact(state)
    state.protected = protected


def _goal(state: CompactionState, target: int, outside: int) -> int:
    """``target`` (the model's tokens) less what the state does not hold (``outside``), in the
    state's estimated tokens: instructions as estimated, the conversation scaled."""
    fixed = sum(
        state.size(slot)
        for slot in range(state.slots)
        if state.included(slot) and state.kind(slot) == SYSTEM
    )
    return max(fixed + int((target - outside - fixed) / state.scale), 0)


async def default_compaction(
    state: CompactionState,
    config: ContextManagement,
    window: int,
    goal: int,
    enough: int | None = None,
    reach: int | None = None,
) -> None:
    """Toward ``goal`` (estimated tokens): mask older tool results (``mask_tool_results``);
    collapse the tail's when it alone is over (no summary once under ``enough``); summarize
    about ``summary_ratio`` of the rest (up to slot ``reach`` when given: the preserved
    too), more when needed; collapse again if still over."""
    fits = ~tokens_exceed(goal)
    if config.mask_tool_results is not None:
        await mask_tool_results(state, config.mask_tool_results, fits)
        if fits(state):
            return
    tail = sum(
        state.size(slot) for slot in range(state.protected, state.slots) if state.included(slot)
    )
    if tail > goal:
        await _collapse_results(state, fits, window)
        if enough is not None and state.tokens < enough:
            return
    if reach is not None:
        state.protected = reach
    conversation = sum(
        state.group(slot).count
        for slot in range(state.slots)
        if state.included(slot) and state.kind(slot) != SYSTEM
    )
    keep = max(state.messages - max(1, math.floor(conversation * config.summary_ratio)), 0)
    summarizer = Summarization(
        minimum_preserved=0,
        prompt=config.summary_instructions,
        max_tokens=config.summary_cap(window),
        quote_specifics=config.quote_specifics,
        target=fits & ~messages_exceed(keep),
    )
    await summarizer.compact(state)
    if not fits(state):
        await _collapse_results(state, fits, window)


async def _shrink(
    request: ModelRequest, context: RunContext, config: ContextManagement, estimated: int, fits: int
) -> ModelRequest:
    """Without summaries, recover from an overflow with a tighter view, tighter still while
    the model counts it over ``fits``.

    Raises:
        CompactionError: No view fits in ``fits`` tokens.
    """
    state, budget = _run(context, config), config.budget
    assert budget is not None

    def set_limit(to: int, why: str) -> None:
        if to <= 0:
            raise CompactionError(f"{why}: no view fits in {fits} tokens")
        state.tighter = (context.turn, to)

    room = budget.limit(fits, request.max_tokens)
    answer = budget.answer(request.max_tokens)
    prompt = estimated - (request.max_tokens or 0)  # the overflow's size, without the answer

    async def bounded() -> tuple[ModelRequest, BudgetReport]:
        try:
            return await _bounded(request, context, config, budget)
        except PromptBudgetError as error:  # the current turn alone is over (figures only)
            alone = error.required or 0  # the model's count, if it counts, has the last word
            sized = math.ceil(alone * prompt / max(sent, 1))  # scaled as the view it sized
            within = (
                calibration(context).uncounted is False or alone <= room or sized <= fits - answer
            )
            if not limit < alone or not within:
                raise CompactionError(str(error)) from error
        set_limit(alone, "the current request alone")  # tightened past it: the turn alone
        return await _bounded(request, context, config, budget)

    async with attempt(context, "overflow", estimated, fits, False) as outcome:
        estimates = context.log_index.estimates(budget.tokenizer)
        sent = estimates.total(request.messages) + schema_estimate(request, budget.tokenizer)
        limit = int(0.9 * min(room, sent * fits / max(estimated, 1)))  # as the overflow sized it
        reserves = "max(response_reserve_tokens, max_tokens) and safety_reserve_tokens"
        why = reserves if room <= 0 else f"the overflow's {estimated} tokens for a view of {sent}"
        set_limit(limit, f"{why} leave no room for a prompt")
        shrunk, report = await bounded()

        async def tighter(view: ModelRequest, counted: int, last: bool) -> ModelRequest:
            nonlocal limit, report
            limit = 1 if last else int(0.9 * limit * fits / (counted + _answer_room(view)))
            limit = min(limit, report.estimated_prompt_tokens - 1)  # under the view it tightens
            set_limit(limit, f"the model counts {counted} prompt tokens for the bounded view")
            tighter_view, report = await bounded()
            if tighter_view.messages == view.messages and state.bare != context.turn:
                state.bare = context.turn  # the memories go before the request alone fails
                tighter_view, report = await bounded()
            if tighter_view.messages == view.messages:  # the current request alone, again
                raise CompactionError(
                    f"the model counts {counted} prompt tokens for the current request alone: "
                    f"no view fits in {fits} tokens"
                )
            return tighter_view

        shrunk = await _counted_fit(shrunk, context, fits, tighter) or shrunk
        context.annotate_next_call(report.span_attributes())
        outcome.after = state.last_after = report.estimated_prompt_tokens  # the view fitted
        outcome.removed = _left_out(request, shrunk)
    return shrunk
