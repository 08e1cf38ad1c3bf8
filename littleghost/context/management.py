"""``@manage_context``: keep a conversation inside the model's context window.

This module decides *when* to compact (``compression_threshold``, ``REGROWTH``) and
recovers from overflow errors; *how* is a strategy run on the engine's index of the run's
log, by default ``Summarization``. Estimates are calibrated by the provider's token counts.
The README's "Context management" states the rules.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from decimal import Decimal
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
from attrs import define, field, frozen
from opentelemetry import trace

from littleghost import telemetry
from littleghost._validators import is_int, is_number
from littleghost.capabilities import Capability, CapabilityHook, add_capability
from littleghost.context.attempts import attempt, compaction_event
from littleghost.context.budget import (
    BudgetReport,
    PromptBudget,
    fit_request,
    load_memories,
    view_only,
)
from littleghost.context.compaction import compaction_state
from littleghost.context.config import ContextManagement, context_config, context_window
from littleghost.context.groups import SUMMARY, SYSTEM, USER
from littleghost.context.index import LogIndex
from littleghost.context.records import is_record
from littleghost.context.strategies import (
    SUMMARY_FIT_MARGIN,
    CompactionState,
    Complete,
    Summarization,
    ToolResultCompaction,
    TurnExcerpts,
    mask_tool_results,
)
from littleghost.context.tokens import Estimates, Tokenizer, estimate_message, estimate_request
from littleghost.context.triggers import Trigger, messages_exceed, tokens_exceed
from littleghost.errors import (
    UNSWALLOWED,
    CompactionError,
    ConfigurationError,
    ContextWindowOverflowError,
    PromptBudgetError,
)
from littleghost.messages import ImagePart, Message, Role, ToolResult
from littleghost.models.base import ModelRequest, ModelResponse
from littleghost.text import CHARS_PER_TOKEN, truncate_middle

if TYPE_CHECKING:
    from littleghost.run import RunContext

logger = logging.getLogger("littleghost.context")

__all__ = [
    "AFTER_KEY",
    "REGROWTH",
    "clip_results",
    "default_compaction",
    "estimate_tokens",
    "manage_context",
    "managed_state",
    "next_summary_at",
    "pinned_slots",
    "reaches",
    "remembered",
    "request_size",
]

C = TypeVar("C", bound=type)

REGROWTH = 0.1
"""After a compaction that left the request over the threshold, the share of the window
the request must grow by before the next summary call."""
TARGET_SHARE = 0.8
"""A compaction aims at this share of the threshold, so it is not due again next turn."""
CUT_SHARE = 0.5
"""Overflow recovery cuts tool results until the request takes about this share of the window."""
CUT_FLOOR_TOKENS = 64
"""The shortest such a cut leaves a tool result."""
DENSE_GAP = 1.25
"""An overflow's scale this many times what its summary call measured of the history says
the current request is denser (a smaller gap is per-message overhead the estimate omits)."""
RECOUNTS = 3
"""How many more times overflow recovery compacts, without a model, a request the model
counts over the window (``count_prompt_tokens``) before it gives up."""


def manage_context(cls: C | None = None, /, **options: Any) -> Any:
    """Keep an agent's conversations inside the model's context window.

    Use bare (``@manage_context``) or with the keywords of ``ContextManagement``. Invalid
    values, and unknown keywords, raise ``ConfigurationError`` when the class is defined.
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
        if not (isinstance(target, type) and getattr(target, "__littleghost_agent__", False)):
            raise ConfigurationError(f"@manage_context decorates an Agent subclass, not {target!r}")
        setattr(target, "context_management", config)  # noqa: B010 - any Agent subclass
        hooks = (
            CapabilityHook("before_model", _compact_before_model),
            CapabilityHook("after_model", _calibrate_after_model),
            CapabilityHook("after_model_error", _compact_after_overflow),
        )
        add_capability(target, Capability("manage_context", hooks))
        return target

    return decorate(cls) if cls is not None else decorate


@frozen
class _Counted:
    """A request the model answered, the prompt ``tokens`` it reported for it, and the
    estimated tokens of its ``instructions`` and of the ``rest`` (conversation, schemas and
    settings)."""

    request: ModelRequest
    tokens: int
    instructions: int
    rest: int


@define(eq=False)
class _Run:
    """What manage_context knows during one run."""

    window: int = 0  # 0 until the run's first call
    scale: float = 1.0  # real tokens per estimated token, from the provider's counts
    overflow: tuple[int, ContextWindowOverflowError] | None = None
    tighter: tuple[int, int] | None = None  # (turn, limit): after an overflow without summaries
    quiet_until: int | None = None  # no summary call until the estimate reaches this
    last_after: int = 0  # the size the last completed compaction left the request at
    failed_at: int | None = None  # the size a compaction failed at (``AFTER_KEY``)
    cut_to: int | None = None  # what tool results are cut to for the rest of the run
    real: dict[str, int] = field(factory=dict)  # the model's sizes of this run's summaries
    measured: float | None = None  # the last summary call's ``CompactionState.measured``
    dense: dict[str, float] = field(factory=dict)
    """Real tokens per estimated token of what an overflow added to a calibrated request
    (a density, not a size: a tool result cut later keeps it)."""
    distrusted: ModelResponse | None = None  # the newest answer whose count a cut belied
    cut_warned: bool = False  # the run warned that the server cut a prompt
    last: _Counted | None = None  # the newest answered request's count
    shrank: bool = False  # the newest count compared grew less than its request
    before: float = 1.0  # the scale before the last answered count that taught one
    kept: float = 1.0  # the scale the log's newest ``SCALE_KEY`` holds
    uncounted: bool | None = None  # the model's last count this overflow gave no figure


AFTER_KEY = "littleghost.compaction.tokens_after"
"""Metadata: the size a compaction left the request at (on its records) or failed at (on
the next answer), so a later run of the conversation knows if the next summary must wait."""
SCALE_KEY = "littleghost.context.scale"
"""Metadata of a model's answer: the calibration (real tokens per estimated token) the run
had learned by then, which the next run of the conversation starts from."""
COUNT_KEY = "littleghost.context.prompt_count"
"""Metadata of a model's answer: the prompt ``tokens`` the ``model`` reported for the request
it answered, that request's ``messages``, the estimated tokens of its ``instructions`` and
of the rest (``estimate``: conversation, schemas and settings), and whether the count grew
too little (``shrank``): the next run's first count is compared with it (``_kept_count``)."""
_COUNT_FIGURES = ("tokens", "messages", "instructions", "estimate")
MIN_SCALE, MAX_SCALE = 0.25, 8.0


def _run(context: RunContext, config: ContextManagement) -> _Run:
    state = context.state_for(_Run, _Run)
    if not state.window:
        state.window = context_window(context.model, config)
        config.check_window(state.window)
        after, state.scale = remembered(context.messages)  # what earlier runs learned
        state.kept = state.before = state.scale
        if after is not None:
            state.quiet_until = next_summary_at(after, config, state.window)
    return state


def remembered(log: Sequence[Message]) -> tuple[int | None, float]:
    """What earlier runs left in ``log``: the newest size a compaction left the request at
    (``AFTER_KEY``), if any, and the newest calibration (``SCALE_KEY``; 1.0 without one)."""
    after: int | None = None
    scale: float | None = None
    for message in reversed(log):
        if not message.metadata:  # most messages: a long log is walked whole without a record
            continue
        if after is None and is_int(message.metadata.get(AFTER_KEY)):
            after = message.metadata[AFTER_KEY]
        if scale is None and is_number(value := message.metadata.get(SCALE_KEY)):
            scale = min(max(float(value), MIN_SCALE), MAX_SCALE)
        if after is not None and scale is not None:
            break
    return after, 1.0 if scale is None else scale


def _learn_scale(
    state: _Run,
    request: ModelRequest,
    reported: int,
    context: RunContext,
    tokenizer: Tokenizer,
    served: ModelResponse | None = None,
) -> bool:
    """Set the scale from the ``reported`` prompt tokens of ``request``: beyond what is fixed
    (``_split_estimate``, schemas), over the conversation's estimate; False if that says nothing.
    For a request the model answered (``served``), a count that is not the whole prompt
    learns nothing and is not used again: one that grew less than ``MIN_SCALE`` of what the
    request added to the previous one (``_least``; a run's first is compared with the
    count the log's last answer kept, ``_kept_count``), or under ``MIN_SCALE`` of the whole
    estimate. Each of the second kind is reported (``_partial_count``); of the first, the
    second in a row or one after a reported cut (one alone can be a template's: some drop
    the tool schemas or earlier reasoning), which also takes the scale back to at least
    what it was before the last count taught one, and at least 1.0; later counts of the
    run may raise the scale, never lower it, nor may one that cannot be compared after
    one that grew too little. A scale under ``MIN_SCALE`` that sizes known before explain
    learns nothing either, unreported."""
    estimates = context.log_index.estimates(tokenizer)
    fixed, scaled = _split_estimate(request.messages, estimates, state.real, state.dense)
    schemas = _schema_estimate(request, tokenizer)
    fixed += schemas
    shrank = suspect = False  # the last count compared grew too little; this one
    least: int | None = None
    if served is not None and reported > 0:
        if state.last is None:  # the run's first count: an earlier run's last one, if any
            state.last, state.shrank = _kept_count(request, context, estimates)
        last, state.last = state.last, _counted(request, reported, estimates, schemas)
        shrank = state.shrank
        if last is None or (least := _least(request, last, estimates)) is None:
            state.shrank = shrank and _newest_count(context.messages)[2]  # past compactions
        else:
            state.shrank = suspect = reported < least  # it grew less than any scale allows
            if suspect and (shrank or state.cut_warned):  # twice in a row, or known
                state.distrusted = served
                state.scale = max(state.scale, state.before, 1.0)
                request_was = f"that adds to one it reported {last.tokens} for"
                _partial_count(state, context, reported, least, request_was)
                return False
    if reported <= fixed or scaled <= 0:
        return False
    scale = (reported - fixed) / scaled
    if served is not None and (scale < MIN_SCALE or suspect):
        state.distrusted = served  # its count is not a prefix of the next request
        if reported < (quarter := math.ceil(MIN_SCALE * (fixed + scaled))):
            _partial_count(state, context, reported, quarter, f"estimated at {fixed + scaled}")
        return False
    if served is not None:
        state.before = state.scale
        if state.cut_warned or (shrank and least is None):  # the server may cut: its
            scale = max(scale, state.scale)  # counts may raise the scale, never lower it
    state.scale = min(max(scale, MIN_SCALE), MAX_SCALE)
    return True


def _partial_count(
    state: _Run, context: RunContext, reported: int, least: int, request: str
) -> None:
    """Report a count under the ``least`` a whole prompt has: a span event each time, one
    warning a run (``request`` describes it)."""
    attributes = {
        telemetry.REPORTED_PROMPT_TOKENS: reported,
        telemetry.LEAST_PROMPT_TOKENS: least,
    }
    trace.get_current_span().add_event(telemetry.PARTIAL_COUNT_EVENT, attributes)
    if state.cut_warned:
        return
    state.cut_warned = True
    logger.warning(
        "manage_context: model %r reported %d prompt tokens for a request %s: the "
        "server most likely cut the prompt to a context window smaller than the %d tokens "
        "compacted for (Ollama can, without an error), or counts only what it had not "
        "cached; such counts are not learned from. Give the model its window "
        "(context_window=, or context_window_override= on manage_context), or update a "
        "server that counts only uncached tokens",
        context.model.name,
        reported,
        request,
        state.window,
    )


def _counted(request: ModelRequest, tokens: int, estimates: Estimates, schemas: int) -> _Counted:
    """``request`` and the ``tokens`` reported for it, with its estimates (``schemas``:
    those of its schemas and settings)."""
    leading = _instructions(request.messages)
    instructions = estimates.total(request.messages[:leading])
    rest = estimates.total(request.messages[leading:]) + schemas
    return _Counted(request, tokens, instructions, rest)


def _least(request: ModelRequest, last: _Counted, estimates: Estimates) -> int | None:
    """The fewest prompt tokens a whole count of ``request`` has, from the ``last`` count,
    when its conversation extends that one's (``None`` otherwise): that count, less what
    the instructions lost, plus ``MIN_SCALE`` of what was added other than answers and
    images (a template may render an answer's reasoning, calls or text only near the end,
    and a server counts an image as it sees fit)."""
    previous = last.request
    old, new = _instructions(previous.messages), _instructions(request.messages)
    conversation = previous.messages[old:]
    if (
        previous.tools != request.tools
        or previous.output_schema != request.output_schema
        or request.messages[new : new + len(conversation)] != conversation
    ):
        return None
    lost = last.instructions - estimates.total(request.messages[:new])
    added = request.messages[new + len(conversation) :]
    grown = 0
    for message in added:
        if message.role is Role.ASSISTANT:
            continue
        parts = [part for part in message.content if not isinstance(part, ImagePart)]
        if len(parts) == len(message.content):
            grown += estimates(message)
        else:  # an image left out (a copy, not kept by ``estimates``)
            grown += estimate_message(attrs.evolve(message, content=parts), estimates.tokenizer)
    return last.tokens - max(lost, 0) + math.ceil(MIN_SCALE * grown)


def _kept_count(
    request: ModelRequest, context: RunContext, estimates: Estimates
) -> tuple[_Counted | None, bool]:
    """The count the log's newest answer kept (``COUNT_KEY``) as ``_Run.last``: the part of
    ``request`` before that answer stands for the request it counted when the same model
    answered, no compaction record was logged since, and that part has as many messages
    and the same estimate (``None`` otherwise); and whether it shrank (carried past a
    compaction only)."""
    answer, kept, compacted = _newest_count(context.messages)
    shrank = kept.get("shrank") is True
    if answer is None or compacted or kept["model"] != context.model.name:
        return None, compacted and shrank
    ids = [message.id for message in request.messages]
    if answer.id not in ids or ids.index(answer.id) != kept["messages"]:
        return None, False
    earlier = attrs.evolve(request, messages=request.messages[: kept["messages"]])
    schemas = _schema_estimate(earlier, estimates.tokenizer)
    counted = _counted(earlier, kept["tokens"], estimates, schemas)
    if counted.rest != kept["estimate"]:
        return None, False
    return attrs.evolve(counted, instructions=kept["instructions"]), shrank


def _newest_count(log: Sequence[Message]) -> tuple[Message | None, Mapping[str, Any], bool]:
    """The log's newest answer that kept a count (``COUNT_KEY``), that count, and whether a
    compaction record was logged after it; ``(None, {}, False)`` when none did."""
    compacted = False
    for answer in reversed(log):
        compacted = compacted or is_record(answer)
        kept = answer.metadata.get(COUNT_KEY) if answer.metadata else None
        if (
            isinstance(kept, Mapping)
            and all(is_int(kept.get(key)) for key in _COUNT_FIGURES)
            and isinstance(kept.get("model"), str)
        ):
            return answer, kept, compacted
    return None, {}, False


def _instructions(messages: Sequence[Message]) -> int:
    """How many instruction messages ``messages`` starts with."""
    return next((i for i, m in enumerate(messages) if not m.role.is_trusted), len(messages))


def _split_estimate(
    messages: Sequence[Message],
    estimates: Callable[[Message], int],
    known: Mapping[str, int],
    dense: Mapping[str, float] | None = None,
) -> tuple[int, int]:
    """``messages`` as (tokens taken as they are: reported sizes (``known``), known densities
    (``dense``), instructions' estimates; the conversation's estimated tokens, to be scaled)."""
    fixed = scaled = 0
    for message in messages:
        if (size := known.get(message.id)) is not None:
            fixed += size
        elif dense and (density := dense.get(message.id)) is not None:
            fixed += math.ceil(density * estimates(message))
        elif message.role.is_trusted:
            fixed += estimates(message)
        else:
            scaled += estimates(message)
    return fixed, scaled


def _schema_estimate(request: ModelRequest, tokenizer: Tokenizer) -> int:
    """The estimated tokens of the tool schemas, output schema and prompt settings."""
    return estimate_request(
        (), request.tools, request.settings, tokenizer, output_schema=request.output_schema
    )


def request_size(
    request: ModelRequest,
    estimates: Estimates,
    known: Mapping[str, int],
    scale: float,
    dense: Mapping[str, float] | None = None,
) -> int:
    """``request``'s size in the model's tokens as far as known: its messages (the conversation
    times ``scale``, ``_split_estimate``), schemas, prompt settings and ``max_tokens``."""
    fixed, scaled = _split_estimate(request.messages, estimates, known, dense)
    outside = _schema_estimate(request, estimates.tokenizer) + (request.max_tokens or 0)
    return fixed + math.ceil(scale * scaled) + outside


def _real(messages: Sequence[Message], context: RunContext, tokenizer: Tokenizer) -> int:
    """The size of ``messages`` in the model's tokens as far as known."""
    state = context.state_for(_Run, _Run)
    estimates = context.log_index.estimates(tokenizer)
    fixed, scaled = _split_estimate(messages, estimates, state.real, state.dense)
    return fixed + math.ceil(state.scale * scaled)


def estimate_tokens(request: ModelRequest, context: RunContext, tokenizer: Tokenizer) -> int:
    """The request's size in the model's tokens as far as known, ``max_tokens`` included:
    the input tokens reported for the run's previous request when this one extends it, plus
    the rest estimated (the conversation scaled, a summary at the size the model reported)."""
    prefix, count = _extended(request, context)
    prefix = prefix or _schema_estimate(request, tokenizer)  # else estimated whole
    return prefix + _real(request.messages[count:], context, tokenizer) + (request.max_tokens or 0)


def _extended(request: ModelRequest, context: RunContext) -> tuple[int, int]:
    """(the input tokens the provider reported for the run's previous request, how many
    messages it had) when ``request`` extends it; (0, 0) otherwise."""
    if context.last_exchange is not None:
        previous, response = context.last_exchange
        count = len(previous.messages)
        if (
            response.usage.input_tokens > 0
            and response is not context.state_for(_Run, _Run).distrusted
            and previous.tools == request.tools
            and previous.output_schema == request.output_schema
            and request.messages[:count] == previous.messages  # items compared by identity first
        ):
            return response.usage.input_tokens, count
    return 0, 0


def _learn_added(
    state: _Run, request: ModelRequest, reported: int, context: RunContext, tokenizer: Tokenizer
) -> bool:
    """After an overflow of a request extending a calibrated one (the previous request, or up
    to the newest answer with ``SCALE_KEY``), keep the density of what was added since: the
    rest of ``reported``, over its estimate (``dense``); False without such a calibration."""
    estimates = context.log_index.estimates(tokenizer)
    rest, count = _extended(request, context)
    if not rest:
        marks = [i for i, m in enumerate(request.messages) if is_number(m.metadata.get(SCALE_KEY))]
        count = marks[-1] + 1 if marks else len(request.messages)
        rest = _real(request.messages[:count], context, tokenizer)
        rest += _schema_estimate(request, tokenizer)
    added = request.messages[count:]
    fixed, scaled = _split_estimate(added, estimates, state.real, state.dense)
    return _keep_density(state, added, reported - rest - fixed, scaled, replace=False)


async def _learn_turn(
    state: _Run, request: ModelRequest, context: RunContext, tokenizer: Tokenizer
) -> bool:
    """With a model that counts: the current turn's density (``dense``, replaced) from its
    count of the turn alone with the instructions and schemas; False when it cannot tell."""
    start = _turn_start(request, context)
    if start == len(request.messages):
        return False
    alone = [*(m for m in request.messages[:start] if m.role.is_trusted), *request.messages[start:]]
    counted = await _count(attrs.evolve(request, messages=alone), context)
    if counted is None:
        return False
    fixed, scaled = _split_estimate(alone, context.log_index.estimates(tokenizer), state.real)
    fixed += _schema_estimate(request, tokenizer)
    return _keep_density(state, request.messages[start:], counted - fixed, scaled, replace=True)


def _keep_density(
    state: _Run, messages: Sequence[Message], real: int, scaled: int, *, replace: bool
) -> bool:
    """Keep ``real`` over ``scaled`` tokens (bounded as a scale is) as the density of the
    conversation's ``messages`` of no known size (nor density, without ``replace``); False
    when the figures say nothing."""
    if real <= 0 or scaled <= 0:
        return False
    density = min(max(real / scaled, MIN_SCALE), MAX_SCALE)
    for message in messages:
        known = message.id in state.real or (not replace and message.id in state.dense)
        if not known and not message.role.is_trusted:
            state.dense[message.id] = density
    return True


def reaches(estimated: int, threshold: float, window: int) -> bool:
    """``estimated >= threshold × window``, exactly (0.55 × 200 000 is 110 000)."""
    return Decimal(estimated) >= Decimal(repr(threshold)) * window


def clip_results(request: ModelRequest, index: LogIndex, max_tokens: int) -> ModelRequest:
    """The request with every tool result over ``max_tokens`` cut in the middle (the log
    keeps it whole; the copy is made once per log)."""
    limit = max_tokens * CHARS_PER_TOKEN

    def clip(message: Message) -> Message:
        if message.role is not Role.TOOL or not any(
            len(result.content) > limit for result in message.tool_results
        ):
            return message

        def make() -> Message:
            parts = [
                ToolResult(p.call_id, truncate_middle(p.content, max_tokens), p.is_error)
                if isinstance(p, ToolResult)
                else p
                for p in message.content
            ]
            return Message(message.role, parts, message.id, message.metadata)

        return index.derived(message, ("clip", max_tokens), make)

    clipped = tuple(clip(message) for message in request.messages)
    if all(a is b for a, b in zip(clipped, request.messages, strict=True)):
        return request
    return attrs.evolve(request, messages=clipped)


async def _calibrate_after_model(
    agent: object, response: ModelResponse, *, context: RunContext
) -> ModelResponse | None:
    """Learn the scale from the input tokens reported for the turn's request; keep it
    (``SCALE_KEY``), that count (``COUNT_KEY``) and a failed compaction's size
    (``AFTER_KEY``) in the answer's metadata."""
    config = context_config(agent)
    if config is None:  # ``context_management`` set to None on the agent: not managed
        return None
    assert context.last_exchange is not None  # set by the turn's call these hooks follow
    state = _run(context, config)
    request, answered = context.last_exchange
    _learn_scale(state, request, answered.usage.input_tokens, context, config.tokenizer, answered)
    kept: dict[str, Any] = {}
    moved = state.scale != 1.0 or state.kept != 1.0  # 1.0 is kept too once another was
    if moved and response.message.metadata.get(SCALE_KEY) != state.scale:
        kept[SCALE_KEY] = state.kept = state.scale
    if state.last is not None and state.last.request is request:  # this call's count
        kept[COUNT_KEY] = {
            "tokens": state.last.tokens,
            "model": context.model.name,
            "messages": len(request.messages),
            "instructions": state.last.instructions,
            "estimate": state.last.rest,
            "shrank": state.shrank,
        }
    if state.failed_at is not None:
        kept[AFTER_KEY], state.failed_at = state.failed_at, None
    if not kept:
        return None
    metadata = {**response.message.metadata, **kept}
    return attrs.evolve(response, message=attrs.evolve(response.message, metadata=metadata))


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
        request = clip_results(request, context.log_index, min(limits))
    report: BudgetReport | None = None
    if config.budget is not None:
        request, report = await _bounded(request, context, config, config.budget)
    if config.summarize:
        estimated = estimate_tokens(request, context, config.tokenizer)
        if reaches(estimated, config.compression_threshold, state.window):
            request = await _proactive(request, context, config, estimated)
    if report is not None and config.budget is not None:  # the figures of the request sent
        tokenizer = config.budget.tokenizer
        estimates = context.log_index.estimates(tokenizer)
        sent = estimate_request(request.messages, request.tools, {}, tokenizer, estimates)
        report = attrs.evolve(
            report, messages_kept=len(request.messages), estimated_prompt_tokens=sent
        )
        context.annotate_next_call(report.span_attributes())
    return None if request is original else request


async def _proactive(
    request: ModelRequest, context: RunContext, config: ContextManagement, estimated: int
) -> ModelRequest:
    """Compact a request over the threshold, unless the last attempt left it over and it
    has not grown enough since (then the skip is recorded)."""
    state = _run(context, config)
    window = state.window
    if state.quiet_until is not None and estimated < state.quiet_until:
        why = (
            "the last compaction left the request over the threshold; the next waits until "
            f"it has grown to {state.quiet_until} tokens"
        )
        compaction_event(
            "threshold", "skipped", estimated, window, {telemetry.COMPACTION_SKIPPED: why}
        )
        return request
    target = int(TARGET_SHARE * config.compression_threshold * window)
    compacted, after = request, estimated
    try:
        compacted = await _compact(request, context, config, "threshold", estimated, window, target)
        after = state.last_after
    except UNSWALLOWED:
        raise
    except Exception:
        state.failed_at = estimated  # recorded; the request goes as it was
    state.quiet_until = next_summary_at(after, config, window)
    return compacted


async def _bounded(
    request: ModelRequest, context: RunContext, config: ContextManagement, budget: PromptBudget
) -> tuple[ModelRequest, BudgetReport]:
    """The request bounded to the budget (tighter after an overflow in this turn)."""
    state = _run(context, config)
    window = state.window
    limit = budget.limit(window, request.max_tokens)
    if limit <= 0:
        raise PromptBudgetError(
            f"the model's {window}-token window leaves no room for a prompt after "
            f"max(response_reserve_tokens, max_tokens) and safety_reserve_tokens",
            limit=limit,
        )
    if state.tighter is not None and state.tighter[0] == context.turn:
        limit = min(limit, state.tighter[1])  # > 0: ``_shrink`` sets no other
    memories = await load_memories(budget, context)
    cap = config.summary_cap(window)
    return fit_request(
        request, budget, limit, memories, summary_tokens=cap, index=context.log_index
    )


async def _compact_after_overflow(
    agent: object, request: ModelRequest, error: Exception, *, context: RunContext
) -> ModelRequest | None:
    config = context_config(agent)
    if config is None or not isinstance(error, ContextWindowOverflowError):
        return None
    state = _run(context, config)
    if state.overflow is not None and state.overflow[0] == context.turn:
        raise error from state.overflow[1]
    state.overflow = (context.turn, error)
    state.uncounted = None  # asked again for this overflow
    reported = error.prompt_tokens or await _count(request, context) or 0
    # the current turn's or the added part's density, then the history's scale (with what
    # a clamp left over)
    added = reported > 0 and (
        await _learn_turn(state, request, context, config.tokenizer)
        or _learn_added(state, request, reported, context, config.tokenizer)
    )
    if reported and (_learn_scale(state, request, reported, context, config.tokenizer) or added):
        estimated = reported + (request.max_tokens or 0)
    else:
        estimated = estimate_tokens(request, context, config.tokenizer)
    window = min(state.window, error.context_window or state.window)
    fits = window if reported else min(window, max(estimated // 2, 1))  # else halve at least
    safe = None if reported and not added else fits  # None: to be measured (``_recover``)
    try:
        if config.summarize:
            if reported and state.uncounted is None:  # whether the model counts at all
                await _count(request, context)
            uncounted = bool(reported) and bool(state.uncounted)  # a figure, not a count
            recovered = await _recover(
                request, context, config, estimated, window, fits, safe, uncounted
            )
            state.quiet_until = next_summary_at(state.last_after, config, state.window)
            return recovered
        return await _shrink(request, context, config, estimated, fits)
    except UNSWALLOWED:
        raise
    except CompactionError as failure:
        raise error from failure
    except Exception as failure:
        cause = CompactionError(f"overflow recovery failed: {type(failure).__name__}")
        cause.__cause__ = failure
        raise error from cause


async def _recover(
    request: ModelRequest,
    context: RunContext,
    config: ContextManagement,
    estimated: int,
    window: int,
    fits: int,
    safe: int | None,
    uncounted: bool,
) -> ModelRequest:
    """Compact for an overflow in ``window`` until the request is under ``fits`` tokens,
    aiming under ``safe``: a summary when one can be made, then the model-free steps while
    over ``safe`` (or when no summary was made). ``safe`` is ``None`` when the overflow's
    figure is the run's only calibration: the summary call's measure then gives the margin
    (``_margin``), else it is 20 % under ``fits``. A model that counts decides the fit by
    its count (``_counted_fit``); one that gave the overflow's figure but cannot count
    (``uncounted``) has ``safe`` 20 % under ``fits`` at most.

    Raises:
        CompactionError: Even the current request alone does not fit.
    """
    state = _run(context, config)
    target = int(TARGET_SHARE * min(config.compression_threshold * state.window, fits))
    compact = partial(
        _compact, context=context, config=config, reason="overflow", window=window, target=target
    )

    async def tighten(view: ModelRequest, counted: int) -> ModelRequest:
        """Calibrated by the model's count of ``view``, the model-free steps, aiming as far
        under what the estimate makes of ``view`` as the count was over ``fits``."""
        _learn_scale(state, view, counted, context, config.tokenizer)
        size = counted + _answer_room(view)
        estimates = context.log_index.estimates(config.tokenizer)
        believed = request_size(view, estimates, state.real, state.scale, state.dense)
        aim = max(min(believed, fits) - (size - fits), 1)
        return await compact(view, estimated=size, limit=fits, fallback=aim)

    compacted, failure = request, None
    try:
        compacted = await compact(request, estimated=estimated)
    except UNSWALLOWED:
        raise
    except Exception as error:
        failure = error  # recorded; fall back to a compaction without a model
    summarized = compacted is not request
    if summarized and (fitted := await _counted_fit(compacted, context, fits, tighten)):
        return fitted
    if safe is None and summarized and state.measured is not None:
        safe = fits - _margin(request, context, config.tokenizer, state.measured)
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
        if state.uncounted:
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
    tighten: Callable[[ModelRequest, int], Awaitable[ModelRequest]],
) -> ModelRequest | None:
    """``request`` once the model counts it, with its answer's room, within ``fits``, after
    ``tighten(request, count)`` at most ``RECOUNTS`` times; ``None`` if the model cannot count.

    Raises:
        CompactionError: The model still counts it over ``fits``.
    """
    counted = await _count(request, context)
    if counted is None:
        return None
    for recount in range(RECOUNTS + 1):
        if counted + _answer_room(request) <= fits:
            context.annotate_next_call({telemetry.COMPACTION_COUNTED: counted})
            return request
        if recount == RECOUNTS:
            break
        request = await tighten(request, counted)
        recounted = await _count(request, context)
        if recounted is None:
            return request  # the model no longer counts: the estimate says it fits
        counted = recounted
    raise CompactionError(
        f"the model counts {counted} prompt tokens for the compacted request; with its "
        f"answer's room that is over the {fits}-token window"
    )


async def _count(request: ModelRequest, context: RunContext) -> int | None:
    """The model's count of ``request`` (``None`` when it cannot tell), remembered in
    ``uncounted``."""
    counted = await context.count_prompt_tokens(request)
    context.state_for(_Run, _Run).uncounted = counted is None
    return counted


def _answer_room(request: ModelRequest) -> int:
    """The room a counted request's answer needs: its ``max_tokens``, and at least one
    token (a server needs one to answer: llama.cpp refuses a prompt of its whole window)."""
    return max(request.max_tokens or 0, 1)


def next_summary_at(after: int, config: ContextManagement, window: int) -> int | None:
    """The size a request a compaction left at ``after`` must reach before the next summary
    call: ``REGROWTH`` of the window more when ``after`` reaches the threshold, else None."""
    if reaches(after, config.compression_threshold, window):
        return after + max(1, int(REGROWTH * window))
    return None


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
    state.room = int(window * SUMMARY_FIT_MARGIN)
    kinds, members = index.layout.slots()
    count, state.protected = 0, 0
    for slot in range(len(kinds) - 1, -1, -1):
        if kinds[slot] != SYSTEM:
            count += len(members[slot])
            if count >= config.preserve_recent_messages:
                state.protected = slot
                break
    return state


def pinned_slots(index: LogIndex, logged: Callable[[str], bool] | None = None) -> frozenset[int]:
    """The slots of ``index``'s view a compaction keeps: those holding view-only messages
    and, in a run (``logged`` tells the ids its log holds), messages the log does not hold
    (a hook's injected material), and the current request."""

    def kept(message: Message) -> bool:
        return view_only(message) or (logged is not None and not logged(message.id))

    kinds, members = index.layout.slots()
    pinned = {slot for slot in range(len(kinds)) if any(map(kept, members[slot]))}
    if logged is not None:
        for slot in range(len(kinds) - 1, -1, -1):
            if kinds[slot] == USER and not kept(members[slot][0]):
                pinned.add(slot)  # the current request
                break
    return frozenset(pinned)


async def _compact(
    request: ModelRequest,
    context: RunContext,
    config: ContextManagement,
    reason: str,
    estimated: int,
    window: int,
    target: int,
    *,
    limit: int | None = None,
    fallback: int | None = None,
) -> ModelRequest:
    """Compact ``request`` toward ``target`` (the model's tokens) with the configured
    strategy, the default compaction, or (``fallback``) without a model, aiming under
    ``fallback`` and cutting tool results while over ``limit`` (default ``window``; read
    only with ``fallback``, which leaves a bounded view's memories and excerpts out
    first); append the records to the log.

    Raises:
        CompactionError: Nothing was compacted, the result is no smaller, or (fallback)
            even the current request alone is over ``limit``.
    """
    limit = window if limit is None else limit
    shown = request.messages
    if fallback is not None:  # never logged: left out without a record
        shown = tuple(message for message in shown if not view_only(message))
    async with attempt(context, reason, estimated, window, fallback is not None) as outcome:
        run = _run(context, config)
        index = context.log_index.over(shown)
        complete = partial(context.complete, report=False)
        state = managed_state(index, config, window, complete, request.settings)
        state.pinned = pinned_slots(index, context.has_message)
        state.scale = run.scale
        outside = (request.max_tokens or 0) + _schema_estimate(request, config.tokenizer)
        outside += _excess(request.messages, context, config.tokenizer)  # known sizes
        goal = _goal(state, target, outside)
        if fallback is not None or (reason == "overflow" and config.strategy is None):
            state.protected = max(state.pinned, default=state.slots)  # the current turn
        try:
            if fallback is not None:
                await _model_free_compaction(state, goal, _goal(state, fallback, outside), window)
            elif config.strategy is not None:
                await config.strategy.compact(state)
            else:
                threshold = int(config.compression_threshold * window)
                enough = None if reason == "overflow" else _goal(state, threshold, outside)
                await default_compaction(state, config, window, goal, enough)
        finally:
            scale, run.scale = run.scale, state.scale  # a summary call may have taught it
        run.measured = state.measured
        outcome.summary = state.summary_outcome
        records = state.records()
        run.real.update(state.real)
        compacted = attrs.evolve(request, messages=state.view())
        before, kept = {m.id for m in request.messages}, {m.id for m in compacted.messages}
        added = [m for m in compacted.messages if m.id not in before]
        removed = [m for m in request.messages if m.id not in kept]
        change = _real(added, context, config.tokenizer) - _real(removed, context, config.tokenizer)
        if run.scale != scale:  # ``estimated`` is in the old units: estimate it in the new
            estimated = outcome.before = request_size(
                request, index.estimates(config.tokenizer), run.real, run.scale, run.dense
            )
        after = max(estimated + change, 0)  # the units of ``estimated``, as far as known
        if fallback is not None and after > limit:
            compacted, after, outcome.cut_to = await _cut_results(
                compacted, after, limit, context, config
            )
        if not records and outcome.cut_to is None and len(shown) == len(request.messages):
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
        outcome.after, outcome.removed = after, len(request.messages) - len(compacted.messages)
        run.last_after, run.failed_at = after, None  # the records say where it is now
        run.cut_to = outcome.cut_to or run.cut_to
    return attrs.evolve(compacted, messages=[marked.get(m.id, m) for m in compacted.messages])


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
    request: ModelRequest, size: int, window: int, context: RunContext, config: ContextManagement
) -> tuple[ModelRequest, int, int | None]:
    """``request`` (``size`` tokens) with every tool result cut shorter until it takes
    ``CUT_SHARE`` of ``window`` (or ``CUT_FLOOR_TOKENS``); the request, its size and the cut
    (``None`` when nothing was cut). When the estimate is still over the window, the
    model's count decides.

    Raises:
        CompactionError: The request still does not fit the window.
    """
    tokenizer, index = config.tokenizer, context.log_index
    whole = _real(request.messages, context, tokenizer)
    results = [len(r.content) for message in request.messages for r in message.tool_results]
    limit = max(results, default=0) // CHARS_PER_TOKEN
    cut, after = request, size
    while limit > CUT_FLOOR_TOKENS and after > CUT_SHARE * window:
        limit = max(limit * 3 // 4, CUT_FLOOR_TOKENS)
        cut = clip_results(request, index, limit)
        after = size - whole + _real(cut.messages, context, tokenizer)
    if after > window and (counted := await _count(cut, context)) is not None:
        after = counted + _answer_room(cut)
    if after > window:
        cut_note = f", its tool results cut to {limit} tokens each" if cut is not request else ""
        raise CompactionError(
            f"the current request alone does not fit the context window (about {after} of "
            f"{window} tokens{cut_note})"
        )
    return cut, after, limit if cut is not request else None


async def _collapse_results(state: CompactionState, target: Trigger, window: int) -> None:
    """Collapse older tool results, the protected groups' too, to one line each (of a 25th
    of the window's tokens in characters, 16 to 400) until ``target`` holds."""
    protected, state.protected = state.protected, state.slots
    chars = min(max(window // 25, 16), 400)
    await ToolResultCompaction(target=target, max_result_chars=chars).compact(state)
    state.protected = protected


def _margin(
    request: ModelRequest, context: RunContext, tokenizer: Tokenizer, measured: float
) -> int:
    """How much the run's scale, learned from one overflow of ``request``, may undercount
    its current request: what it gives the history beyond the ``measured`` scale of it."""
    run = context.state_for(_Run, _Run)
    if run.scale <= DENSE_GAP * measured:
        return 0
    earlier = request.messages[: _turn_start(request, context)]
    _, history = _split_estimate(earlier, context.log_index.estimates(tokenizer), run.real)
    return math.ceil((run.scale - measured) * history)


def _turn_start(request: ModelRequest, context: RunContext) -> int:
    """Where the current turn starts in ``request``: its last user message that the run's
    log holds and that is no summary (the end of the request when there is none)."""
    logged = [
        i
        for i, m in enumerate(request.messages)
        if m.role is Role.USER and context.has_message(m.id) and not m.is_summary
    ]
    return logged[-1] if logged else len(request.messages)


def _excess(messages: Sequence[Message], context: RunContext, tokenizer: Tokenizer) -> int:
    """How far the known sizes of ``messages`` exceed the scaled estimates a state counts."""
    run, estimates = context.state_for(_Run, _Run), context.log_index.estimates(tokenizer)
    known = [m for m in messages if m.id in run.real or m.id in run.dense]
    return _real(known, context, tokenizer) - math.ceil(run.scale * sum(map(estimates, known)))


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
) -> None:
    """Toward ``goal`` (estimated tokens): mask older tool results (``mask_tool_results``);
    collapse the tail's when it alone is over (no summary once under ``enough``); summarize
    about ``summary_ratio`` of the rest, more when needed; collapse again if still over."""
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
    the model counts it over ``fits`` (``_counted_fit``).

    Raises:
        CompactionError: No view fits in ``fits`` tokens (the reserves or the current turn
            take them), or the model still counts the view over them.
    """
    state, budget = _run(context, config), config.budget
    assert budget is not None

    def set_limit(to: int, why: str) -> None:
        if to <= 0:
            raise CompactionError(f"{why}: no view fits in {fits} tokens")
        state.tighter = (context.turn, to)

    room = budget.limit(fits, request.max_tokens)
    answer = max(budget.response_reserve_tokens, request.max_tokens or 0)
    prompt = estimated - (request.max_tokens or 0)  # the overflow's size, without the answer

    async def bounded() -> tuple[ModelRequest, BudgetReport]:
        try:
            return await _bounded(request, context, config, budget)
        except PromptBudgetError as error:  # the current turn alone is over (figures only)
            alone = error.required or 0  # the model's count, if it counts, has the last word
            sized = math.ceil(alone * prompt / max(sent, 1))  # scaled as the view it sized
            within = state.uncounted is False or alone <= room or sized <= fits - answer
            if not limit < alone or not within:
                raise CompactionError(str(error)) from error
        set_limit(alone, "the current request alone")  # tightened past it: the turn alone
        return await _bounded(request, context, config, budget)

    async with attempt(context, "overflow", estimated, fits, False) as outcome:
        estimates = context.log_index.estimates(budget.tokenizer)
        sent = estimate_request(request.messages, request.tools, {}, budget.tokenizer, estimates)
        limit = int(0.9 * min(room, sent * fits / max(estimated, 1)))  # as the overflow sized it
        reserves = "max(response_reserve_tokens, max_tokens) and safety_reserve_tokens"
        why = reserves if room <= 0 else f"the overflow's {estimated} tokens for a view of {sent}"
        set_limit(limit, f"{why} leave no room for a prompt")
        shrunk, report = await bounded()

        async def tighter(view: ModelRequest, counted: int) -> ModelRequest:
            nonlocal limit, report
            limit = int(0.9 * limit * fits / (counted + _answer_room(view)))
            limit = min(limit, report.estimated_prompt_tokens - 1)  # under the view it tightens
            set_limit(limit, f"the model counts {counted} prompt tokens for the bounded view")
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
        outcome.removed = len(request.messages) - len(shrunk.messages)
    return shrunk
