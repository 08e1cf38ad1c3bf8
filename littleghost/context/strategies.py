"""Compaction strategies: values that decide which groups of a view to keep, collapse,
exclude or summarize, working on a ``CompactionState``.

Every strategy keeps system groups and never splits a group. It starts only when its
``trigger`` holds (default ``always``) and, stepping, stops as soon as its ``target``
holds (default: when the trigger no longer does). "Compaction strategies" in
docs/context.md tells more.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cache, partial
from itertools import accumulate, chain
from operator import attrgetter
from types import CodeType, FunctionType
from typing import Any, Protocol, cast, runtime_checkable
from weakref import WeakKeyDictionary

from attrs import field, frozen

from littleghost import logs
from littleghost._validators import (
    check,
    count,
    has_method,
    is_int,
    optional,
    safe_repr,
    wrong_value,
)
from littleghost.chat_span import traced_call
from littleghost.cleanup import run_deadline
from littleghost.context.groups import (
    ASSISTANT_TEXT,
    SUMMARY,
    SYSTEM,
    TOOL_CALL,
    USER,
    GroupKind,
    MessageGroup,
    result_calls,
)
from littleghost.context.records import (
    COLLAPSE,
    COMPACTION_COVERS_KEY,
    COMPACTION_KIND_KEY,
    EXCLUSION,
)
from littleghost.context.summarize import (
    SUMMARY_PREFIX,
    TURN_LINE_PREFIX,
    Complete,
    call_arguments,
    entry,
    exact_first,
    excerpt,
    longest_angle_run,
    merged_notes,
    quoted_specifics,
    request_summary,
    split_quotes,
    summary_instruction,
    summary_message,
    summary_request,
    summary_text,
    transcript_lines,
    turn_line,
    with_quotes,
)
from littleghost.context.tokens import Estimates, Tokenizer, counter, estimate_messages
from littleghost.context.triggers import Not, TokensExceed, Trigger, always, check_trigger, negate
from littleghost.errors import CompactionError, ConfigurationError, ContextWindowOverflowError
from littleghost.hooks import check_signature
from littleghost.messages import Message
from littleghost.models.base import (
    Model,
    ModelRequest,
    ModelResponse,
    check_model,
    prepare,
    relayed,
)
from littleghost.retry import MAX_RETRIES, call_with_retries
from littleghost.settings import OUTPUT_CAP, is_output_cap
from littleghost.text import cut_line, cut_middle, well_formed_value

__all__ = [
    "SUMMARY_FIT_MARGIN",
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
    "TurnExcerpts",
    "check_strategy",
    "mask_tool_results",
    "prepared",
    "started",
]

_INCLUDED, _EXCLUDED, _ABSORBED = 0, 1, 2
_ID = attrgetter("id")


class CompactionState:
    """The groups of a view while strategies work on them, and the metrics triggers read.

    The metrics count what is included; a group's tokens are estimated when first needed.
    Each slot's group is included, excluded, or absorbed into a record made in the first
    slot it replaces. Removing a system group, a slot from ``protected`` on or a ``pinned``
    one raises ``ValueError``. ``scale`` (real tokens per estimated token), ``window`` (the
    smallest known) and ``room`` (the real tokens a summary request may fill) fit summary
    requests to it;
    ``summary_outcome`` says how a summary made here came back.
    """

    __slots__ = (
        "_estimate",
        "_fate",
        "_kinds",
        "_members",
        "_sizes",
        "_stands",
        "_tokens",
        "_walked",
        "complete",
        "groups",
        "measured",
        "messages",
        "pinned",
        "protected",
        "real",
        "room",
        "scale",
        "settings",
        "summary_outcome",
        "tokenizer",
        "tool_call_groups",
        "turns",
        "window",
    )

    def __init__(
        self,
        kinds: Sequence[GroupKind],
        members: Sequence[Sequence[Message]],
        *,
        tokenizer: Tokenizer,
        estimate: Callable[[Message], int] | None = None,
        complete: Complete | None = None,
        settings: Mapping[str, Any] | None = None,
        protected: int | None = None,
    ) -> None:
        self._kinds = list(kinds)
        self._members = list(members)  # a group's list is replaced, never changed
        self._sizes: list[int | None] = [None] * len(self._kinds)
        self._fate = [_INCLUDED] * len(self._kinds)
        self._stands: dict[int, list[str]] = {}
        self._estimate = estimate or Estimates(tokenizer)
        self._tokens: int | None = None
        self._walked = (len(self._kinds), 0)  # ``within``'s walk: (its oldest slot, its tokens)
        self.tokenizer = tokenizer
        self.complete = complete
        self.settings: Mapping[str, Any] = settings or {}
        self.protected = len(self._kinds) if protected is None else protected
        self.pinned: frozenset[int] = frozenset()
        self.scale = 1.0
        self.room: int | None = None
        self.window: int | None = None
        self.real: dict[str, float] = {}
        self.summary_outcome: str | None = None
        self.measured: float | None = None
        self.messages = sum(map(len, self._members))
        self.groups = len(self._kinds)
        self.turns = self._kinds.count(USER)
        self.tool_call_groups = self._kinds.count(TOOL_CALL)

    @property
    def tokens(self) -> int:
        """The estimated tokens of what is included (estimating every group once)."""
        if self._tokens is None:
            self._tokens = sum(self.size(s) for s, f in enumerate(self._fate) if f == _INCLUDED)
        return self._tokens

    def within(self, limit: int) -> bool:
        """``tokens <= limit``, estimating from the newest group back only until it is over
        (the next call goes on from there)."""
        if self._tokens is not None:
            return self._tokens <= limit
        fate = self._fate
        start, used = self._walked
        if used > limit:
            return False
        for slot in range(start - 1, -1, -1):
            if fate[slot] == _INCLUDED:
                used += self.size(slot)
                if used > limit:
                    self._walked = (slot, used)
                    return False
        self._tokens = used
        return True

    def size(self, slot: int) -> int:
        """The estimated tokens of the group in ``slot``."""
        size = self._sizes[slot]
        if size is None:
            size = self._sizes[slot] = sum(map(self._estimate, self._members[slot]))
        return size

    @property
    def slots(self) -> int:
        """How many slots there are (included or not)."""
        return len(self._kinds)

    def kind(self, slot: int) -> GroupKind:
        return self._kinds[slot]

    def included(self, slot: int) -> bool:
        return self._fate[slot] == _INCLUDED

    def group(self, slot: int) -> MessageGroup:
        return MessageGroup(self._kinds[slot], tuple(self._members[slot]), self.size(slot))

    def messages_of(self, slot: int) -> Sequence[Message]:
        """The messages of the group in ``slot``, without estimating it (``group`` does)."""
        return self._members[slot]

    def newest(self, count: int, kind: GroupKind | None = None) -> int:
        """The first slot of the newest ``count`` included non-system groups (of ``kind``),
        at most ``protected``; ``0`` when there are fewer."""
        if count <= 0:
            return self.protected
        fate = self._fate
        kinds = self._kinds
        for slot in range(len(kinds) - 1, -1, -1):
            if fate[slot] == _INCLUDED and kinds[slot] != SYSTEM and kind in (None, kinds[slot]):
                count -= 1
                if count == 0:
                    return min(slot, self.protected)
        return 0

    def candidates(self, end: int, kind: GroupKind | None = None) -> list[int]:
        """Included, unpinned non-system slots before ``end`` (of ``kind``), oldest first."""
        fate = self._fate
        kinds = self._kinds
        pinned = self.pinned
        return [
            s
            for s in range(min(end, self.protected))
            if fate[s] == _INCLUDED
            and kinds[s] != SYSTEM
            and (kind is None or kinds[s] == kind)
            and s not in pinned
        ]

    def answer_room(self, request: ModelRequest, instruction: str = "") -> float:
        """The most tokens summary ``request``'s answer may take for both to fit ``room``
        (data scaled; ``inf`` without a room): its output cap fits when no more."""
        if self.room is None:
            return math.inf
        fixed, data = self._summary_split(request, instruction)
        return self.room - fixed - math.ceil(self.scale * data)

    def measure(self, request: ModelRequest, instruction: str, reported: int) -> None:
        """Learn ``measured`` from a summary call's ``reported`` prompt tokens."""
        fixed, data = self._summary_split(request, instruction)
        if reported > fixed and data > 0:
            self.measured = (reported - fixed) / data

    def learn_overflow(
        self, request: ModelRequest, instruction: str, error: ContextWindowOverflowError
    ) -> bool:
        """Learn ``scale`` (all the excess in the data) and ``room`` from summary
        ``request``'s overflow; False when it reported no more than ``answer_room``
        sized it at."""
        fixed, data = self._summary_split(request, instruction)
        reported = error.prompt_tokens or 0
        if data <= 0 or reported <= fixed + math.ceil(self.scale * data):
            return False
        self.scale = (reported - fixed) / data
        self.fit_window(error.context_window or reported + (request.max_tokens or 0) - 1)
        return True

    def fit_window(self, window: int) -> None:
        """Fit summary requests to ``window`` too (their model's, or one an overflow showed)."""
        self.window = min(self.window or window, window)
        self.room = min(self.room or window, int(SUMMARY_FIT_MARGIN * window))

    def _summary_split(self, request: ModelRequest, instruction: str) -> tuple[int, int]:
        """A summary request's (framing and instruction, data) estimated tokens (counted
        afresh: a dropped request must leave nothing in the log's estimates)."""
        count = counter(self.tokenizer)
        framing, *rest = request.messages
        fixed = self.tokenizer.count_tokens(instruction) if instruction else 0
        data = max(0, sum(map(count, rest)) - fixed)
        return count(framing) + fixed, data

    def stands_for(self, slot: int) -> list[str]:
        """The ids of the log messages the group in ``slot`` stands for."""
        stands = self._stands.get(slot)
        return list(stands) if stands is not None else [m.id for m in self._members[slot]]

    def _count(self, slot: int, sign: int) -> None:
        kind = self._kinds[slot]
        if self._tokens is not None:
            self._tokens += sign * self.size(slot)
        elif slot >= self._walked[0]:
            self._walked = (self._walked[0], self._walked[1] + sign * self.size(slot))
        self.messages += sign * len(self._members[slot])
        self.groups += sign
        if kind == USER:
            self.turns += sign
        elif kind == TOOL_CALL:
            self.tool_call_groups += sign

    def _removable(self, slot: int) -> None:
        """``ValueError`` unless the group in ``slot`` may leave the view."""
        if self._kinds[slot] == SYSTEM:
            raise ValueError(f"slot {slot} holds a system group: system groups are always kept")
        if slot >= self.protected or slot in self.pinned:
            raise ValueError(
                f"slot {slot} is {'pinned' if slot in self.pinned else 'protected'}: slots "
                f"from protected ({self.protected}) on and pinned slots are never removed"
            )

    def exclude(self, slot: int) -> None:
        """Leave the group in ``slot`` out of the view."""
        if self._fate[slot] != _INCLUDED:
            return
        self._removable(slot)
        self._count(slot, -1)
        self._fate[slot] = _EXCLUDED

    def exclude_oldest(self, end: int, target: Trigger) -> None:
        """Exclude the slots ``candidates(end)`` gives, oldest first, until ``target`` holds."""
        if isinstance(target, Not) and isinstance(target.trigger, TokensExceed):
            self.keep_newest(end, target.trigger.limit)  # what stays can be counted ahead
            return
        for slot in self.candidates(end):
            if target(self):
                return
            self.exclude(slot)

    def keep_newest(self, end: int, limit: int, free: GroupKind | None = None) -> None:
        """Exclude the oldest groups before slot ``end`` until what stays is at most
        ``limit`` tokens (groups of kind ``free`` count as nothing)."""
        fate = self._fate
        kinds = self._kinds
        pinned = self.pinned
        size = self.size if free is None else lambda s: 0 if kinds[s] == free else self.size(s)
        end = min(end, self.protected)
        kept = sorted({*_positions(kinds, SYSTEM), *pinned})
        used = sum(size(s) for s in range(end, len(kinds)) if fate[s] == _INCLUDED)
        used += sum(size(s) for s in kept if s < end and fate[s] == _INCLUDED)
        cut = 0
        for slot in range(end - 1, -1, -1):
            if fate[slot] != _INCLUDED or kinds[slot] == SYSTEM or slot in pinned:
                continue
            used += size(slot)
            if used > limit:
                cut = slot + 1
                break
        if self._tokens is not None or fate[:cut].count(_INCLUDED) != cut:
            for slot in self.candidates(cut):
                self.exclude(slot)
            return
        # all before the cut is included: exclude it in bulk, then spare the kept groups
        fate[:cut] = [_EXCLUDED] * cut
        self._walked = (len(kinds), 0)
        self.messages -= sum(map(len, self._members[:cut]))
        self.groups -= cut
        self.turns -= kinds[:cut].count(USER)
        self.tool_call_groups -= kinds[:cut].count(TOOL_CALL)
        for slot in kept:
            if slot < cut:
                fate[slot] = _INCLUDED
                self._count(slot, 1)

    def restore(self, slot: int) -> None:
        """Put an excluded group back (a strategy undoing a tentative step)."""
        if self._fate[slot] == _EXCLUDED:
            self._fate[slot] = _INCLUDED
            self._count(slot, 1)

    def collapse(self, slot: int, text: str) -> None:
        """Replace the group in ``slot`` by one record saying ``text``, as ``merge`` does."""
        if self._fate[slot] != _INCLUDED:
            raise ValueError(
                f"slot {slot} is not included: only an included group can be collapsed"
            )
        self.merge([slot], text)

    def merge(self, slots: Sequence[int], text: str) -> None:
        """Replace the groups in ``slots`` (oldest first) by one collapse record saying
        ``text`` in the first one's place (a summary when that is one)."""
        self._absorb(slots, text, summary=self._kinds[slots[0]] == SUMMARY)

    def summarize(self, slots: Sequence[int], text: str, *, tokens: int = 0) -> None:
        """As ``merge``, for a summary; ``tokens`` is its size in the model's tokens, if known."""
        record = self._absorb(slots, text, summary=True)
        if tokens > 0:  # as a density: a copy cut shorter is sized by its own estimate
            size = tokens + self._estimate(summary_message("", ()))
            self.real[record.id] = size / max(self._estimate(record), 1)

    def _absorb(self, slots: Sequence[int], text: str, *, summary: bool) -> Message:
        """Replace the groups in ``slots`` by one record saying ``text``: a summary or a
        collapse."""
        for slot in slots:
            self._removable(slot)
        stands = [item for slot in slots for item in self.stands_for(slot)]
        if summary:
            record = summary_message(text, stands)
        else:
            metadata = {COMPACTION_KIND_KEY: COLLAPSE, COMPACTION_COVERS_KEY: stands}
            record = Message.assistant(text, metadata=metadata)
        for slot in slots:
            if self._fate[slot] == _INCLUDED:
                self._count(slot, -1)
            self._fate[slot] = _ABSORBED
        first = slots[0]
        self._fate[first] = _INCLUDED
        self._stands[first] = stands
        self._kinds[first] = SUMMARY if summary else ASSISTANT_TEXT
        self._members[first] = [record]
        self._sizes[first] = None
        self._count(first, 1)
        return record

    def view(self) -> list[Message]:
        """The messages now included, as the log with the records shows them."""
        view: list[Message] = []
        fate = self._fate
        kinds = self._kinds
        members = self._members
        made = self._stands  # the slots of the records made here
        earlier = (s for s in _positions(kinds, SUMMARY) if s not in made)
        pending = [
            members[s][0]
            for s in chain(earlier, made)
            if fate[s] == _INCLUDED and kinds[s] == SUMMARY
        ]
        included = (  # where few are (a cut), found by ``list.index``, in C
            _positions(fate, _INCLUDED)
            if 2 * self.groups < len(fate)
            else [slot for slot, given in enumerate(fate) if given == _INCLUDED]
        )
        for slot in included:
            kind = kinds[slot]
            if kind == SUMMARY:
                continue  # pending
            if pending and kind != SYSTEM:
                view.extend(pending)
                pending = []
            view.extend(members[slot])
        view.extend(pending)
        return view

    def records(self) -> tuple[Message, ...]:
        """The records that give this state's view when appended to the log."""
        fate = self._fate
        members = self._members
        stands = self._stands  # keyed by the slots of the records made here
        records = [members[slot][0] for slot in stands if fate[slot] == _INCLUDED]
        count = fate.count(_EXCLUDED)
        first = fate.index(_EXCLUDED) if count else 0
        if not stands and fate[first : first + count].count(_EXCLUDED) == count:  # one cut
            excluded = list(map(_ID, chain.from_iterable(members[first : first + count])))
        else:
            slots = _positions(fate, _EXCLUDED)
            parts = (stands[s] if s in stands else map(_ID, members[s]) for s in slots)
            excluded = list(chain.from_iterable(parts))
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


_FIT_COMPACTS: WeakKeyDictionary[FunctionType, CodeType] = WeakKeyDictionary()
"""The ``compact`` functions ``check_strategy`` passed (held weakly), with the code it read."""


def check_strategy(name: str, value: object, wanted: str = "must be a compaction strategy") -> None:
    """``ConfigurationError`` naming ``name`` unless ``value`` has ``async def compact(state)``
    (a method's function, once passed, is not read again while its code stays)."""
    if not has_method("compact")(value):
        raise ConfigurationError(
            f"{name} {wanted} (with async compact(state)), not {wrong_value(value)}"
        )
    compact = cast(Any, value).compact
    method = inspect.ismethod(compact) and inspect.isfunction(compact.__func__)
    function: FunctionType | None = compact.__func__ if method else None
    if function is not None and _FIT_COMPACTS.get(function) is function.__code__:
        return
    what = f"{name}: {type(value).__name__}.compact"
    if not any(map(inspect.iscoroutinefunction, (compact, inspect.unwrap(compact)))):
        raise ConfigurationError(f"{what} must be a coroutine function (async def compact)")
    check_signature(what, compact, "(state)", 1, context=False)
    if function is not None:
        _FIT_COMPACTS[function] = function.__code__


def _positions(items: list[Any], value: object) -> list[int]:
    """The positions of ``value`` in ``items`` (searched by ``list.index``, in C)."""
    found: list[int] = []
    position = -1
    while True:
        try:
            position = items.index(value, position + 1)
        except ValueError:
            return found
        found.append(position)


def _named_trigger(instance: object, attribute: Any, value: Any) -> None:
    check_trigger(f"{type(instance).__name__}.{attribute.name}")(instance, attribute, value)


@frozen(kw_only=True)
class _Stepwise:
    """A strategy that starts when its ``trigger`` holds and steps toward its ``goal``."""

    trigger: Trigger = field(default=always, validator=_named_trigger)
    target: Trigger | None = field(default=None, validator=optional(_named_trigger))

    @property
    def goal(self) -> Trigger:
        """``target``, by default: the trigger no longer holds."""
        return negate(self.trigger) if self.target is None else self.target

    async def compact(self, state: CompactionState, /) -> None:
        if self.trigger(state):
            await self._steps(state)

    async def _steps(self, state: CompactionState) -> None:
        """Step toward the goal (the trigger held)."""
        raise NotImplementedError


@frozen(kw_only=True)
class Truncation(_Stepwise):
    """Exclude the oldest non-system groups until the target holds.

    Args:
        trigger: Start only when this holds (default ``always``).
        target: Stop as soon as this holds (default: the trigger no longer holds; with
            ``always`` as trigger, stop at ``minimum_preserved``).
        minimum_preserved: Newest non-system groups never excluded (>= 0, default 32).
    """

    minimum_preserved: int = field(default=32, validator=count("Truncation.minimum_preserved"))

    async def _steps(self, state: CompactionState) -> None:
        state.exclude_oldest(state.newest(self.minimum_preserved), self.goal)


@frozen(kw_only=True)
class SlidingWindow(_Stepwise):
    """Keep only the newest user turns, or the newest groups (give exactly one).

    A turn is a user group and the groups after it up to the next; groups before the
    first user turn are one more, oldest turn. Older turns (or groups) are excluded
    oldest first, the target checked before each.

    Args:
        keep_last_turns: User turns to keep (>= 1).
        keep_last_groups: Non-system groups to keep (>= 1).
        trigger, target: When to start and stop (the module's docstring).
        minimum_preserved: Newest non-system groups never excluded (>= 0, default 1).
    """

    keep_last_turns: int | None = field(
        default=None, validator=optional(count("SlidingWindow.keep_last_turns", 1))
    )
    keep_last_groups: int | None = field(
        default=None, validator=optional(count("SlidingWindow.keep_last_groups", 1))
    )
    minimum_preserved: int = field(default=1, validator=count("SlidingWindow.minimum_preserved"))

    def __attrs_post_init__(self) -> None:
        if (self.keep_last_turns is None) == (self.keep_last_groups is None):
            raise ConfigurationError(
                "SlidingWindow takes exactly one of keep_last_turns= and keep_last_groups="
            )

    async def _steps(self, state: CompactionState) -> None:
        goal = self.goal
        protected = state.newest(self.minimum_preserved)
        if self.keep_last_groups is not None:
            state.exclude_oldest(min(state.newest(self.keep_last_groups), protected), goal)
            return
        assert self.keep_last_turns is not None
        end = min(state.newest(self.keep_last_turns, USER), protected)
        for position, slot in enumerate(state.candidates(end)):
            if (position == 0 or state.kind(slot) == USER) and goal(state):
                return
            state.exclude(slot)


def collapse_text(group: MessageGroup, max_result_chars: int) -> str:
    """A tool-call group in one line: ``[Tool results: get_weather: sunny, 18°C]``."""
    head, *results = group.messages
    calls = result_calls(group.messages)
    items: list[str] = []
    for position, message in enumerate(results, 1):
        for index, result in enumerate(message.tool_results):
            found = calls.get((position, index))
            name = "tool" if found is None else head.tool_calls[found[1]].name
            content = cut_line(result.content, max_result_chars)
            items.append(f"{name}: {'error: ' if result.is_error else ''}{content}")
    answered = {index for _, index in calls.values()}
    unanswered = (call for index, call in enumerate(head.tool_calls) if index not in answered)
    items.extend(f"{call.name}: no result" for call in unanswered)
    return _after_text(head, f"[Tool results: {'; '.join(items) or 'none'}]")


def _after_text(head: Message, line: str) -> str:
    """``line`` after the text of the call message ``head``, if it has any."""
    text = head.text.strip()
    return f"{text}\n{line}" if text else line


MASKED_CALL_CHARS = 120
"""How much of a masked tool call (its name and arguments) the placeholder keeps."""


def mask_text(group: MessageGroup) -> str:
    """A masked tool-call group in one line: its calls and the size of their results."""
    head = group.messages[0]
    sizes = {
        index: len(group.messages[position].tool_results[at].content)
        for (position, at), (_, index) in result_calls(group.messages).items()
    }
    items = [
        f"{cut_line(f'{call.name}({call_arguments(call.arguments)})', MASKED_CALL_CHARS)} "
        f"({sizes.get(index, 0)} characters)"
        for index, call in enumerate(head.tool_calls)
    ]
    return _after_text(head, f"[Tool results omitted to save context: {'; '.join(items)}]")


async def mask_tool_results(
    state: CompactionState, keep: int, target: Trigger, end: int | None = None
) -> None:
    """Replace each tool-call group older than the newest ``keep`` (and before ``end``) by
    its ``mask_text``, oldest first, until ``target`` holds."""
    for slot in _older_tool_groups(state, keep, target, end):
        state.collapse(slot, mask_text(state.group(slot)))


def _older_tool_groups(
    state: CompactionState, keep: int, goal: Trigger, end: int | None = None
) -> Iterator[int]:
    """The tool-call slots older than the newest ``keep`` (and before ``end``), oldest
    first, while ``goal`` does not hold."""
    start = state.newest(keep, TOOL_CALL)
    for slot in state.candidates(start if end is None else min(start, end), TOOL_CALL):
        if goal(state):
            return
        yield slot


@frozen(kw_only=True)
class ToolResultCompaction(_Stepwise):
    """Collapse each older tool-call group into one short assistant message, such as
    ``[Tool results: get_weather: sunny, 18°C]``; the newest groups stay whole.

    Args:
        keep_last_tool_call_groups: Newest tool-call groups kept whole (>= 0, default 2).
        trigger, target: When to start and stop (the module's docstring).
        max_result_chars: Each result is cut in the middle to this length (>= 16).
    """

    keep_last_tool_call_groups: int = field(
        default=2, validator=count("ToolResultCompaction.keep_last_tool_call_groups")
    )
    max_result_chars: int = field(
        default=400, validator=count("ToolResultCompaction.max_result_chars", 16)
    )

    async def _steps(self, state: CompactionState) -> None:
        for slot in _older_tool_groups(state, self.keep_last_tool_call_groups, self.goal):
            state.collapse(slot, collapse_text(state.group(slot), self.max_result_chars))


@frozen(kw_only=True)
class SelectiveToolCallCompaction(_Stepwise):
    """Exclude older tool-call groups entirely; the newest stay whole.

    Args:
        keep_last_tool_call_groups: Newest tool-call groups kept (>= 0, default 2).
        trigger, target: When to start and stop (the module's docstring).
    """

    keep_last_tool_call_groups: int = field(
        default=2, validator=count("SelectiveToolCallCompaction.keep_last_tool_call_groups")
    )

    async def _steps(self, state: CompactionState) -> None:
        for slot in _older_tool_groups(state, self.keep_last_tool_call_groups, self.goal):
            state.exclude(slot)


@frozen(kw_only=True)
class TurnExcerpts(_Stepwise):
    """Without a model: replace the oldest user turns, oldest first, by one line each
    (``[Earlier turn, excerpted: Q: … | A: … | 2 tool calls]``), then leave those lines
    out too, until the target holds. A turn is a user group and the groups after it; a
    line of an earlier run is kept as it is until it is left out.

    Args:
        trigger, target: When to start and stop (the module's docstring).
        excerpt_chars: The length of the question and of the answer in a line (>= 16).
        minimum_preserved: Newest non-system groups kept verbatim, with the rest of their
            turn (>= 0, default 1: the newest turn stays).
    """

    excerpt_chars: int = field(default=160, validator=count("TurnExcerpts.excerpt_chars", 16))
    minimum_preserved: int = field(default=1, validator=count("TurnExcerpts.minimum_preserved"))

    async def _steps(self, state: CompactionState) -> None:
        goal = self.goal
        end = state.newest(self.minimum_preserved)
        while 0 < end < state.slots and state.kind(end) != USER:
            end -= 1  # the preserved groups keep their whole turn
        turns: list[list[int]] = []
        lines: set[int] = set()  # of earlier runs
        for slot in state.candidates(end):
            members = state.messages_of(slot)
            if len(members) == 1 and turn_line(members[0]) is not None:
                lines.add(slot)  # a line ``TurnExcerpts`` made
            if state.kind(slot) == USER or not turns or slot in lines or turns[-1][0] in lines:
                turns.append([slot])
            else:
                turns[-1].append(slot)
        for turn in turns:
            if goal(state):
                return
            if turn[0] not in lines:
                state.merge(turn, self._line(state, turn))
        for turn in turns:
            if goal(state):
                return
            state.exclude(turn[0])

    def _line(self, state: CompactionState, turn: list[int]) -> str:
        messages = [m for slot in turn for m in state.messages_of(slot)]
        line = excerpt(messages, self.excerpt_chars) or "Q: (none)"
        calls = sum(len(m.tool_calls) for m in messages)
        if calls:
            line += f" | {calls} tool call{'s' if calls != 1 else ''}"
        return f"{TURN_LINE_PREFIX}{line}]"


def prepared(
    model: Model, *, max_retries: int = MAX_RETRIES, capture_content: bool = False
) -> Complete:
    """``model.respond`` after ``prepare()``, each attempt in its ``chat`` span and the
    metrics (with content if ``capture_content``), transient errors retried; takes
    ``model=`` as ``RunContext.complete`` does."""

    async def call(request: ModelRequest, *, model: Model = model) -> ModelResponse:
        await prepare(model)
        attempt = partial(
            traced_call,
            model,
            request,
            partial(model.respond, request),
            attributes=logs.current(),  # the agent and session compacted, if named
            capture_content=capture_content,
            deadline=run_deadline,  # of the run it may be part of (a hook's compaction)
        )
        return await call_with_retries(attempt, max_retries=max_retries)

    return call


SUMMARY_FIT_MARGIN = 0.9
"""The share of the window a summary request may fill (estimates are not exact)."""
SUMMARY_FLOOR_TOKENS = 64
"""The smallest output cap a summary call is given when its request must shrink to fit."""
_CLIP_LEVELS = (2_000, 500, 200, 80)  # longest first


def summarizations(strategy: CompactionStrategy) -> Iterator[Summarization]:
    """The ``Summarization`` steps of ``strategy``: itself, or those it holds, nested too."""
    if isinstance(strategy, Summarization):
        yield strategy
    for step in strategy.strategies if isinstance(strategy, (Pipeline, TokenBudget)) else ():
        yield from summarizations(step)


def least_summary_call(strategy: CompactionStrategy, tokenizer: Tokenizer, window: int) -> int:
    """The fewest estimated tokens a summary call of ``strategy`` takes in ``window``: its
    framing and instruction with no transcript, and its least answer (0 without a
    ``Summarization``)."""
    calls = []
    for step in summarizations(strategy):
        instruction = summary_instruction(step.prompt, rewrite=False)
        request = summary_request("", instructions=instruction, settings={}, max_tokens=1)
        answer = min(SUMMARY_FLOOR_TOKENS, step.cap(window))
        calls.append(estimate_messages(request.messages, tokenizer) + answer)
    return max(calls, default=0)


@frozen(kw_only=True)
class Summarization(_Stepwise):
    """Replace the oldest non-system groups by one summary written by a model.

    Groups are taken oldest first until the target holds as if they were gone, and one
    call summarizes them if they are more than its framing. New notes are appended to an
    earlier summary's; only notes that reached ``max_tokens`` are rewritten. The request
    is fitted to the state's ``room`` (``CompactionError`` when not even one group fits).
    docs/context.md tells more.

    Args:
        minimum_preserved: Newest non-system groups kept verbatim (>= 0, default 4).
        prompt: Replaces the summarizer's instruction, for new notes and a rewrite alike
            (default ``DEFAULT_SUMMARY_INSTRUCTIONS``, ``DEFAULT_UPDATE_INSTRUCTIONS``).
        model: Writes the summary; default the agent's model (ad hoc use needs one).
        trigger: Start only when this holds (default ``always``).
        target: Stop taking groups as soon as this holds (default: the trigger no longer
            holds; with ``always``, take all but ``minimum_preserved``).
        max_tokens: The summary's output cap (>= 1); default a quarter of the window its
            request is fitted to (the smaller of the agent's and ``model``'s advertised
            one), at most 1 024 (1 024 when no window is known).
        max_item_chars: Each transcript line is cut in the middle to this length (>= 64).
        mask_tool_results: Mask tool results beyond the newest this many tool-call groups
            (and the ``minimum_preserved`` newest groups) first (>= 0), or ``None``.
        quote_specifics: Quote the summarized specifics after the notes (default True).
    """

    minimum_preserved: int = field(default=4, validator=count("Summarization.minimum_preserved"))
    prompt: str | None = field(
        default=None,
        converter=well_formed_value,
        validator=check(
            "Summarization.prompt",
            lambda v: v is None or (isinstance(v, str) and v.strip() != ""),
            "a non-empty str or None",
        ),
    )
    model: Model | None = field(
        default=None,
        validator=optional(
            check(
                "Summarization.model",
                has_method("respond"),
                "a Model (with respond(request)) or None",
            )
        ),
    )
    max_tokens: int | None = field(
        default=None,
        validator=optional(
            check("Summarization.max_tokens", is_output_cap, f"{OUTPUT_CAP} or None")
        ),
    )
    max_item_chars: int = field(default=4_000, validator=count("Summarization.max_item_chars", 64))
    mask_tool_results: int | None = field(
        default=None, validator=optional(count("Summarization.mask_tool_results"))
    )
    quote_specifics: bool = field(
        default=True,
        validator=check(
            "Summarization.quote_specifics", lambda v: isinstance(v, bool), "True or False"
        ),
    )

    @model.validator
    def _held_members(self, _: object, model: Model | None) -> None:
        if model is not None:
            check_model("Summarization.model", model)

    async def _steps(self, state: CompactionState) -> None:
        complete = self._complete(state)
        window = getattr(self.model, "context_window", None)  # its own model's
        if is_int(window) and window > 0:
            state.fit_window(window)
        target = self.goal
        if self.mask_tool_results is not None:
            end = state.newest(self.minimum_preserved)
            await mask_tool_results(state, self.mask_tool_results, target, end)
            if target(state):
                return
        taken: list[int] = []
        for slot in state.candidates(state.newest(self.minimum_preserved)):
            if target(state) and self._worth(state, taken):
                break
            state.exclude(slot)
            taken.append(slot)
        if not self._worth(state, taken):  # only earlier summaries, or too little to gain
            for slot in taken:
                state.restore(slot)
            return
        earlier = [slot for slot in taken if state.kind(slot) == SUMMARY]
        parts = [split_quotes(summary_text(state.messages_of(slot)[0])) for slot in earlier]
        notes = "\n".join(part[0] for part in parts)
        quotes = "\n".join(part[1] for part in parts if part[1])
        noted = math.ceil(state.scale * state.tokenizer.count_tokens(notes))
        rewrite = notes if earlier and noted >= self.cap(state.window) else None
        request, added = self._fitted(state, taken, rewrite, quotes)
        instruction = summary_instruction(self.prompt, rewrite=rewrite is not None)
        try:
            summary = await request_summary(request, complete)
        except ContextWindowOverflowError as error:
            if relayed(error) or not state.learn_overflow(request, instruction, error):
                raise  # a sub-agent's (out of a model that runs one): its figures are not these
            request, added = self._fitted(state, taken, rewrite, quotes)  # in the units it showed
            summary = await request_summary(request, complete)
        state.measure(request, instruction, summary.input_tokens)
        quotes = merged_notes(quotes, *added)
        if earlier and rewrite is None:
            state.summarize(taken, with_quotes(merged_notes(notes, summary.text), quotes))
        else:
            tokens = 0 if quotes else summary.tokens  # the model's size, when it wrote all
            state.summarize(taken, with_quotes(summary.text, quotes), tokens=tokens)
        state.summary_outcome = summary.outcome

    def cap(self, window: int | None) -> int:
        """The summary's output cap in ``window``: ``max_tokens``, else a quarter of it, at
        most 1 024."""
        return self.max_tokens or max(1, min((window or 4_096) // 4, 1_024))

    def _worth(self, state: CompactionState, taken: list[int]) -> bool:
        """True when the groups ``taken`` (earlier summaries aside) are more than a
        summary's framing."""
        new = sum(state.size(slot) for slot in taken if state.kind(slot) != SUMMARY)
        return math.ceil(state.scale * new) > state.tokenizer.count_tokens(SUMMARY_PREFIX)

    def _complete(self, state: CompactionState) -> Complete:
        if state.complete is None:
            if self.model is None:
                raise ConfigurationError(
                    "Summarization needs a model outside a run: Summarization(model=...)"
                )
            return prepared(self.model)
        if self.model is None:
            return state.complete
        return partial(cast(Any, state.complete), model=self.model)  # inside a run: traced, counted

    def _fitted(
        self, state: CompactionState, taken: list[int], notes: str | None, quotes: str
    ) -> tuple[ModelRequest, list[str]]:
        """The summary request for ``taken`` (and ``notes`` to rewrite) that fits the
        state's room, giving back the newest groups while none fits, and the specifics to
        quote."""
        clips = [self.max_item_chars, *(c for c in _CLIP_LEVELS if c < self.max_item_chars)]
        instruction = summary_instruction(self.prompt, rewrite=notes is not None)
        groups = [state.messages_of(s) if state.kind(s) != SUMMARY else () for s in taken]
        new = [index for index, group in enumerate(groups) if group]
        least = new[1] if len(new) > 1 else len(taken)  # taken[:least]: one group to summarize
        lines, ends = transcript_lines(groups)  # rendered once: a request joins a prefix
        clipped = cache(lambda clip: [entry(cut_middle(line, clip)) for line in lines])
        # the fence's measure: the longest run of < or > in the notes and the first 0, 1, ...
        # entries (a scan of each request's whole text took a third of a long log's time)
        noted = longest_angle_run(notes or "")
        runs = cache(
            lambda clip: list(accumulate(map(longest_angle_run, clipped(clip)), max, initial=noted))
        )
        asked = partial(summary_request, instructions=instruction, settings=state.settings)

        def make(count: int, cap: int, clip: int) -> ModelRequest:  # for taken[:count]
            transcript = "\n".join(clipped(clip)[: ends[count]])
            return asked(
                transcript, max_tokens=cap, notes=notes, longest_run=runs(clip)[ends[count]]
            )

        def could_fit(count: int) -> bool:  # with the shortest items and answer tried below
            floor = min(SUMMARY_FLOOR_TOKENS, self.cap(state.window))  # ``_budget``'s least
            return floor <= state.answer_room(make(count, floor, clips[-1]), instruction)

        # bisect for the most groups that could fit (one at a time is N² on a long log)
        if not could_fit(len(taken)):
            low, high = least, len(taken) - 1
            while low < high:
                middle = (low + high + 1) // 2
                low, high = (middle, high) if could_fit(middle) else (low, middle - 1)
            while len(taken) > low:
                state.restore(taken.pop())
        # what could fit does (the cap halves down to that floor, tried with the shortest
        # items): none fits only with ``taken`` down to ``least``
        cap, added = self._budget(state, taken, notes, quotes)
        # a clip's request measured once, whatever the cap (its room leaves the cap out)
        room = cache(lambda clip: state.answer_room(make(len(taken), 0, clip), instruction))
        while True:
            for clip in clips:
                if cap <= room(clip):
                    return make(len(taken), cap, clip), added
            if cap <= SUMMARY_FLOOR_TOKENS:
                break
            cap = max(SUMMARY_FLOOR_TOKENS, cap // 2)
        raise CompactionError(
            "no summary request fits the context window, even for one group with its items "
            f"clipped and a {SUMMARY_FLOOR_TOKENS}-token answer"
        )

    def _budget(
        self, state: CompactionState, taken: list[int], notes: str | None, quotes: str
    ) -> tuple[int, list[str]]:
        """The output cap to start from and the specifics of ``taken`` to quote: together
        within half of what the summary replaces, the cap at most ``cap`` (half for a
        rewrite) and at least ``SUMMARY_FLOOR_TOKENS``."""
        covered = [m for s in taken if state.kind(s) != SUMMARY for m in state.messages_of(s)]
        replaced = [slot for slot in taken if notes is not None or state.kind(slot) != SUMMARY]
        half = math.ceil(state.scale * sum(map(state.size, replaced))) // 2
        most = self.cap(state.window)
        floor = min(SUMMARY_FLOOR_TOKENS, most)
        added: list[str] = []
        if self.quote_specifics:
            count = state.tokenizer.count_tokens
            room = min(half - floor, most - math.ceil(state.scale * count(quotes)))
            lines, kept = quoted_specifics(covered), set[int]()
            for index in exact_first(lines):  # numbers and identifiers take the room first
                cost = math.ceil(state.scale * (count(lines[index]) + 1))
                if cost <= room:  # a line too long is skipped, later shorter ones still fit
                    kept.add(index)
                    room -= cost
                    half -= cost
            added = [line for index, line in enumerate(lines) if index in kept]
        limit = most if notes is None else most // 2
        return max(floor, min(limit, half)), added


def _strategies(name: str, value: Any) -> tuple[CompactionStrategy, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigurationError(f"{name} must be a sequence of strategies, not {safe_repr(value)}")
    strategies = tuple(value)
    for strategy in strategies:
        check_strategy(name, strategy, "takes strategies")
    return strategies


def _budget_strategies(value: Any) -> tuple[CompactionStrategy, ...]:
    return _strategies("TokenBudget.strategies", value)


@frozen(kw_only=True, init=False)
class Pipeline:
    """Run strategies in order, gentlest first; each checks its own trigger. Give them
    positionally, ``Pipeline(ToolResultCompaction(), Truncation())``, or as ``strategies=``.

    Args:
        strategies: The strategies, in order.
        trigger: Start only when this holds (default ``always``).
    """

    strategies: tuple[CompactionStrategy, ...]
    trigger: Trigger = field(default=always, validator=check_trigger("Pipeline.trigger"))

    def __init__(
        self, *strategies: CompactionStrategy, trigger: Trigger = always, **keywords: Any
    ) -> None:
        if strategies and "strategies" in keywords:
            raise ConfigurationError("Pipeline takes strategies positionally or strategies=")
        given = keywords.pop("strategies", strategies)
        if keywords:
            raise ConfigurationError(f"Pipeline got unexpected keywords: {', '.join(keywords)}")
        self.__attrs_init__(strategies=_strategies("Pipeline", given), trigger=trigger)

    async def compact(self, state: CompactionState, /) -> None:
        if not self.trigger(state):
            return
        for strategy in self.strategies:
            await strategy.compact(state)


def started(strategy: CompactionStrategy, state: CompactionState) -> bool:
    """Whether ``strategy``'s trigger holds on ``state`` (a ``Pipeline``'s and one of its
    strategies'; a ``TokenBudget``'s budget is exceeded); another always starts."""
    if isinstance(strategy, Pipeline):
        return strategy.trigger(state) and any(started(s, state) for s in strategy.strategies)
    if isinstance(strategy, TokenBudget):
        return not state.within(strategy.token_budget)
    return not isinstance(strategy, _Stepwise) or strategy.trigger(state)


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
        budget = self.token_budget
        groups = state.groups
        if self.strategies and all(
            type(s) is ToolResultCompaction and s.trigger == always and s.goal == negate(always)
            for s in self.strategies
        ):
            # they collapse every older tool-call group whatever the metrics: what does not
            # fit even with those counted as nothing is left out at the end anyway, so first
            state.keep_newest(state.newest(self.minimum_preserved), budget, TOOL_CALL)
        over = state.groups < groups  # then the whole view is over before every strategy
        for strategy in self.strategies:
            if not over and state.within(budget):
                return
            await strategy.compact(state)
        state.keep_newest(state.newest(self.minimum_preserved), budget)
