"""Compaction strategies: values that decide which groups of a view to keep, collapse,
exclude or summarize.

Every strategy keeps system groups and never splits a group. Each has a ``trigger``
(start only when it holds; default ``always``) and, where it removes step by step, a
``target`` (stop as soon as it holds; default: the trigger no longer holds), re-evaluated
after each step, and keeps a minimum of newest non-system groups. Strategies work on a
``CompactionState``; what they decide becomes records appended to the log (see
``littleghost.context.compaction``), so the stored originals are never lost.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from attrs import field, frozen

from littleghost._validators import count, optional
from littleghost.context.groups import (
    ASSISTANT_TEXT,
    SUMMARY,
    SYSTEM,
    TOOL_CALL,
    USER,
    GroupIndex,
    GroupKind,
    MessageGroup,
)
from littleghost.context.summarize import (
    DEFAULT_SUMMARY_INSTRUCTIONS,
    request_summary,
    summary_message,
    summary_request,
)
from littleghost.context.tokens import Tokenizer, estimate_message
from littleghost.context.triggers import (
    Not,
    TokensExceed,
    Trigger,
    always,
    check_trigger,
    negate,
    tokens_exceed,
)
from littleghost.context.view import COLLAPSE, COMPACTION_COVERS_KEY, COMPACTION_KIND_KEY, EXCLUSION
from littleghost.errors import ConfigurationError
from littleghost.messages import Message
from littleghost.models.base import Model, ModelRequest, ModelResponse
from littleghost.text import cut_middle

__all__ = [
    "CompactionState",
    "CompactionStrategy",
    "Complete",
    "Pipeline",
    "SelectiveToolCallCompaction",
    "SlidingWindow",
    "Summarization",
    "TokenBudget",
    "ToolResultCompaction",
    "Truncation",
]

Complete = Callable[[ModelRequest], Awaitable[ModelResponse]]
"""Makes one model call: ``RunContext.complete`` inside a run, or a model's ``respond``."""

_INCLUDED, _EXCLUDED, _ABSORBED = 0, 1, 2


class CompactionState:
    """The groups of a view while strategies work on them, and the metrics triggers read.

    ``tokens``, ``messages``, ``groups``, ``turns`` and ``tool_call_groups`` count what is
    still included and are kept current by every step, so evaluating a trigger costs
    constant time. Slots keep their order: a group is included, excluded, or absorbed
    into a summary; a collapse or summary made now replaces the group in its slot.
    """

    __slots__ = (
        "_excluded",
        "_fate",
        "_kinds",
        "_made",
        "_members",
        "_sizes",
        "_stands",
        "complete",
        "groups",
        "messages",
        "settings",
        "tokenizer",
        "tokens",
        "tool_call_groups",
        "turns",
    )

    def __init__(
        self,
        index: GroupIndex,
        *,
        tokenizer: Tokenizer,
        complete: Complete | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        self._kinds = list(index.kinds)
        self._members = list(index.members)
        self._sizes = list(index.tokens)
        self._fate = [_INCLUDED] * len(index.kinds)
        self._excluded: list[int] = []
        self._stands: dict[int, list[str]] = {}
        self._made: dict[int, Message] = {}
        self.tokenizer = tokenizer
        self.complete = complete
        self.settings: Mapping[str, Any] = settings or {}
        self.tokens = sum(self._sizes)
        self.messages = index.message_count
        self.groups = len(self._kinds)
        self.turns = self._kinds.count(USER)
        self.tool_call_groups = self._kinds.count(TOOL_CALL)

    # --- reading ---------------------------------------------------------------------

    @property
    def slots(self) -> int:
        """How many slots there are (included or not)."""
        return len(self._kinds)

    def kind(self, slot: int) -> GroupKind:
        """The kind of the group in ``slot``."""
        return self._kinds[slot]

    def included(self, slot: int) -> bool:
        """True while the group in ``slot`` is part of the view."""
        return self._fate[slot] == _INCLUDED

    def group(self, slot: int) -> MessageGroup:
        """The group in ``slot`` as a value."""
        return MessageGroup(self._kinds[slot], tuple(self._members[slot]), self._sizes[slot])

    def newest(self, count: int, kind: GroupKind | None = None) -> int:
        """The first slot of the newest ``count`` included non-system groups (of ``kind``
        when given): the groups from that slot on are protected. ``slots`` when ``count``
        is 0; ``0`` when there are no more than ``count`` such groups."""
        if count <= 0:
            return len(self._kinds)
        fate = self._fate
        kinds = self._kinds
        for slot in range(len(kinds) - 1, -1, -1):
            if fate[slot] == _INCLUDED and kinds[slot] != SYSTEM:
                if kind is not None and kinds[slot] != kind:
                    continue
                count -= 1
                if count == 0:
                    return slot
        return 0

    def candidates(self, end: int, kind: GroupKind | None = None) -> list[int]:
        """Included non-system slots before ``end`` (of ``kind`` when given), oldest first."""
        fate = self._fate
        kinds = self._kinds
        if kind is None:
            return [s for s in range(end) if fate[s] == _INCLUDED and kinds[s] != SYSTEM]
        return [s for s in range(end) if fate[s] == _INCLUDED and kinds[s] == kind]

    def stands_for(self, slot: int) -> list[str]:
        """The ids of the log messages the group in ``slot`` stands for."""
        stands = self._stands.get(slot)
        return list(stands) if stands is not None else [m.id for m in self._members[slot]]

    # --- steps -----------------------------------------------------------------------

    def _retire(self, slot: int) -> None:
        kind = self._kinds[slot]
        self.tokens -= self._sizes[slot]
        self.messages -= len(self._members[slot])
        self.groups -= 1
        if kind == USER:
            self.turns -= 1
        elif kind == TOOL_CALL:
            self.tool_call_groups -= 1

    def _admit(self, slot: int) -> None:
        kind = self._kinds[slot]
        self.tokens += self._sizes[slot]
        self.messages += len(self._members[slot])
        self.groups += 1
        if kind == USER:
            self.turns += 1
        elif kind == TOOL_CALL:
            self.tool_call_groups += 1

    def exclude(self, slot: int) -> None:
        """Leave the group in ``slot`` out of the view."""
        if self._fate[slot] != _INCLUDED:
            return
        if self._kinds[slot] == SYSTEM:
            raise ValueError("system groups are always kept")
        self._retire(slot)
        self._fate[slot] = _EXCLUDED
        self._excluded.append(slot)

    def exclude_oldest(self, end: int, target: Trigger) -> None:
        """Exclude the included non-system groups before slot ``end``, oldest first,
        checking ``target`` before each; stop as soon as it holds."""
        limit = _token_limit(target)
        if limit is None:
            for slot in self.candidates(end):
                if target(self):
                    return
                self.exclude(slot)
            return
        # A token target: count ahead instead of asking the target after every step.
        fate = self._fate
        kinds = self._kinds
        sizes = self._sizes
        members = self._members
        excluded = self._excluded
        tokens = self.tokens
        messages = self.messages
        turns = self.turns
        tool_calls = self.tool_call_groups
        count = 0
        for slot in range(end):
            if fate[slot] != _INCLUDED:
                continue
            kind = kinds[slot]
            if kind == SYSTEM:
                continue
            if tokens <= limit:
                break
            tokens -= sizes[slot]
            messages -= len(members[slot])
            if kind == USER:
                turns -= 1
            elif kind == TOOL_CALL:
                tool_calls -= 1
            fate[slot] = _EXCLUDED
            excluded.append(slot)
            count += 1
        self.tokens = tokens
        self.messages = messages
        self.groups -= count
        self.turns = turns
        self.tool_call_groups = tool_calls

    def restore(self, slot: int) -> None:
        """Put an excluded group back (a strategy undoing a tentative step)."""
        if self._fate[slot] == _EXCLUDED:
            self._fate[slot] = _INCLUDED
            self._excluded.remove(slot)
            self._admit(slot)

    def _replace(self, slot: int, record: Message, kind: GroupKind, stands: list[str]) -> None:
        self._stands[slot] = stands
        self._made[slot] = record
        self._kinds[slot] = kind
        self._members[slot] = [record]
        self._sizes[slot] = estimate_message(record, self.tokenizer)

    def collapse(self, slot: int, text: str) -> None:
        """Replace the group in ``slot`` by one assistant message saying ``text``."""
        if self._fate[slot] != _INCLUDED or self._kinds[slot] == SYSTEM:
            raise ValueError("only an included non-system group can be collapsed")
        stands = self.stands_for(slot)
        record = Message.assistant(
            text, metadata={COMPACTION_KIND_KEY: COLLAPSE, COMPACTION_COVERS_KEY: stands}
        )
        self._retire(slot)
        self._replace(slot, record, ASSISTANT_TEXT, stands)
        self._admit(slot)

    def summarize(self, slots: Sequence[int], text: str) -> None:
        """Replace the groups in ``slots`` (oldest first, excluded or included) by one
        summary saying ``text``, shown in the place of the first of them."""
        stands = [item for slot in slots for item in self.stands_for(slot)]
        record = summary_message(text, stands)
        for slot in slots:
            if self._fate[slot] == _INCLUDED:
                self._retire(slot)
            elif self._fate[slot] == _EXCLUDED:
                self._excluded.remove(slot)
            self._fate[slot] = _ABSORBED
        first = slots[0]
        self._fate[first] = _INCLUDED
        self._replace(first, record, SUMMARY, stands)
        self._admit(first)

    # --- results ---------------------------------------------------------------------

    def view(self) -> list[Message]:
        """The messages now included, as the view of the log with the records shows them."""
        view: list[Message] = []
        fate = self._fate
        kinds = self._kinds
        members = self._members
        made = self._made
        pending: Message | None = None
        for slot in range(len(kinds)):
            if fate[slot] != _INCLUDED:
                continue
            if kinds[slot] == SUMMARY and slot in made:
                pending = made[slot]
                continue
            if pending is not None and kinds[slot] != SYSTEM:
                view.append(pending)
                pending = None
            view.extend(members[slot])
        if pending is not None:
            view.append(pending)
        return view

    def records(self) -> tuple[Message, ...]:
        """The records that give this state's view when appended to the log."""
        fate = self._fate
        records = [record for slot, record in self._made.items() if fate[slot] == _INCLUDED]
        stands = self._stands
        members = self._members
        slots = sorted(self._excluded)
        if stands:
            excluded: list[str] = []
            for slot in slots:
                made = stands.get(slot)
                if made is not None:
                    excluded.extend(made)
                else:
                    excluded.extend([message.id for message in members[slot]])
        else:
            excluded = [message.id for slot in slots for message in members[slot]]
        if excluded:
            records.append(
                Message.assistant(
                    f"[{len(excluded)} earlier messages are excluded from the context.]",
                    metadata={COMPACTION_KIND_KEY: EXCLUSION, COMPACTION_COVERS_KEY: excluded},
                )
            )
        return tuple(records)


@runtime_checkable
class CompactionStrategy(Protocol):
    """Anything with ``async compact(state)`` that changes a ``CompactionState``."""

    async def compact(self, state: CompactionState, /) -> None:
        """Apply the strategy to ``state``."""
        ...


def _token_limit(target: Trigger) -> int | None:
    """``n`` when ``target`` is ``~tokens_exceed(n)`` (then steps can be counted ahead)."""
    if isinstance(target, Not) and isinstance(target.trigger, TokensExceed):
        return target.trigger.limit
    return None


def _target(trigger: Trigger, target: Trigger | None) -> Trigger:
    return negate(trigger) if target is None else target


@frozen(kw_only=True)
class Truncation:
    """Exclude the oldest non-system groups until the target holds.

    Args:
        trigger: Start only when this holds (default ``always``).
        target: Stop as soon as this holds (default: the trigger no longer holds; with
            ``always`` as trigger, stop at ``minimum_preserved``).
        minimum_preserved: Newest non-system groups never excluded (>= 0, default 32).
    """

    trigger: Trigger = field(default=always, validator=check_trigger("Truncation.trigger"))
    target: Trigger | None = field(
        default=None, validator=optional(check_trigger("Truncation.target"))
    )
    minimum_preserved: int = field(default=32, validator=count("Truncation.minimum_preserved"))

    async def compact(self, state: CompactionState, /) -> None:
        """Apply the strategy to ``state``."""
        if not self.trigger(state):
            return
        end = state.newest(self.minimum_preserved)
        state.exclude_oldest(end, _target(self.trigger, self.target))


@frozen(kw_only=True)
class SlidingWindow:
    """Keep only the newest user turns, or the newest groups (give exactly one).

    A turn is a user group and every group after it up to the next user group; groups
    before the first user turn count as one more, oldest turn. Older turns (or groups)
    are excluded oldest first, the target checked before each.

    Args:
        keep_last_turns: User turns to keep (>= 1).
        keep_last_groups: Non-system groups to keep (>= 1).
        trigger: Start only when this holds (default ``always``).
        target: Stop as soon as this holds (default: the trigger no longer holds).
        minimum_preserved: Newest non-system groups never excluded (>= 0, default 1).
    """

    keep_last_turns: int | None = field(
        default=None, validator=optional(count("SlidingWindow.keep_last_turns", 1))
    )
    keep_last_groups: int | None = field(
        default=None, validator=optional(count("SlidingWindow.keep_last_groups", 1))
    )
    trigger: Trigger = field(default=always, validator=check_trigger("SlidingWindow.trigger"))
    target: Trigger | None = field(
        default=None, validator=optional(check_trigger("SlidingWindow.target"))
    )
    minimum_preserved: int = field(default=1, validator=count("SlidingWindow.minimum_preserved"))

    def __attrs_post_init__(self) -> None:
        if (self.keep_last_turns is None) == (self.keep_last_groups is None):
            raise ConfigurationError(
                "SlidingWindow takes exactly one of keep_last_turns= and keep_last_groups="
            )

    async def compact(self, state: CompactionState, /) -> None:
        """Apply the strategy to ``state``."""
        if not self.trigger(state):
            return
        target = _target(self.trigger, self.target)
        protected = state.newest(self.minimum_preserved)
        if self.keep_last_groups is not None:
            end = min(state.newest(self.keep_last_groups), protected)
            state.exclude_oldest(end, target)
            return
        assert self.keep_last_turns is not None
        end = min(state.newest(self.keep_last_turns, USER), protected)
        first = True
        for slot in state.candidates(end):
            if first or state.kind(slot) == USER:
                if target(state):
                    return
                first = False
            state.exclude(slot)


def collapse_text(group: MessageGroup, max_result_chars: int) -> str:
    """The one-line stand-in for a tool-call group:
    ``[Tool results: get_weather: sunny, 18°C; search: error: timeout]``."""
    head = group.messages[0]
    names = {call.id: call.name for call in head.tool_calls}
    answered: set[str] = set()
    items: list[str] = []
    for message in group.messages[1:]:
        for result in message.tool_results:
            answered.add(result.call_id)
            content = cut_middle(" ".join(result.content.split()), max_result_chars)
            label = "error: " if result.is_error else ""
            items.append(f"{names.get(result.call_id, 'tool')}: {label}{content}")
    items.extend(f"{call.name}: no result" for call in head.tool_calls if call.id not in answered)
    line = f"[Tool results: {'; '.join(items)}]" if items else "[Tool results: none]"
    text = head.text.strip()
    return f"{text}\n{line}" if text else line


async def _tool_groups(
    state: CompactionState,
    keep: int,
    trigger: Trigger,
    target: Trigger | None,
    step: Callable[[int], None],
) -> None:
    if not trigger(state):
        return
    goal = _target(trigger, target)
    for slot in state.candidates(state.newest(keep, TOOL_CALL), TOOL_CALL):
        if goal(state):
            return
        step(slot)


@frozen(kw_only=True)
class ToolResultCompaction:
    """Collapse each older tool-call group into one short assistant message, such as
    ``[Tool results: get_weather: sunny, 18°C]``; the newest groups stay whole.

    Args:
        keep_last_tool_call_groups: Newest tool-call groups kept whole (>= 0, default 2).
        trigger: Start only when this holds (default ``always``).
        target: Stop as soon as this holds (default: the trigger no longer holds).
        max_result_chars: Each result is cut in the middle to this length (>= 16).
    """

    keep_last_tool_call_groups: int = field(
        default=2, validator=count("ToolResultCompaction.keep_last_tool_call_groups")
    )
    trigger: Trigger = field(
        default=always, validator=check_trigger("ToolResultCompaction.trigger")
    )
    target: Trigger | None = field(
        default=None, validator=optional(check_trigger("ToolResultCompaction.target"))
    )
    max_result_chars: int = field(
        default=400, validator=count("ToolResultCompaction.max_result_chars", 16)
    )

    async def compact(self, state: CompactionState, /) -> None:
        """Apply the strategy to ``state``."""

        def step(slot: int) -> None:
            state.collapse(slot, collapse_text(state.group(slot), self.max_result_chars))

        await _tool_groups(state, self.keep_last_tool_call_groups, self.trigger, self.target, step)


@frozen(kw_only=True)
class SelectiveToolCallCompaction:
    """Exclude older tool-call groups entirely; the newest stay whole.

    Args:
        keep_last_tool_call_groups: Newest tool-call groups kept (>= 0, default 2).
        trigger: Start only when this holds (default ``always``).
        target: Stop as soon as this holds (default: the trigger no longer holds).
    """

    keep_last_tool_call_groups: int = field(
        default=2, validator=count("SelectiveToolCallCompaction.keep_last_tool_call_groups")
    )
    trigger: Trigger = field(
        default=always, validator=check_trigger("SelectiveToolCallCompaction.trigger")
    )
    target: Trigger | None = field(
        default=None, validator=optional(check_trigger("SelectiveToolCallCompaction.target"))
    )

    async def compact(self, state: CompactionState, /) -> None:
        """Apply the strategy to ``state``."""
        await _tool_groups(
            state, self.keep_last_tool_call_groups, self.trigger, self.target, state.exclude
        )


def _model(value: object) -> None:
    if value is not None and not callable(getattr(value, "respond", None)):
        raise ConfigurationError(
            f"Summarization.model must be a Model (with respond(request)) or None, not {value!r}"
        )


def _prompt(value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ConfigurationError(
            f"Summarization.prompt must be a non-empty str or None, not {value!r}"
        )


def _prepared(model: Model) -> Complete:
    """``model.respond``, after the model's optional ``prepare()`` (outside a run)."""

    async def call(request: ModelRequest) -> ModelResponse:
        prepare = getattr(model, "prepare", None)
        if prepare is not None:
            await prepare()
        return await model.respond(request)

    return call


def _with_model(complete: Any, model: Model) -> Complete:
    """``complete`` (``RunContext.complete``, which takes ``model=``) bound to ``model``."""

    async def call(request: ModelRequest) -> ModelResponse:
        response: ModelResponse = await complete(request, model=model)
        return response

    return call


@frozen(kw_only=True)
class Summarization:
    """Replace the oldest non-system groups by one summary written by a model.

    Groups are taken oldest first (a previous summary first, so it is folded in) until
    the target holds as if they were gone, leaving the newest ``minimum_preserved``;
    then one summary call covers them all. Nothing happens when only a previous
    summary would be taken. The summary is appended to the log as a marked message
    (DESIGN §3) and shown before the first non-trusted message. A failed summary call
    (an error, an empty answer, a summary cut at ``max_tokens``) raises.

    Args:
        minimum_preserved: Newest non-system groups kept verbatim (>= 0, default 4).
        prompt: The summarizer's instructions (default: the built-in ones).
        model: The model that writes the summary; default the agent's model (inside a
            run) — ad hoc use needs one.
        trigger: Start only when this holds (default ``always``).
        target: Stop taking groups as soon as this holds (default: the trigger no longer
            holds; with ``always``, take all but ``minimum_preserved``).
        max_tokens: The summary's output cap (>= 1, default 1 024).
        max_item_chars: Each transcript line is cut in the middle to this length (>= 64).
    """

    minimum_preserved: int = field(default=4, validator=count("Summarization.minimum_preserved"))
    prompt: str | None = field(default=None, validator=lambda _i, _a, v: _prompt(v))
    model: Model | None = field(default=None, validator=lambda _i, _a, v: _model(v))
    trigger: Trigger = field(default=always, validator=check_trigger("Summarization.trigger"))
    target: Trigger | None = field(
        default=None, validator=optional(check_trigger("Summarization.target"))
    )
    max_tokens: int = field(default=1_024, validator=count("Summarization.max_tokens", 1))
    max_item_chars: int = field(default=4_000, validator=count("Summarization.max_item_chars", 64))

    async def compact(self, state: CompactionState, /) -> None:
        """Apply the strategy to ``state``."""
        if not self.trigger(state):
            return
        complete = state.complete
        if complete is not None and self.model is not None:  # inside a run: traced, counted
            complete = _with_model(complete, self.model)
        elif complete is None and self.model is not None:
            complete = _prepared(self.model)
        if complete is None:
            raise ConfigurationError(
                "Summarization needs a model outside a run: Summarization(model=...)"
            )
        target = _target(self.trigger, self.target)
        taken: list[int] = []
        for slot in state.candidates(state.newest(self.minimum_preserved)):
            if target(state):
                break
            state.exclude(slot)
            taken.append(slot)
        if all(state.kind(slot) == SUMMARY for slot in taken):
            for slot in taken:
                state.restore(slot)
            return
        covered = [message for slot in taken for message in state.group(slot).messages]
        request = summary_request(
            covered,
            instructions=self.prompt or DEFAULT_SUMMARY_INSTRUCTIONS,
            settings=state.settings,
            max_tokens=self.max_tokens,
            max_item_chars=self.max_item_chars,
        )
        text = await request_summary(request, complete)
        state.summarize(taken, text)


def _strategies(name: str, value: Any) -> tuple[CompactionStrategy, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigurationError(f"{name} must be a sequence of strategies, not {value!r}")
    strategies = tuple(value)
    for strategy in strategies:
        if not callable(getattr(strategy, "compact", None)):
            raise ConfigurationError(
                f"{name} takes strategies (with async compact(state)), not {strategy!r}"
            )
    return strategies


def _pipeline_strategies(value: Any) -> tuple[CompactionStrategy, ...]:
    return _strategies("Pipeline", value)


def _budget_strategies(value: Any) -> tuple[CompactionStrategy, ...]:
    return _strategies("TokenBudget.strategies", value)


@frozen(kw_only=True, init=False)
class Pipeline:
    """Run strategies in order, gentlest first; each checks its own trigger.

    ``Pipeline(ToolResultCompaction(), Truncation(trigger=tokens_exceed(32_000)))``, or
    ``Pipeline(strategies=(...))``.

    Args:
        strategies: The strategies, in order.
        trigger: Start only when this holds (default ``always``).
    """

    strategies: tuple[CompactionStrategy, ...] = field(converter=_pipeline_strategies)
    trigger: Trigger = field(default=always, validator=check_trigger("Pipeline.trigger"))

    def __init__(
        self,
        *strategies: CompactionStrategy,
        trigger: Trigger = always,
        **keywords: Any,
    ) -> None:
        if strategies and "strategies" in keywords:
            raise ConfigurationError("Pipeline takes strategies positionally or strategies=")
        given = keywords.pop("strategies", strategies)
        if keywords:
            raise ConfigurationError(f"Pipeline got unexpected keywords: {', '.join(keywords)}")
        self.__attrs_init__(strategies=given, trigger=trigger)

    async def compact(self, state: CompactionState, /) -> None:
        """Apply the strategy to ``state``."""
        if not self.trigger(state):
            return
        for strategy in self.strategies:
            await strategy.compact(state)


@frozen(kw_only=True)
class TokenBudget:
    """Bring the estimate under ``token_budget``: run ``strategies`` in order, stopping as
    soon as it is under; then, as the last resort, exclude the oldest non-system groups.

    Args:
        token_budget: The most estimated tokens the view may hold (>= 1).
        strategies: Tried in order, gentlest first.
        minimum_preserved: Newest non-system groups the last resort keeps (>= 0,
            default 1); the result stays over budget when they alone exceed it.
    """

    token_budget: int = field(validator=count("TokenBudget.token_budget", 1))
    strategies: tuple[CompactionStrategy, ...] = field(default=(), converter=_budget_strategies)
    minimum_preserved: int = field(default=1, validator=count("TokenBudget.minimum_preserved"))

    async def compact(self, state: CompactionState, /) -> None:
        """Apply the strategy to ``state``."""
        budget = self.token_budget
        if state.tokens <= budget:
            return
        for strategy in self.strategies:
            await strategy.compact(state)
            if state.tokens <= budget:
                return
        state.exclude_oldest(state.newest(self.minimum_preserved), ~tokens_exceed(budget))
