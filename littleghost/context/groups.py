"""The context engine's core: the pairing rule, the atomic groups, and ``Layout``.

A result answers the nearest earlier unanswered call with its id; a tool message belongs
to the call its first result answers, and its other results answer calls of that same
assistant message only, in call order when they share an id. A group is kept, collapsed
or dropped whole: ``system``, ``user``, ``assistant_text`` (a collapse record too),
``tool_call`` (a call and its results) or ``summary``. Reading a log, a result whose
call is absent or hidden is left out, and so is a call whose results a record partly
hides; in a plain sequence (``group_messages``), a result without its call is a group.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import chain, islice
from typing import Literal

from attrs import frozen

from littleghost._validators import TOKENIZER, counts_tokens, tuple_of, wrong_value
from littleghost.context.records import COLLAPSE, COMPACTION_KIND_KEY, is_record, record_covers
from littleghost.context.tokens import DEFAULT_TOKENIZER, Estimates, Tokenizer, prompt_text
from littleghost.errors import ConfigurationError
from littleghost.messages import CARRIED_PARTS, Message, Role, ToolCall, ToolResult, stray_part

__all__ = [
    "ASSISTANT_TEXT",
    "SUMMARY",
    "SYSTEM",
    "TOOL_CALL",
    "USER",
    "GroupKind",
    "Layout",
    "MessageGroup",
    "group_messages",
    "result_calls",
]

GroupKind = Literal["system", "user", "assistant_text", "tool_call", "summary"]
SYSTEM: GroupKind = "system"
USER: GroupKind = "user"
ASSISTANT_TEXT: GroupKind = "assistant_text"
TOOL_CALL: GroupKind = "tool_call"
SUMMARY: GroupKind = "summary"

_SYSTEM = Role.SYSTEM
_DEVELOPER = Role.DEVELOPER
_ASSISTANT = Role.ASSISTANT
_TOOL = Role.TOOL
_ASSISTANT_PARTS = CARRIED_PARTS[_ASSISTANT]
_TOOL_PARTS = CARRIED_PARTS[_TOOL]


@frozen
class MessageGroup:
    """Messages kept or removed together (the call before its results), and their tokens:
    ``kind`` is ``system``, ``user``, ``assistant_text``, ``tool_call`` or ``summary``,
    ``messages`` the group's in log order, ``tokens`` their estimate."""

    kind: GroupKind
    messages: tuple[Message, ...]
    tokens: int

    @property
    def count(self) -> int:
        return len(self.messages)

    @property
    def bytes(self) -> int:
        """The UTF-8 size of the group's prompt text."""
        return sum(len(prompt_text(message).encode("utf-8")) for message in self.messages)


class Layout:
    """A log read by the engine: its records, its pairing, and its view as groups.

    ``kinds[i]`` and ``members[i]`` are the i-th group of the view; ``pending`` holds
    summaries with nothing after them yet to stand before (shown last).
    """

    def __init__(self, *, records: bool = True) -> None:
        self.records = records
        self.size = 0
        self.hidden: set[str] = set()
        self.anchors: dict[str, Message] = {}
        self.summaries: list[Message] = []
        # The newest unanswered call per id; older unanswered calls with the same id wait
        # in ``shadowed`` (a stack), so a result answers the nearest earlier one.
        self.open_calls: dict[str, int] = {}
        self.shadowed: dict[str, list[int]] = {}
        self.answers: dict[int, list[int]] = {}
        self.orphans: list[int] = []
        self.misplaced: list[tuple[int, str]] = []
        self.stray: list[int] = []  # messages holding a part their role does not carry, per part
        self.late: list[tuple[int, int]] = []
        self.kinds: list[GroupKind] = []
        self.members: list[list[Message]] = []
        self.slot_of: dict[int, int] = {}
        self.shown: set[str] = set()
        self.pending: list[Message] = []

    @classmethod
    def build(cls, log: Sequence[Message], *, records: bool = True) -> Layout:
        """The layout of ``log`` (with ``records=False``: of a plain sequence)."""
        layout = cls(records=records)
        roles = layout.scan(log)
        layout.pending = [s for s in layout.summaries if s.id not in layout.hidden]
        layout._lay_out(log, 0, roles)
        return layout

    @classmethod
    def scanned(cls, log: Sequence[Message], *, records: bool = True) -> Layout:
        """``log``'s records and pairing read (pass 1), its groups not laid out."""
        layout = cls(records=records)
        layout.scan(log)
        return layout

    def extend(self, log: Sequence[Message]) -> Layout | None:
        """The layout of ``log``, which extends this one's; ``None`` (build it afresh) when
        the added messages hold a record or a hidden message."""
        start = self.size
        hidden = self.hidden
        for message in log[start:]:
            if (message.metadata and is_record(message)) or (hidden and message.id in hidden):
                return None
        layout = Layout(records=self.records)
        layout.hidden, layout.anchors, layout.summaries = hidden, self.anchors, self.summaries
        layout.shown = self.shown
        layout.open_calls = dict(self.open_calls)
        layout.shadowed = {call_id: list(stack) for call_id, stack in self.shadowed.items()}
        layout.answers = dict(self.answers)
        layout.orphans = list(self.orphans)
        layout.misplaced = list(self.misplaced)
        layout.stray = list(self.stray)
        layout.kinds = list(self.kinds)
        layout.members = list(self.members)
        layout.slot_of = dict(self.slot_of)
        layout.pending = self.pending
        roles = layout.scan(log, start)
        for owner, position in layout.late:
            slot = layout.slot_of.get(owner)
            if slot is not None:
                layout.members[slot] = [*layout.members[slot], log[position]]
        layout._lay_out(log, start, roles)
        return layout

    def scan(self, log: Sequence[Message], start: int = 0) -> list[Role | None]:
        """Pass 1: read records, pair results and note stray parts in ``log[start:]``;
        the role of each message read, ``None`` for a record (for pass 2, which then need
        not read the messages again)."""
        records = self.records
        open_calls = self.open_calls
        shadowed = self.shadowed
        answers = self.answers
        stray = self.stray
        roles: list[Role | None] = []
        note = roles.append
        for position, message in enumerate(islice(log, start, None), start):
            if records and message.metadata and is_record(message):
                note(None)
                if stray_part(message) is not None:
                    stray.append(position)
                covers = record_covers(message)
                self.hidden.update(covers)
                if message.is_summary:
                    self.summaries.append(message)
                elif message.metadata[COMPACTION_KIND_KEY] == COLLAPSE:
                    for covered in covers:
                        self.anchors.setdefault(covered, message)
                continue
            role = message.role
            note(role)
            if role is _ASSISTANT:
                for part in message.content:
                    if type(part) is ToolCall:
                        previous = open_calls.get(part.id)
                        if previous is not None:
                            shadowed.setdefault(part.id, []).append(previous)
                        open_calls[part.id] = position
                    elif not isinstance(part, _ASSISTANT_PARTS):
                        stray.append(position)
            elif role is _TOOL:
                owner: int | None = None
                for part in message.content:
                    if type(part) is not ToolResult:
                        if not isinstance(part, _TOOL_PARTS):
                            stray.append(position)
                        continue
                    call_id = part.call_id
                    found = open_calls.get(call_id)
                    if found is None or (owner is not None and found != owner):
                        self.misplaced.append((position, call_id))
                        continue
                    owner = found
                    stack = shadowed.get(call_id) if shadowed else None
                    if stack:
                        open_calls[call_id] = stack.pop()
                        if not stack:
                            del shadowed[call_id]
                    else:
                        del open_calls[call_id]
                if owner is None:
                    self.orphans.append(position)
                elif owner < start:
                    self.late.append((owner, position))
                else:
                    answers.setdefault(owner, []).append(position)
            else:
                carried = CARRIED_PARTS[role]
                for part in message.content:
                    if not isinstance(part, carried):
                        stray.append(position)
        self.size = len(log)
        return roles

    def _lay_out(self, log: Sequence[Message], start: int, roles: list[Role | None]) -> None:
        """Pass 2: lay out ``log[start:]`` (its ``roles`` as ``scan`` read them) as groups
        after those laid out so far."""
        records = self.records
        hidden = self.hidden
        anchors = self.anchors
        shown = self.shown
        answers = self.answers
        kinds = self.kinds
        members = self.members
        slot_of = self.slot_of
        pending = self.pending
        orphans = set() if records else set(self.orphans)
        # The positions of calls left open: their messages are tool_call groups without results.
        unanswered = {*self.open_calls.values(), *chain.from_iterable(self.shadowed.values())}
        for position, role in enumerate(roles, start):
            message = log[position]
            kind: GroupKind
            if hidden and message.id in hidden:
                record = anchors.get(message.id) if anchors else None
                if record is not None and record.id in hidden:
                    record = _covering(record, anchors, hidden)
                if record is None or record.id in shown:
                    continue
                shown.add(record.id)
                group = [record]
                kind = ASSISTANT_TEXT
            elif role is None:  # a record
                if message.metadata.get(COMPACTION_KIND_KEY) != COLLAPSE or message.id in shown:
                    continue
                shown.add(message.id)
                group = [message]
                kind = ASSISTANT_TEXT
            elif role is _TOOL:
                if position not in orphans:
                    continue
                group = [message]
                kind = TOOL_CALL
            elif role is _SYSTEM or role is _DEVELOPER:
                if kinds and kinds[-1] == SYSTEM:  # after a system group: of it
                    members[-1] = [*members[-1], message]
                else:
                    kinds.append(SYSTEM)
                    members.append([message])
                continue
            elif role is _ASSISTANT:
                answered = answers.get(position)
                group = [message]
                if answered is not None:
                    kind = TOOL_CALL
                    for answer in answered:
                        result = log[answer]
                        if hidden and result.id in hidden:
                            break
                        group.append(result)
                    if len(group) <= len(answered):
                        continue  # a record covers part of the exchange: it hides it all
                else:
                    kind = TOOL_CALL if position in unanswered else ASSISTANT_TEXT
            else:  # a summary is a record unless read as a plain sequence
                group = [message]
                kind = SUMMARY if not records and message.is_summary else USER
            if pending:  # the summaries stand before the first non-trusted group
                kinds.extend([SUMMARY] * len(pending))
                members.extend([summary] for summary in pending)
                pending = []
            if role is _ASSISTANT and kind == TOOL_CALL:
                slot_of[position] = len(kinds)
            kinds.append(kind)
            members.append(group)
        self.pending = pending

    def slots(self) -> tuple[list[GroupKind], list[list[Message]]]:
        """The groups as parallel lists, pending summaries as the last groups."""
        if not self.pending:
            return self.kinds, self.members
        pending = self.pending
        return [*self.kinds, *[SUMMARY] * len(pending)], [*self.members, *([s] for s in pending)]

    def messages(self) -> list[Message]:
        """The view, flat."""
        return [*chain.from_iterable(self.members), *self.pending]

    def misplaced_results(self, *, orphans: bool = True) -> list[tuple[int, str]]:
        """``(position, call_id)`` of every misplaced result (``orphans=False``: not of
        tool messages answering no call)."""
        if orphans or not self.orphans:
            return self.misplaced
        whole = set(self.orphans)
        return [item for item in self.misplaced if item[0] not in whole]

    def unanswered(self, log: Sequence[Message]) -> list[tuple[int, str]]:
        """``(position, call_id)`` of every call left without a result, in log order."""
        missing = [(position, call_id) for call_id, position in self.open_calls.items()]
        for call_id, stack in self.shadowed.items():
            missing.extend((position, call_id) for position in stack)

        places: dict[int, dict[str, int]] = {}  # each message's call ids: their first place

        def order(item: tuple[int, str]) -> tuple[int, int]:
            position, call_id = item
            place = places.get(position)
            if place is None:
                place = places[position] = {}
                for index, call in enumerate(log[position].tool_calls):
                    place.setdefault(call.id, index)
            return position, place[call_id]

        return sorted(missing, key=order)


def _covering(record: Message, anchors: dict[str, Message], hidden: set[str]) -> Message | None:
    """The visible collapse that stands for a hidden collapse ``record`` (up the chain);
    ``None`` when a summary or an exclusion hides it."""
    seen: set[str] = set()
    found: Message | None = record
    while found is not None and found.id in hidden and found.id not in seen:
        seen.add(found.id)  # records that cover each other (a foreign log) end the chain
        found = anchors.get(found.id)
    return None if found is None or found.id in hidden else found


def group_messages(
    messages: Sequence[Message], tokenizer: Tokenizer = DEFAULT_TOKENIZER
) -> tuple[MessageGroup, ...]:
    """``messages`` as atomic groups, records as plain messages (for what a model sees of a
    log, group ``build_view(log)``).

    Raises:
        TypeError: ``messages`` is not a sequence of ``Message``.
        ConfigurationError: ``tokenizer`` is not one.
    """
    messages = tuple_of(messages, "group_messages: messages", Message, "Message")
    if not counts_tokens(tokenizer):
        raise ConfigurationError(
            f"group_messages: tokenizer must be {TOKENIZER}, not {wrong_value(tokenizer)}"
        )
    kinds, members = Layout.build(messages, records=False).slots()
    estimate = Estimates(tokenizer)
    return tuple(
        MessageGroup(kind, tuple(group), sum(map(estimate, group)))
        for kind, group in zip(kinds, members, strict=True)
    )


def result_calls(log: Sequence[Message]) -> dict[tuple[int, int], tuple[int, int]]:
    """``(position, index)`` of each result that answers a call of ``log``, to that call's."""
    layout = Layout.scanned(log, records=False)
    skip: dict[int, Counter[str]] = {}  # a message's misplaced results follow its paired ones
    for position, call_id in layout.misplaced:
        skip.setdefault(position, Counter())[call_id] += 1
    pairs: dict[tuple[int, int], tuple[int, int]] = {}
    for owner, answered in layout.answers.items():
        waiting: dict[str, list[int]] = {}
        for index, call in enumerate(log[owner].tool_calls):
            waiting.setdefault(call.id, []).append(index)
        for position in answered:
            results = log[position].tool_results
            paired = Counter(result.call_id for result in results) - skip.get(position, Counter())
            for index, result in enumerate(results):
                if paired[result.call_id] > 0:
                    paired[result.call_id] -= 1
                    pairs[position, index] = owner, waiting[result.call_id].pop(0)
    return pairs
