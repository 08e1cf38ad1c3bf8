"""What the provider's token counts teach a run (the scale, real tokens per estimated
token, and densities of what an overflow added) and the request sizes they give. The
"Calibrated by the provider" in docs/context.md states the rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
from attrs import define, field, frozen
from opentelemetry import trace

from littleghost import logs, telemetry
from littleghost._validators import is_int, is_number
from littleghost.context.budget import view_only
from littleghost.context.groups import SYSTEM
from littleghost.context.index import starts_with
from littleghost.context.records import is_record
from littleghost.context.tokens import Estimates, Tokenizer, schema_estimate
from littleghost.messages import Message, Role
from littleghost.models.base import Model, ModelRequest, ModelResponse

if TYPE_CHECKING:
    from littleghost.run import RunContext

logger = logs.logger("littleghost.context")

__all__ = [
    "SCALE_FOR_KEY",
    "SCALE_KEY",
    "Calibration",
    "asked",
    "calibrated_size",
    "calibration",
    "estimate_tokens",
    "excess",
    "kept_scale",
    "learn_added",
    "learn_answer",
    "learn_scale",
    "learn_turn",
    "margin",
    "model_count",
    "real_size",
    "request_size",
    "resume",
    "scale_for",
    "turn_start",
]

SCALE_KEY = "littleghost.context.scale"
"""Metadata of a model's answer: the run's scale then, which the next run starts from
when it is for the same model and estimate (``SCALE_FOR_KEY``)."""
SCALE_FOR_KEY = "littleghost.context.scale_for"
"""Metadata beside ``SCALE_KEY``: what the scale was learned for (``scale_for``)."""
COUNT_KEY = "littleghost.context.prompt_count"
"""Metadata of a model's answer: the count of the request it answered (``_Counted``'s
figures, and ``shrank``), which the next run's first count is compared with."""
_COUNT_FIGURES = ("tokens", "messages", "instructions", "estimate")
MIN_SCALE, MAX_SCALE = 0.25, 8.0
DENSE_GAP = 1.25
"""An overflow's scale this many times what its summary call measured says the current
request is denser; a smaller gap is as often the estimate's units (framing, a denser
tail), and leaving room for it would drop summaries that fit."""
RECALLED = 8
"""How many of the model's newest counts a run remembers (a request counted again costs
no second call)."""


@frozen
class _Counted:
    """A request the model answered, the prompt ``tokens`` it reported, and the estimates
    of its ``instructions`` and the ``rest``."""

    request: ModelRequest
    tokens: int
    instructions: int
    rest: int


@frozen(eq=False)
class _Split:
    """``_split_estimate`` of an answered request's ``messages`` by these ``estimates``
    and densities (``real`` and ``dense``), and the estimates' plain ``total``: what the
    next request carries over when it starts with the same message objects and the
    estimates and densities are the same objects (the densities are replaced when they
    change, never changed in place)."""

    messages: tuple[Message, ...]
    estimates: Estimates
    real: Mapping[str, float]
    dense: Mapping[str, float]
    fixed: int
    scaled: int
    total: int


@define(eq=False)
class Calibration:
    """What the provider's counts taught one run."""

    scale: float = 1.0  # real tokens per estimated token, from the provider's counts
    # this run's summaries' reported densities; replaced when it changes (``_Split``)
    real: Mapping[str, float] = field(factory=dict)
    measured: float | None = None  # the last summary call's ``CompactionState.measured``
    # what an overflow added, as densities (not sizes: a copy cut later keeps them);
    # replaced when it changes, as ``real`` is
    dense: Mapping[str, float] = field(factory=dict)
    distrusted: ModelResponse | None = None  # the newest answer whose count a cut belied
    cut_warned: bool = False  # the run warned that the server cut a prompt
    last: _Counted | None = None  # the newest answered request's count
    shrank: bool = False  # the newest count compared grew less than its request
    before: float = 1.0  # the scale before the last answered count that taught one
    kept: float = 1.0  # the scale the log's newest ``SCALE_KEY`` holds
    uncounted: bool | None = None  # the model's last count this overflow gave no figure
    counts: list[tuple[ModelRequest, int]] = field(factory=list)  # the newest, ``RECALLED``
    split: _Split | None = None  # the newest answered request's, to carry over


def calibration(context: RunContext) -> Calibration:
    """The run's calibration."""
    return context.state_for(Calibration, Calibration)


def scale_for(model: Model, tokenizer: Tokenizer) -> str:
    """What a scale is learned for: ``"openai:gpt-4o-mini by CharacterEstimator"``."""
    return f"{model.provider}:{model.name} by {type(tokenizer).__name__}"


def resume(context: RunContext, scale: float) -> None:
    """Start the run's calibration from the ``scale`` an earlier run kept (``kept_scale``)."""
    state = calibration(context)
    state.scale = state.kept = state.before = scale


def kept_scale(metadata: Mapping[str, Any], learned_for: str | None) -> float | None:
    """The scale ``metadata`` kept for ``learned_for`` (``None``: any), bounded, if any."""
    value = metadata.get(SCALE_KEY)
    if not is_number(value) or learned_for not in (None, metadata.get(SCALE_FOR_KEY)):
        return None
    return min(max(float(value), MIN_SCALE), MAX_SCALE)


def learn_answer(
    response: ModelResponse, context: RunContext, tokenizer: Tokenizer, window: int
) -> dict[str, Any]:
    """Learn the scale from the turn's reported input tokens (for the current turn alone,
    only its density); what ``response``'s metadata keeps (``SCALE_KEY``, ``COUNT_KEY``)."""
    assert context.last_exchange is not None  # set by the turn's call the hook follows
    state = calibration(context)
    request, answered = context.last_exchange
    reported = answered.usage.input_tokens
    if learn_scale(request, reported, context, tokenizer, window, answered):
        start = _turn_start(request.messages, context)
        if _left_out(request, start, context):  # the count says nothing of what was left out
            _learn_alone(request, start, reported, context, tokenizer)
            state.scale = state.before
    kept: dict[str, Any] = {}
    moved = state.scale != 1.0 or state.kept != 1.0  # 1.0 is kept too once another was
    if moved and response.message.metadata.get(SCALE_KEY) != state.scale:
        kept[SCALE_KEY] = state.kept = state.scale
        kept[SCALE_FOR_KEY] = scale_for(context.model, tokenizer)
    if state.last is not None and state.last.request is request:  # this call's count
        kept[COUNT_KEY] = {
            "tokens": state.last.tokens,
            "model": context.model.name,
            "messages": len(request.messages),
            "instructions": state.last.instructions,
            "estimate": state.last.rest,
            "shrank": state.shrank,
        }
    return kept


def learn_scale(
    request: ModelRequest,
    reported: int,
    context: RunContext,
    tokenizer: Tokenizer,
    window: int,
    served: ModelResponse | None = None,
) -> bool:
    """Set the scale from ``request``'s ``reported`` prompt tokens beyond what is fixed,
    over the conversation's estimate; False if that says nothing. For an answered request
    (``served``), a count that is not the whole prompt teaches nothing: one under
    ``MIN_SCALE`` of the estimate (reported), or one that grew less than ``_least``
    allows. The latter is reported only the second time in a row or after a reported cut
    (one alone can be a template's dropping schemas or reasoning); it takes the scale back
    to what it was, at least 1.0, and later counts may then only raise it."""
    state, estimates = calibration(context), context.log_index.estimates(tokenizer)
    split = _request_split(request.messages, estimates, state)
    schemas = schema_estimate(request, tokenizer)
    fixed, scaled = split.fixed + schemas, split.scaled
    shrank = suspect = False  # the last count compared grew too little; this one
    least: int | None = None
    if served is not None and reported > 0:
        if state.last is None:  # the run's first count: an earlier run's last one, if any
            state.last, state.shrank = _kept_count(request, context, estimates)
        counted = _counted(request, reported, estimates, schemas, split.total)
        last, state.last = state.last, counted
        shrank = state.shrank
        if last is None or (least := _least(request, last, estimates)) is None:
            state.shrank = shrank and _newest_count(context.messages)[2]  # past compactions
        else:
            state.shrank = suspect = reported < least  # it grew less than any scale allows
            if suspect and (shrank or state.cut_warned):  # twice in a row, or known
                state.distrusted = served
                state.scale = max(state.scale, state.before, 1.0)
                request_was = f"that adds to one it reported {last.tokens} for"
                _partial_count(state, context, reported, least, request_was, window)
                return False
    if scaled <= 0:
        return False
    scale = (reported - fixed) / scaled  # at most 0: no more than instructions and schemas
    if served is not None and reported > 0 and (scale < MIN_SCALE or suspect):
        state.distrusted = served  # its count is not a prefix of the next request
        if fixed < reported < (quarter := math.ceil(MIN_SCALE * (fixed + scaled))):
            estimated = f"estimated at {fixed + scaled}"
            _partial_count(state, context, reported, quarter, estimated, window)
        return False
    if reported <= fixed:
        return False
    if served is not None:
        state.before = state.scale
        if state.cut_warned or (shrank and least is None):  # the server may cut: its
            scale = max(scale, state.scale)  # counts may raise the scale, never lower it
    state.scale = min(max(scale, MIN_SCALE), MAX_SCALE)
    return True


def _partial_count(
    state: Calibration, context: RunContext, reported: int, least: int, request: str, window: int
) -> None:
    """Report a count under the ``least`` a whole prompt has: a span event each time, one
    warning a run."""
    attributes = {telemetry.REPORTED_PROMPT_TOKENS: reported, telemetry.LEAST_PROMPT_TOKENS: least}
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
        window,
    )


def _counted(
    request: ModelRequest, tokens: int, estimates: Estimates, schemas: int, total: int
) -> _Counted:
    """``request`` and the ``tokens`` reported for it, with its estimates (``total``, of
    its messages)."""
    instructions = estimates.total(request.messages[: _instructions(request.messages)])
    return _Counted(request, tokens, instructions, total - instructions + schemas)


def _least(request: ModelRequest, last: _Counted, estimates: Estimates) -> int | None:
    """The fewest prompt tokens a whole count of ``request`` has when it extends the
    ``last`` one (else ``None``): that count, less lost instructions, plus ``MIN_SCALE`` of
    what was added other than answers and images (templates and servers vary on those)."""
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
    grown = sum(estimates(m) - estimates.images(m) for m in added if m.role is not Role.ASSISTANT)
    return last.tokens - max(lost, 0) + math.ceil(MIN_SCALE * grown)


def _kept_count(
    request: ModelRequest, context: RunContext, estimates: Estimates
) -> tuple[_Counted | None, bool]:
    """The count the log's newest answer kept (``COUNT_KEY``), as ``Calibration.last``, when
    ``request`` still starts with what it counted (same model, no compaction since, same
    size and estimate), else ``None``; and whether it shrank (carried past a compaction)."""
    answer, kept, compacted = _newest_count(context.messages)
    shrank = kept.get("shrank") is True
    if answer is None or compacted or kept["model"] != context.model.name:
        return None, compacted and shrank
    ids = [message.id for message in request.messages]
    if answer.id not in ids or ids.index(answer.id) != kept["messages"]:
        return None, False
    earlier = attrs.evolve(request, messages=request.messages[: kept["messages"]])
    schemas = schema_estimate(earlier, estimates.tokenizer)
    total = estimates.total(earlier.messages)
    counted = _counted(earlier, kept["tokens"], estimates, schemas, total)
    if counted.rest != kept["estimate"]:
        return None, False
    return attrs.evolve(counted, instructions=kept["instructions"]), shrank


def _newest_count(log: Sequence[Message]) -> tuple[Message | None, Mapping[str, Any], bool]:
    """The log's newest answer with a ``COUNT_KEY``, that count, and whether a compaction
    record follows it; ``(None, {}, False)`` without one."""
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
    estimates: Estimates,
    known: Mapping[str, float],
    dense: Mapping[str, float] | None = None,
) -> tuple[int, int]:
    """``messages`` as (tokens taken as they are: instructions, images, text at a known
    density; the conversation's estimated text tokens, to be scaled)."""
    fixed = scaled = 0
    for message in messages:
        density = known.get(message.id)
        if density is None and dense:
            density = dense.get(message.id)
        if density is None and message.role.is_trusted:
            fixed += estimates(message)
            continue
        images = estimates.images(message)  # an allowance each: a text density is not theirs
        text = estimates(message) - images
        if density is not None:  # a reported size times its estimate over it: no float excess
            fixed += images + math.ceil(density * text - 1e-9)
        else:
            fixed, scaled = fixed + images, scaled + text
    return fixed, scaled


def _request_split(messages: Sequence[Message], estimates: Estimates, state: Calibration) -> _Split:
    """``_split_estimate`` of an answered request's ``messages`` by the run's densities,
    and their plain total, the newest request's (``Calibration.split``) carried over."""
    carried = state.split
    if not (
        carried is not None
        and carried.estimates is estimates
        and carried.real is state.real
        and carried.dense is state.dense
        and starts_with(messages, carried.messages)
    ):
        carried = _Split((), estimates, state.real, state.dense, 0, 0, 0)
    added = messages[len(carried.messages) :]
    fixed, scaled = _split_estimate(added, estimates, state.real, state.dense)
    sums = (carried.fixed + fixed, carried.scaled + scaled, carried.total + estimates.total(added))
    state.split = _Split(tuple(messages), estimates, state.real, state.dense, *sums)
    return state.split


def request_size(request: ModelRequest, estimates: Estimates, state: Calibration) -> int:
    """``request``'s size in the model's tokens as ``state`` knows it, ``max_tokens``
    included."""
    outside = schema_estimate(request, estimates.tokenizer) + (request.max_tokens or 0)
    return _scaled_size(request.messages, estimates, state) + outside


def _scaled_size(messages: Sequence[Message], estimates: Estimates, state: Calibration) -> int:
    """The size of ``messages`` in the model's tokens as ``state`` knows it."""
    fixed, scaled = _split_estimate(messages, estimates, state.real, state.dense)
    return fixed + math.ceil(state.scale * scaled)


def calibrated_size(request: ModelRequest, context: RunContext, tokenizer: Tokenizer) -> int:
    """``request``'s size in the model's tokens as the run's calibration knows it."""
    return request_size(request, context.log_index.estimates(tokenizer), calibration(context))


def real_size(messages: Sequence[Message], context: RunContext, tokenizer: Tokenizer) -> int:
    """The size of ``messages`` in the model's tokens as far as known."""
    return _scaled_size(messages, context.log_index.estimates(tokenizer), calibration(context))


def estimate_tokens(request: ModelRequest, context: RunContext, tokenizer: Tokenizer) -> int:
    """The request's size in the model's tokens as far as known, ``max_tokens`` included:
    the previous request's reported input tokens when this one extends it, plus the rest."""
    prefix, count = _extended(request, context)
    prefix = prefix or schema_estimate(request, tokenizer)  # else estimated whole
    return (
        prefix + real_size(request.messages[count:], context, tokenizer) + (request.max_tokens or 0)
    )


def _extended(request: ModelRequest, context: RunContext) -> tuple[int, int]:
    """(the previous request's reported input tokens, its length) when ``request`` extends
    it; (0, 0) otherwise."""
    if context.last_exchange is not None:
        previous, response = context.last_exchange
        count = len(previous.messages)
        if (
            response.usage.input_tokens > 0
            and response is not calibration(context).distrusted
            and previous.tools == request.tools
            and previous.output_schema == request.output_schema
            and request.messages[:count] == previous.messages  # items compared by identity first
        ):
            return response.usage.input_tokens, count
    return 0, 0


def learn_added(
    request: ModelRequest, reported: int, context: RunContext, tokenizer: Tokenizer
) -> bool:
    """After an overflow of a request extending a calibrated one (the previous request or
    up to the newest ``SCALE_KEY``), keep the density of what was added since; False
    without one."""
    state, estimates = calibration(context), context.log_index.estimates(tokenizer)
    rest, count = _extended(request, context)
    if not rest:
        learned_for = scale_for(context.model, tokenizer)
        marks = [
            i
            for i, m in enumerate(request.messages)
            if kept_scale(m.metadata, learned_for) is not None
        ]
        count = marks[-1] + 1 if marks else len(request.messages)
        rest = real_size(request.messages[:count], context, tokenizer)
        rest += schema_estimate(request, tokenizer)
    added = request.messages[count:]
    fixed, scaled = _split_estimate(added, estimates, state.real, state.dense)
    return _keep_density(state, added, reported - rest - fixed, scaled, replace=False)


async def learn_turn(request: ModelRequest, context: RunContext, tokenizer: Tokenizer) -> bool:
    """Learn the current turn's density from the model's count of it alone; False when it
    cannot tell."""
    start = _turn_start(request.messages, context)
    if start == len(request.messages):
        return False
    alone = attrs.evolve(request, messages=_alone(request.messages, start))
    counted = await model_count(alone, context)
    if counted is None:
        return False
    return _learn_alone(request, start, counted, context, tokenizer)


def _learn_alone(
    request: ModelRequest, start: int, counted: int, context: RunContext, tokenizer: Tokenizer
) -> bool:
    """Keep the density of ``request``'s current turn (from ``start``) from ``counted``,
    the model's count of it alone with the instructions; False when that says nothing."""
    state, alone = calibration(context), _alone(request.messages, start)
    fixed, scaled = _split_estimate(alone, context.log_index.estimates(tokenizer), state.real)
    fixed += schema_estimate(request, tokenizer)
    return _keep_density(state, request.messages[start:], counted - fixed, scaled, replace=True)


def _left_out(request: ModelRequest, start: int, context: RunContext) -> bool:
    """Whether ``request`` is the current turn alone (from ``start``, with instructions)
    while the run's view holds more."""
    if start == len(request.messages) or _instructions(request.messages) < start:
        return False
    kinds, members = context.log_index.layout.slots()
    groups = zip(kinds, members, strict=True)
    first = next((group[0] for kind, group in groups if kind != SYSTEM), None)
    return first is not None and first.id != request.messages[start].id


def _alone(messages: Sequence[Message], start: int) -> list[Message]:
    """The instructions before ``start`` and the current turn from it."""
    return [*(m for m in messages[:start] if m.role.is_trusted), *messages[start:]]


def _keep_density(
    state: Calibration, messages: Sequence[Message], real: int, scaled: int, *, replace: bool
) -> bool:
    """Keep ``real`` over ``scaled`` (bounded) as the density of ``messages`` of no known
    size (nor density, unless ``replace``); False when that says nothing."""
    if real <= 0 or scaled <= 0:
        return False
    density = min(max(real / scaled, MIN_SCALE), MAX_SCALE)
    dense = dict(state.dense)  # a new mapping: ``_Split`` knows the one it was made with
    for message in messages:
        known = message.id in state.real or (not replace and message.id in state.dense)
        if not known and not message.role.is_trusted:
            dense[message.id] = density
    state.dense = dense
    return True


async def model_count(request: ModelRequest, context: RunContext) -> int | None:
    """The model's count of ``request`` (``None`` when it cannot tell; ``uncounted``),
    recalled when among the run's newest."""
    state = calibration(context)
    for known, tokens in state.counts:
        if known == request:
            state.uncounted = False
            return tokens
    counted = await context.count_prompt_tokens(request)
    state.uncounted = counted is None
    if counted is not None:
        state.counts = [*state.counts[1 - RECALLED :], (request, counted)]
    return counted


def margin(
    request: ModelRequest, context: RunContext, tokenizer: Tokenizer, measured: float
) -> int:
    """How much the run's scale, learned from an overflow of ``request``, may undercount
    its current request: what it gives the history beyond the ``measured`` scale."""
    state = calibration(context)
    if state.scale <= DENSE_GAP * measured:
        return 0
    earlier = request.messages[: _turn_start(request.messages, context)]
    _, history = _split_estimate(earlier, context.log_index.estimates(tokenizer), state.real)
    return math.ceil((state.scale - measured) * history)


def _turn_start(messages: Sequence[Message], context: RunContext) -> int:
    """Where the run's current turn starts in ``messages`` (``turn_start`` by its question
    and log)."""
    return turn_start(messages, context.question, _before_question(context))


def turn_start(
    messages: Sequence[Message],
    question: Message | None,
    earlier: Callable[[str], bool] | None = None,
) -> int:
    """Where the current turn starts in ``messages``: at ``question``; else (a hook rebuilt
    it) at the first user message after the last one ``earlier`` (held before the
    question) tells; else at the last user message; ``len(messages)`` without one."""
    if question is not None:
        for position in range(len(messages) - 1, -1, -1):
            if messages[position].id == question.id:
                return position
    asking = [p for p, m in enumerate(messages) if m.role is Role.USER and not _made(m)]
    if earlier is not None:
        held = next((p for p in reversed(range(len(messages))) if earlier(messages[p].id)), -1)
        later = [p for p in asking if p > held]
        if later:
            return later[0]
    return asking[-1] if asking else len(messages)


def _made(message: Message) -> bool:
    """A summary, or a message a view made for itself (memories, excerpts)."""
    return message.is_summary or view_only(message)


def _before_question(context: RunContext) -> Callable[[str], bool]:
    """Whether the log held a message before the run's question."""
    asked_id = None if context.question is None else context.question.id
    later: set[str] | None = None  # the ids logged since the question

    def earlier(message_id: str) -> bool:
        nonlocal later
        if later is None:
            later = set()
            for message in reversed(context.log_index.log if asked_id else ()):
                if message.id == asked_id:  # what is after it is this run's
                    break
                later.add(message.id)
        return message_id not in later and context.has_message(message_id)

    return earlier


def asked(messages: Sequence[Message], context: RunContext) -> Message | None:
    """The message the run's current turn starts at in ``messages``, if any."""
    start = _turn_start(messages, context)
    return messages[start] if start < len(messages) else None


def excess(messages: Sequence[Message], context: RunContext, tokenizer: Tokenizer) -> int:
    """How far the known sizes of ``messages`` (images' too) exceed their scaled estimates."""
    state, estimates = calibration(context), context.log_index.estimates(tokenizer)
    known = [
        m
        for m in messages
        if m.id in state.real
        or m.id in state.dense
        or (not m.role.is_trusted and estimates.images(m))
    ]
    return real_size(known, context, tokenizer) - math.ceil(state.scale * estimates.total(known))
