"""``@manage_context``: keep a conversation inside the model's context window.

Before every model call, when the request's estimate reaches ``compression_threshold`` of
the window, the oldest part of the conversation is summarized with the agent's current
model and the summary is appended to the log; the view shows it instead of the messages
it covers. A provider's context-overflow error is recovered by exactly one compaction and
one retry of that call. A proactive compaction that fails leaves the request as it was;
cancellation, ``DeadlineExceededError`` and ``CleanupError`` always propagate.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
from attrs import field, frozen
from opentelemetry import trace

from littleghost import telemetry
from littleghost._validators import Validator, check, is_int, is_number
from littleghost.context.budget import (
    EXCERPTS_KEY,
    MEMORIES_KEY,
    BudgetReport,
    PromptBudget,
    env_tokens,
    fit_request,
    load_memories,
)
from littleghost.context.compaction import compaction_records
from littleghost.context.derive import clip_tool_results
from littleghost.context.strategies import CompactionStrategy
from littleghost.context.summarize import (
    DEFAULT_SUMMARY_INSTRUCTIONS,
    FRAMING,
    render_transcript,
    request_summary,
    summary_message,
    summary_request,
)
from littleghost.context.tokens import (
    DEFAULT_TOKENIZER,
    Tokenizer,
    estimate_message,
    estimate_messages,
    estimate_request,
)
from littleghost.context.view import (
    COMPACTION_COVERS_KEY,
    build_view,
    covered_ids,
    record_covers,
)
from littleghost.errors import (
    CleanupError,
    ConfigurationError,
    ContextWindowOverflowError,
    DeadlineExceededError,
    PromptBudgetError,
    ProtocolError,
    SessionStoreError,
)
from littleghost.events import CompactionFinished, CompactionStarted
from littleghost.hooks import CapabilityHook, register_capability
from littleghost.messages import SUMMARY_COVERS_KEY, Message, Role
from littleghost.models.base import Model, ModelRequest, Usage

if TYPE_CHECKING:
    from littleghost.run import RunContext

__all__ = ["ContextManagement", "context_window", "estimate_tokens", "manage_context"]

logger = logging.getLogger("littleghost.context")

C = TypeVar("C", bound=type)

SUMMARY_FIT_MARGIN = 0.9
"""The share of the window a summary request may fill (estimates are not exact)."""
_CLIP_LEVELS = (None, 2_000, 500, 200)
_OVERFLOW_KEY = "littleghost.context.overflow"
_LIMIT_KEY = "littleghost.context.budget_limit"
_assumed_windows: set[tuple[str, str]] = set()
"""The (provider, model name) pairs already warned about an assumed window."""


def _env_window() -> int:
    return env_tokens("LITTLEGHOST_CONTEXT_WINDOW_TOKENS", 200_000)


def _check(name: str, ok: Callable[[Any], bool], allowed: str) -> Validator:
    return check(f"manage_context: {name}", ok, allowed)


@frozen(kw_only=True)
class ContextManagement:
    """The ``manage_context`` configuration of an agent class (``Agent.context_management``).

    Args:
        context_window_tokens: The window used when the model advertises none (> 0).
        context_window_override: The window used whatever the model advertises (> 0), or
            None.
        compression_threshold: Compact when the estimate reaches this share of the window,
            in (0, 1].
        summary_ratio: The share of the conversation summarized, in [0.1, 0.8].
        preserve_recent_messages: Newest messages always kept verbatim (>= 2).
        tokenizer: Counts tokens (``count_tokens(text)``); default characters ÷ 4.
        summary_instructions: Replaces the summarizer's instructions.
        summary_max_tokens: The summary's output cap; default a quarter of the window, at
            most 4 096.
        budget: A ``PromptBudget``: every request's view is first bounded to it.
        summarize: False never compacts with a model (needs ``budget``).
        strategy: How to compact, in place of the default summarizer (the threshold
            still decides when; overflow recovery uses it too).
    """

    context_window_tokens: int = field(
        factory=lambda: _env_window(),
        validator=_check("context_window_tokens", lambda v: is_int(v) and v > 0, "an int > 0"),
    )
    context_window_override: int | None = field(
        default=None,
        validator=_check(
            "context_window_override",
            lambda v: v is None or (is_int(v) and v > 0),
            "an int > 0 or None",
        ),
    )
    compression_threshold: float = field(
        default=0.85,
        validator=_check(
            "compression_threshold", lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]"
        ),
    )
    summary_ratio: float = field(
        default=0.3,
        validator=_check(
            "summary_ratio", lambda v: is_number(v) and 0.1 <= v <= 0.8, "a number in [0.1, 0.8]"
        ),
    )
    preserve_recent_messages: int = field(
        default=10,
        validator=_check("preserve_recent_messages", lambda v: is_int(v) and v >= 2, "an int >= 2"),
    )
    tokenizer: Tokenizer = field(
        default=DEFAULT_TOKENIZER,
        validator=_check(
            "tokenizer",
            lambda v: callable(getattr(v, "count_tokens", None)),
            "an object with count_tokens(text)",
        ),
    )
    summary_instructions: str | None = field(
        default=None,
        validator=_check(
            "summary_instructions",
            lambda v: v is None or (isinstance(v, str) and v.strip() != ""),
            "a non-empty str or None",
        ),
    )
    summary_max_tokens: int | None = field(
        default=None,
        validator=_check(
            "summary_max_tokens",
            lambda v: v is None or (is_int(v) and v > 0),
            "an int > 0 or None",
        ),
    )

    budget: PromptBudget | None = field(
        default=None,
        validator=_check(
            "budget", lambda v: v is None or isinstance(v, PromptBudget), "a PromptBudget or None"
        ),
    )
    summarize: bool = field(
        default=True, validator=_check("summarize", lambda v: isinstance(v, bool), "True or False")
    )
    strategy: CompactionStrategy | None = field(
        default=None,
        validator=_check(
            "strategy",
            lambda v: v is None or callable(getattr(v, "compact", None)),
            "a compaction strategy (Truncation, Pipeline, ...) or None",
        ),
    )

    def __attrs_post_init__(self) -> None:
        if self.strategy is not None and not self.summarize:
            raise ConfigurationError(
                "manage_context: strategy= decides how to compact; summarize=False turns "
                "compaction off, so the two cannot be combined"
            )
        if self.budget is not None:
            self.budget.check_window(self.context_window_override or self.context_window_tokens)
        elif not self.summarize:
            raise ConfigurationError(
                "manage_context: summarize=False needs budget=PromptBudget(...) to keep requests in "
                "the window without a model"
            )

    def summary_cap(self, window: int) -> int:
        """The summary's output cap for ``window``."""
        if self.summary_max_tokens is not None:
            return self.summary_max_tokens
        return max(1, min(window // 4, 4_096))


def manage_context(cls: C | None = None, /, **options: Any) -> Any:
    """Keep an agent's conversations inside the model's context window.

    Use bare (``@manage_context``) or with the keywords of ``ContextManagement``. Invalid
    values raise ``ConfigurationError`` when the class is defined.
    """
    config = ContextManagement(**options)

    def decorate(target: C) -> C:
        if not (isinstance(target, type) and getattr(target, "__littleghost_agent__", False)):
            raise ConfigurationError(f"@manage_context decorates an Agent subclass, not {target!r}")
        setattr(target, "context_management", config)  # noqa: B010 - any Agent subclass
        register_capability(
            target,
            "manage_context",
            (
                CapabilityHook("before_model", _compact_before_model),
                CapabilityHook("after_model_error", _compact_after_overflow),
            ),
        )
        return target

    return decorate(cls) if cls is not None else decorate


def context_window(model: Model, config: ContextManagement) -> int:
    """The window compaction works against.

    ``context_window_override`` when set; else the model's advertised window when it is a
    positive int; else ``context_window_tokens``, with one warning per model for the
    process.
    """
    if config.context_window_override is not None:
        return config.context_window_override
    advertised = getattr(model, "context_window", None)
    if is_int(advertised) and advertised > 0:
        return advertised
    provider, name = str(getattr(model, "provider", "")), str(getattr(model, "name", ""))
    if (provider, name) not in _assumed_windows:
        _assumed_windows.add((provider, name))
        logger.warning(
            "manage_context: model %r (provider %r) advertises no context window; assuming "
            "%d tokens. Set context_window= on the model, or context_window_override= or "
            "context_window_tokens= on manage_context",
            name,
            provider,
            config.context_window_tokens,
        )
    return config.context_window_tokens


def estimate_tokens(request: ModelRequest, context: RunContext, tokenizer: Tokenizer) -> int:
    """The request's estimated size plus the room its answer needs (``max_tokens``).

    Anchored on the input tokens the provider reported for the previous request of the
    run when this request extends it; otherwise estimated whole.
    """
    prompt: int | None = None
    exchange = context.last_exchange
    if exchange is not None:
        previous, response = exchange
        reported = response.usage.input_tokens
        count = len(previous.messages)
        if (
            reported > 0
            and count <= len(request.messages)
            and previous.tools == request.tools
            and all(
                a is b or a == b for a, b in zip(previous.messages, request.messages, strict=False)
            )
        ):
            prompt = reported + estimate_messages(request.messages[count:], tokenizer)
    if prompt is None:
        prompt = estimate_request(request.messages, request.tools, request.settings, tokenizer)
    return prompt + (request.max_tokens or 0)


def _config(agent: object) -> ContextManagement | None:
    config = getattr(agent, "context_management", None)
    return config if isinstance(config, ContextManagement) else None


def _reaches(estimated: int, threshold: float, window: int) -> bool:
    """``estimated >= threshold × window``, exactly (0.55 × 200 000 is 110 000)."""
    return Decimal(estimated) >= Decimal(repr(threshold)) * window


async def _compact_before_model(
    agent: object, request: ModelRequest, *, context: RunContext
) -> ModelRequest | None:
    config = _config(agent)
    if config is None:
        return None
    window = context_window(context.model, config)
    original = request
    # The log keeps tool results whole under context management; the view cuts them.
    limit = getattr(agent, "max_tool_result_tokens", None)
    if isinstance(limit, int):
        clipped = clip_tool_results(request.messages, limit)
        if any(a is not b for a, b in zip(clipped, request.messages, strict=True)):
            request = attrs.evolve(request, messages=clipped)
    report: BudgetReport | None = None
    if config.budget is not None:
        request, report = await _bounded(request, config, config.budget, window, context)
    if config.summarize:
        estimated = estimate_tokens(request, context, config.tokenizer)
        if _reaches(estimated, config.compression_threshold, window):
            target = int(0.8 * config.compression_threshold * window)
            try:
                request = await _compact(
                    request, context, config, "threshold", estimated, window, target
                )
            except (DeadlineExceededError, CleanupError, SessionStoreError):
                raise  # a failed write ends the run: the log must stay whole
            except Exception:
                pass
    if report is not None and config.budget is not None:
        context.annotate_next_call(_sent_figures(report, request, config.budget).span_attributes())
    return None if request is original else request


async def _bounded(
    request: ModelRequest,
    config: ContextManagement,
    budget: PromptBudget,
    window: int,
    context: RunContext,
) -> tuple[ModelRequest, BudgetReport]:
    """The request bounded to the budget (tighter after an overflow in this turn)."""
    limit = budget.limit(window, request.max_tokens)
    tighter = context.state.get(_LIMIT_KEY)
    if tighter is not None and tighter[0] == context.turn:
        limit = min(limit, tighter[1])
    if limit <= 0:
        raise PromptBudgetError(
            f"the model's {window}-token window leaves no room for a prompt after "
            f"max(response_reserve_tokens, max_tokens) and safety_reserve_tokens",
            limit=limit,
        )
    memories = await load_memories(budget, context)
    return fit_request(request, budget, limit, memories, summary_tokens=config.summary_cap(window))


def _sent_figures(
    report: BudgetReport, request: ModelRequest, budget: PromptBudget
) -> BudgetReport:
    """The report's figures for the request actually sent (after any summary)."""
    return attrs.evolve(
        report,
        messages_kept=len(request.messages),
        estimated_prompt_tokens=estimate_request(
            request.messages, request.tools, {}, budget.tokenizer
        ),
    )


async def _compact_after_overflow(
    agent: object, request: ModelRequest, error: Exception, *, context: RunContext
) -> ModelRequest | None:
    config = _config(agent)
    if config is None or not isinstance(error, ContextWindowOverflowError):
        return None
    first = context.state.get(_OVERFLOW_KEY)
    if first is not None and first[0] == context.turn:
        raise error from first[1]
    context.state[_OVERFLOW_KEY] = (context.turn, error)
    window = context_window(context.model, config)
    estimated = estimate_tokens(request, context, config.tokenizer)
    fits = _fitting_window(request, error, estimated, window)
    try:
        if config.summarize:
            target = int(0.8 * min(config.compression_threshold * window, fits))
            return await _compact(
                request, context, config, "overflow", estimated, min(window, fits), target
            )
        assert config.budget is not None
        return await _shrink(request, context, config, config.budget, estimated, window, fits)
    except Exception as failure:
        raise failure from error


def _fitting_window(
    request: ModelRequest, error: ContextWindowOverflowError, estimated: int, window: int
) -> int:
    """The provider's reported window, in this estimate's units (``window`` if unknown)."""
    if not (error.context_window and error.prompt_tokens and error.prompt_tokens > 0):
        return window
    prompt = max(estimated - (request.max_tokens or 0), 1)
    return max(int(error.context_window * prompt / error.prompt_tokens), 1)


async def _shrink(
    request: ModelRequest,
    context: RunContext,
    config: ContextManagement,
    budget: PromptBudget,
    estimated: int,
    window: int,
    fits: int,
) -> ModelRequest:
    """Without summaries, recover from an overflow once with a tighter view."""
    await context.emit(CompactionStarted("overflow", estimated, window))
    usage_before = context.usage
    try:
        if fits < window:
            limit = int(0.9 * budget.limit(fits, request.max_tokens))
        else:
            limit = budget.limit(window, request.max_tokens) // 2
        context.state[_LIMIT_KEY] = (context.turn, limit)
        shrunk, report = await _bounded(request, config, budget, window, context)
        context.annotate_next_call(report.span_attributes())
    except Exception as failure:
        await _record(
            context,
            reason="overflow",
            outcome="error",
            removed=0,
            estimated=estimated,
            after=None,
            window=window,
            usage=_since(usage_before, context.usage),
            error=failure,
        )
        raise
    context.mark_compacted()
    await _record(
        context,
        reason="overflow",
        outcome="completed",
        removed=len(request.messages) - len(shrunk.messages),
        estimated=estimated,
        after=estimate_tokens(shrunk, context, budget.tokenizer),
        window=window,
        usage=_since(usage_before, context.usage),
        error=None,
    )
    return shrunk


def _blocked_edges(conversation: Sequence[Message]) -> list[bool]:
    """``blocked[k]`` is True when summarizing ``conversation[:k]`` would split a tool call
    from one of its results (matched by call id)."""
    blocked = [False] * (len(conversation) + 1)
    open_calls: dict[str, int] = {}
    last: dict[int, int] = {}
    for index, message in enumerate(conversation):
        if message.role is Role.ASSISTANT:
            for call in message.tool_calls:
                open_calls[call.id] = index
        for result in message.tool_results:
            owner = open_calls.pop(result.call_id, None)
            if owner is not None:
                last[owner] = max(last.get(owner, owner), index)
    for owner, end in last.items():
        for edge in range(owner + 1, end + 1):
            blocked[edge] = True
    return blocked


def _choose(
    conversation: Sequence[Message],
    config: ContextManagement,
    room: int,
    needed: int,
) -> tuple[int, int | None]:
    """How many of the oldest messages to summarize, and the transcript clip to use.

    About ``summary_ratio`` of the conversation, more when that would not remove
    ``needed`` tokens; never the newest ``preserve_recent_messages``, never splitting a
    tool call from its results, and no more than the summary request's ``room`` holds.
    """
    total = len(conversation)
    limit = total - config.preserve_recent_messages
    if limit < 1:
        raise ProtocolError(
            f"only {total} conversation messages can be summarized and "
            f"preserve_recent_messages={config.preserve_recent_messages} keeps them all"
        )
    blocked = _blocked_edges(conversation)
    edges = [k for k in range(1, limit + 1) if not blocked[k]]
    if not edges:
        raise ProtocolError(
            f"the newest {config.preserve_recent_messages} messages cannot be kept without "
            "separating a tool call from its results"
        )
    tokenizer = config.tokenizer
    target = min(max(math.floor(total * config.summary_ratio), 1), limit)
    removed = 0
    for index, message in enumerate(conversation[:limit]):
        removed += estimate_message(message, tokenizer)
        if removed >= needed:
            target = max(target, index + 1)
            break
    else:
        target = limit
    below = [k for k in edges if k <= target]
    chosen = below[-1] if below else edges[0]
    if all(message.is_summary for message in conversation[:chosen]):
        raise ProtocolError("nothing new to summarize: only the previous summary is old enough")
    best: tuple[int, int | None] = (0, None)
    for clip in _CLIP_LEVELS:
        fits = 0
        used = 0
        for k in range(1, chosen + 1):
            line = render_transcript(conversation[k - 1 : k], max_item_chars=clip)
            used += tokenizer.count_tokens(line) + 1
            if used > room:
                break
            if not blocked[k]:
                fits = k
        if fits == chosen:
            return chosen, clip
        if fits > best[0]:
            best = (fits, clip)
    if best[0] == 0 or all(message.is_summary for message in conversation[: best[0]]):
        raise ProtocolError("the summary request cannot fit the context window")
    return best


async def _compact(
    request: ModelRequest,
    context: RunContext,
    config: ContextManagement,
    reason: str,
    estimated: int,
    window: int,
    target: int,
) -> ModelRequest:
    """Summarize the oldest part of ``request``, aiming at ``target`` tokens; append the
    summary to the log; return the compacted request.

    The current user request is never summarized. A previous summary the request lacks
    is folded in all the same, so no summary is ever left behind.
    """
    await context.emit(CompactionStarted(reason, estimated, window))
    usage_before = context.usage
    try:
        if config.strategy is not None:
            compacted, records = await _by_strategy(request, context, config, config.strategy)
            after = _estimate_after(request, compacted, estimated, config.tokenizer)
            if after >= estimated:
                raise ProtocolError(
                    f"the strategy would not make the request smaller ({estimated} -> {after} tokens)"
                )
            await context.append(*records)
            return await _completed(
                request, compacted, context, reason, estimated, after, window, usage_before
            )
        current = _current_request(request.messages)
        conversation = [m for m in request.messages if not _pinned(m) and m is not current]
        previous = _latest_summary(context.messages)
        if previous is not None and all(m.id != previous.id for m in conversation):
            conversation.insert(0, previous)
        instructions = config.summary_instructions or DEFAULT_SUMMARY_INSTRUCTIONS
        cap = config.summary_cap(window)
        tokenizer = config.tokenizer
        room = (
            int(window * SUMMARY_FIT_MARGIN)
            - cap
            - tokenizer.count_tokens(instructions)
            - tokenizer.count_tokens(FRAMING)
        )
        count, clip = _choose(conversation, config, room, estimated - target)
        covered = conversation[:count]
        text = await request_summary(
            summary_request(
                covered,
                instructions=instructions,
                settings=request.settings,
                max_tokens=cap,
                max_item_chars=clip,
            ),
            context.complete,
        )
        summary = summary_message(text, (message.id for message in covered))
        covered_set = {message.id for message in covered}
        messages: list[Message] = []
        placed = False
        for message in request.messages:
            if message.id in covered_set:
                continue
            if not placed and not _pinned(message):
                messages.append(summary)
                placed = True
            messages.append(message)
        compacted = ModelRequest(messages, request.tools, request.settings, request.purpose)
        after = _estimate_after(request, compacted, estimated, tokenizer)
        if after >= estimated:
            raise ProtocolError(
                f"the summary would not make the request smaller ({estimated} -> {after} tokens)"
            )
        await context.append(summary)
    except Exception as error:
        await _record(
            context,
            reason=reason,
            outcome="error",
            removed=0,
            estimated=estimated,
            after=None,
            window=window,
            usage=_since(usage_before, context.usage),
            error=error,
        )
        raise
    return await _completed(
        request, compacted, context, reason, estimated, after, window, usage_before
    )


async def _completed(
    request: ModelRequest,
    compacted: ModelRequest,
    context: RunContext,
    reason: str,
    estimated: int,
    after: int,
    window: int,
    usage_before: Usage,
) -> ModelRequest:
    context.mark_compacted()
    await _record(
        context,
        reason=reason,
        outcome="completed",
        removed=len(request.messages) - len(compacted.messages),
        estimated=estimated,
        after=after,
        window=window,
        usage=_since(usage_before, context.usage),
        error=None,
    )
    return compacted


async def _by_strategy(
    request: ModelRequest,
    context: RunContext,
    config: ContextManagement,
    strategy: CompactionStrategy,
) -> tuple[ModelRequest, tuple[Message, ...]]:
    """The request compacted by ``strategy``, and the records to append to the log."""
    records = await compaction_records(
        request.messages,
        strategy,
        tokenizer=config.tokenizer,
        complete=context.complete,
        settings=request.settings,
    )
    current = _current_request(request.messages)
    if current is not None:  # the turn's question is never compacted away
        kept = (_uncover(record, current.id) for record in records)
        records = tuple(record for record in kept if record is not None)
    if not records:
        raise ProtocolError("the compaction strategy found nothing to compact")
    messages = build_view((*request.messages, *records))
    return ModelRequest(messages, request.tools, request.settings, request.purpose), records


def _estimate_after(
    request: ModelRequest, compacted: ModelRequest, estimated: int, tokenizer: Tokenizer
) -> int:
    """The compacted request's estimate in the units of ``estimated`` (which may be
    anchored on the provider's count): ``estimated`` plus what the messages changed by."""
    change = estimate_messages(compacted.messages, tokenizer) - estimate_messages(
        request.messages, tokenizer
    )
    return max(estimated + change, 0)


def _uncover(record: Message, message_id: str) -> Message | None:
    """``record`` without ``message_id`` among the ids it covers (``None`` if it then
    covers nothing)."""
    key = SUMMARY_COVERS_KEY if record.is_summary else COMPACTION_COVERS_KEY
    covers = [item for item in record_covers(record) if item != message_id]
    if len(covers) == len(record_covers(record)):
        return record
    if not covers:
        return None
    return attrs.evolve(record, metadata={**record.metadata, key: covers})


def _current_request(messages: Sequence[Message]) -> Message | None:
    """The newest user message that is not a summary or excerpts: the turn's question."""
    for message in reversed(messages):
        if message.role is Role.USER and not message.is_summary and not _pinned(message):
            return message
    return None


def _latest_summary(log: Sequence[Message]) -> Message | None:
    """The newest summary of the log no later summary covers."""
    covered = covered_ids(log)
    for message in reversed(log):
        if message.is_summary and message.id not in covered:
            return message
    return None


def _pinned(message: Message) -> bool:
    """Kept as they are by summaries: instructions, and the excerpts of a bounded view."""
    return (
        message.is_trusted
        or message.metadata.get(EXCERPTS_KEY) is True
        or message.metadata.get(MEMORIES_KEY) is True
    )


def _since(before: Usage, after: Usage) -> Usage:
    return Usage(
        after.input_tokens - before.input_tokens, after.output_tokens - before.output_tokens
    )


async def _record(
    context: RunContext,
    *,
    reason: str,
    outcome: str,
    removed: int,
    estimated: int,
    after: int | None,
    window: int,
    usage: Usage,
    error: BaseException | None,
) -> None:
    attributes: dict[str, Any] = {
        telemetry.COMPACTION_REASON: reason,
        telemetry.COMPACTION_OUTCOME: outcome,
        telemetry.COMPACTION_REMOVED: removed,
        telemetry.COMPACTION_ESTIMATED: estimated,
        telemetry.COMPACTION_WINDOW: window,
    }
    if after is not None:
        attributes[telemetry.COMPACTION_ESTIMATED_AFTER] = after
    error_type = telemetry.error_type(error) if error is not None else None
    if error_type is not None:
        attributes[telemetry.ERROR_TYPE] = error_type
    trace.get_current_span().add_event(telemetry.COMPACTION_EVENT, attributes)
    logger.info(
        "context compaction %s (reason=%s, removed=%d, tokens %d -> %s, window %d%s)",
        outcome,
        reason,
        removed,
        estimated,
        after,
        window,
        f", error={error_type}" if error_type else "",
    )
    await context.emit(CompactionFinished(reason, outcome, removed, after, error_type, usage))
